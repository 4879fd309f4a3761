"""The optional extras of ``noetl-dagster`` and the modules each provides (pyproject.toml's
``[project.optional-dependencies]``; docs/install.md).

The core install runs playbooks on Dagster; every other capability is an extra. One table,
read by the two gates that turn a missing extra into a one-line hint instead of an
ImportError: the tool-kind catalogue (``dsl/kinds``: validation and the first call of a kind)
and the CLI's error guard (``commands/errors``: any command whose import needs an extra).
``find_spec`` of a top-level name only looks on ``sys.path``; nothing here imports a package.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

DISTRIBUTION = "noetl-dagster"

# extra -> the top-level modules it installs (the ones our code imports)
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "duckdb": ("duckdb",),
    "tables": ("pyiceberg", "polars", "pandas"),
    "s3": ("s3fs",),
    "lineage": ("openlineage", "openlineage_sql"),
    "blake3": ("blake3",),
    "analytics": ("clickhouse_connect", "chdb", "matplotlib", "plotly", "networkx"),
    "quantum": ("qiskit", "qiskit_aer", "qiskit_qasm3_import", "cirq"),
    "quantum-cloud": ("qiskit_ibm_runtime", "boto3"),
    "qdrant": ("qdrant_client",),
    "k8s": ("dagster_k8s", "kubernetes"),
    "celery": ("dagster_celery", "celery", "redis"),
    "nats": ("nats",),
    "mcp": ("mcp",),
    "snowflake": ("snowflake",),
    "gcs": ("gcsfs",),
    "azure": ("adlfs",),
    "registry-server": ("fastapi", "uvicorn"),
    "ducklake": ("duckdb_extension_ducklake", "duckdb_extension_httpfs", "duckdb_extension_postgres_scanner"),
}

# built-in tool kinds that need an extra (the rest are core)
KIND_EXTRAS: dict[str, str] = {
    "duckdb": "duckdb",
    "iceberg": "tables",
    "quantum": "quantum",
    "qdrant": "qdrant",
    "nats": "nats",
    "mcp": "mcp",
    "agent": "mcp",
    "snowflake": "snowflake",
    "snowflake_transfer": "snowflake",
    "gcs": "gcs",
    "ducklake": "ducklake",
}

# modules a kind needs at its first call (a subset of its extra: quantum-cloud's stay optional)
_KIND_MODULES: dict[str, tuple[str, ...]] = {
    "quantum": ("qiskit", "qiskit_aer", "cirq"),
    "iceberg": ("pyiceberg",),
    "ducklake": (
        "duckdb",
        "duckdb_extension_ducklake",
    ),  # postgres_scanner / httpfs only for those catalogs and paths
}

_MODULE_EXTRA: dict[str, str] = {m: extra for extra, mods in EXTRA_MODULES.items() for m in mods}


def install_hint(extra: str) -> str:
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def extra_for_module(name: str | None) -> str | None:
    """The extra that provides module ``name`` (``qdrant_client.http`` -> ``qdrant``), if any."""
    return _MODULE_EXTRA.get((name or "").split(".")[0])


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or half-installed package counts as missing
        return False


def missing_kind_extra(kind: str) -> str | None:
    """``tool kind 'quantum' needs: pip install 'noetl-dagster[quantum]'`` when a built-in kind's
    extra is not installed, else None."""
    extra = KIND_EXTRAS.get(kind)
    if extra is None:
        return None
    if all(installed(m) for m in _KIND_MODULES.get(kind, EXTRA_MODULES[extra])):
        return None
    return f"tool kind {kind!r} needs: {install_hint(extra)}"


class MissingExtra(ModuleNotFoundError):
    """An optional package a capability needs is not installed; the message is the one-line hint
    (a ModuleNotFoundError, so the CLI guards and callers that catch ImportError keep working)."""


def require(module: str, what: str) -> ModuleType:
    """``import module``, or MissingExtra ``{what} needs: pip install 'noetl-dagster[extra]'`` when
    the extra that provides it is not installed (``what``: the capability, e.g. "an Iceberg table")."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        extra = extra_for_module(e.name)
        if extra is None or e.name is None or e.name.split(".")[0] != module.split(".")[0]:
            raise
        raise MissingExtra(
            f"{what} needs: {install_hint(extra)} (module {e.name} is missing)", name=e.name
        ) from None
