"""A core install (no extras) runs core playbooks, and a missing extra is one clear line.

Each test runs a subprocess through tests/packaging/no_extras.py, which makes every module of
every optional extra unimportable, as after ``pip install noetl-dagster`` without extras.
(tests/packaging/test_wheel.py does the same with a real install of the built wheel.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from noetl_dagster.dsl.kinds import builtin_kinds
from noetl_dagster.util.extras import EXTRA_MODULES, KIND_EXTRAS

REPO = Path(__file__).resolve().parents[2]
NO_EXTRAS = Path(__file__).with_name("no_extras.py")
EXAMPLES = REPO / "example_project" / "playbooks"
HINT = "tool kind 'quantum' needs: pip install 'noetl-dagster[quantum]'"


def _core(
    tmp_path: Path, *args: str, timeout: int = 180, blocked: bool = True
) -> subprocess.CompletedProcess:
    """A subprocess as on a core install (every extra's modules blocked), or as is (``blocked=False``);
    both share the playbook cache under tmp_path."""
    env = {**os.environ, "NOETL_DAGSTER_HOME": str(tmp_path / "noetl"), "DAGSTER_HOME": str(tmp_path / "dh"),
           "NOETL_DAGSTER_PLAYBOOK_CACHE": str(tmp_path / "playbook-cache"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    (tmp_path / "dh").mkdir(exist_ok=True)
    argv = [str(NO_EXTRAS), *args] if blocked else ["-c", args[1]]
    return subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def test_extras_table_matches_pyproject():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRA_MODULES) <= set(extras)
    for name in ("analytics", "quantum", "quantum-cloud", "qdrant", "k8s", "celery", "nats", "mcp",
                 "snowflake", "gcs", "azure", "registry-server", "ducklake", "duckdb", "tables", "s3",
                 "lineage", "blake3", "postgres-binary", "all", "dev"):  # fmt: skip
        assert name in extras, name

    # [all] is spelled out (a self-referencing extra sent pip's resolver backtracking): it must be
    # exactly the union of every capability extra
    def expand(name: str) -> set[str]:
        out: set[str] = set()
        for req in extras[name]:
            if req.startswith("noetl-dagster["):
                for sub in req[len("noetl-dagster[") : -1].split(","):
                    out |= expand(sub.strip())
            else:
                out.add(req)
        return out

    capabilities = [n for n in extras if n not in ("all", "dev", "cloud")]
    assert set(extras["all"]) == set().union(*(expand(n) for n in capabilities))
    for name in EXTRA_MODULES:
        assert name in capabilities, f"[all] misses {name}"
    assert set(KIND_EXTRAS) <= builtin_kinds()
    assert set(KIND_EXTRAS.values()) <= set(EXTRA_MODULES)


def test_validate_names_the_missing_extra_with_file_and_line(tmp_path):
    pb = EXAMPLES / "quantum_sweep.yaml"
    out = _core(tmp_path, "cli", "validate", str(pb))
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    line = _line_of(pb, "kind: quantum")
    assert f"{pb}:{line}: missing-extra: " in out.stdout + out.stderr
    assert HINT in out.stdout + out.stderr


def test_ducklake_without_its_extension_packages_names_the_extra(tmp_path):
    """kind ducklake's extension files come from the [ducklake] extra: without it, validate says so."""
    pb = EXAMPLES / "lakehouse_ducklake.yaml"
    out = _core(tmp_path, "cli", "validate", str(pb))
    assert out.returncode == 1, out.stderr
    line = _line_of(pb, "kind: ducklake")
    assert f"{pb}:{line}: missing-extra: " in out.stdout + out.stderr
    assert "tool kind 'ducklake' needs: pip install 'noetl-dagster[ducklake]'" in out.stdout + out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_run_refuses_an_optional_kind_before_running(tmp_path):
    pb = tmp_path / "q.yaml"
    pb.write_text(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: q, path: t/q}\nworkflow:\n"
        "  - step: start\n    tool: {kind: quantum, circuit: bell, shots: 10}\n"
    )
    out = _core(tmp_path, "cli", "run", str(pb))
    assert out.returncode != 0
    assert f"{pb}:6: missing-extra: " in out.stderr and HINT in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "noetl" / "events.db").exists() or "execution" not in out.stdout


def test_a_call_of_an_optional_kind_is_the_same_hint():
    """The other gate: a kind reached without validation (get_tool at the first call)."""
    code = (
        "from noetl_dagster.dsl.kinds import get_tool, PluginLoadError\n"
        "tk = get_tool('qdrant')\n"
        "try:\n    tk.invoke({}, None)\nexcept PluginLoadError as e:\n    print(e)\n"
    )
    out = _core(Path(os.environ.get("TMPDIR", "/tmp")), "code", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "tool kind 'qdrant' needs: pip install 'noetl-dagster[qdrant]'"


def test_dashboard_says_which_extra(tmp_path):
    out = _core(tmp_path, "cli", "dashboard", "--out", str(tmp_path / "d"))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "needs the 'analytics' extra: pip install 'noetl-dagster[analytics]'" in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1


@pytest.mark.parametrize("runner", ["local", "dagster"])
def test_core_playbooks_run_without_any_extra(tmp_path, runner):
    for name in ("hello_dagster", "customers_http", "fanout_join", "customer_portfolio"):
        out = _core(tmp_path, "cli", "run", "--runner", runner, "--json", str(EXAMPLES / f"{name}.yaml"))
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout)["status"] == "completed"


def test_code_location_loads_and_reports_playbooks_of_missing_extras(tmp_path):
    code = (
        "import json\n"
        "import example_project.definitions as d\n"
        "defs = d.defs()\n"
        "jobs = sorted(j.name for j in defs.resolve_all_job_defs())\n"
        "keys = sorted(k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys())\n"
        "print(json.dumps({'jobs': jobs, 'keys': keys}))\n"
    )
    # first as a full install, which caches every valid playbook (quantum_sweep included) ...
    full = _core(tmp_path, "code", code, blocked=False)
    assert full.returncode == 0, full.stderr[-3000:]
    assert "quantum_sweep" in json.loads(full.stdout.strip().splitlines()[-1])["jobs"]
    # ... then with the extras gone: the cache must not answer for a kind that can no longer run
    out = _core(tmp_path, "code", code)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert "hello_dagster" in got["jobs"] and "customers_http" in got["jobs"]
    assert "orders_duckdb" not in got["jobs"] and "noetl_invalid_playbook/orders_duckdb" in got["keys"]
    assert "quantum_sweep" not in got["jobs"]
    assert "noetl_invalid_playbook/quantum_sweep" in got["keys"]
    assert "noetl_invalid_playbook/vector_search" in got["keys"]
    assert "tool kind 'quantum' needs: pip install 'noetl-dagster[quantum]'" in out.stderr


# modules that are an extra's own code (they may import it at module level)
OPTIONAL_MODULES = ("noetl_analytics.", "noetl_registry.app", "noetl_dagster.sensors.facts",
                    "noetl_dagster.io_managers.qdrant", "noetl_dagster.resources.qdrant",
                    "noetl_dagster.tools.qdrant", "noetl_dagster.tools.duckdb_tool", "noetl_dagster.tools.ducklake",
                    "noetl_lineage.convert", "noetl_lineage.emitter", "noetl_lineage.quantum_facet",
                    "noetl_lineage.sql")  # fmt: skip


def test_core_modules_import_no_optional_package():
    code = (
        "import importlib, pkgutil, json\n"
        f"OPTIONAL = {OPTIONAL_MODULES!r}\n"
        "bad = {}\n"
        "for root in ('noetl_dagster', 'noetl_lineage', 'noetl_registry'):\n"
        "    pkg = importlib.import_module(root)\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, root + '.', onerror=lambda n: None):\n"
        "        if m.name.startswith(OPTIONAL):\n"
        "            continue\n"
        "        try:\n"
        "            importlib.import_module(m.name)\n"
        "        except ImportError as e:\n"
        "            bad[m.name] = str(e)\n"
        "print(json.dumps(bad))\n"
    )
    out = _core(Path(os.environ.get("TMPDIR", "/tmp")), "code", code, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}


def test_an_executor_of_a_missing_extra_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("NOETL_DAGSTER_EXECUTOR", "celery")
    out = _core(tmp_path, "cli", "run", "--runner", "dagster", str(EXAMPLES / "hello_dagster.yaml"))
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert "NOETL_DAGSTER_EXECUTOR=celery needs: pip install 'noetl-dagster[celery]'" in out.stderr, (
        out.stderr
    )
    assert out.stderr.strip().count("\n") == 0


def test_duckdb_kind_names_its_extra(tmp_path):
    pb = EXAMPLES / "orders_duckdb.yaml"
    out = _core(tmp_path, "cli", "validate", str(pb))
    assert out.returncode == 1, out.stderr
    assert f"{pb}:{_line_of(pb, 'kind: duckdb')}: missing-extra: " in out.stdout + out.stderr
    assert "tool kind 'duckdb' needs: pip install 'noetl-dagster[duckdb]'" in out.stdout + out.stderr


def test_registry_serve_without_its_extra_is_one_line(tmp_path):
    """Was ``internal error: ModuleNotFoundError: No module named 'uvicorn'`` (issue 44)."""
    code = (
        "import sys\n"
        "from noetl_registry.cli import main\n"
        f"sys.argv = ['noetl-registry', 'serve', '--db', {str(tmp_path / 'reg.db')!r}]\n"
        "main()\n"
    )
    out = _core(tmp_path, "code", code)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == (
        "error: `noetl-registry serve` needs the 'registry-server' extra: pip install 'noetl-dagster[registry-server]'"
    )


@pytest.mark.parametrize(
    ("snippet", "hint"),
    [
        ("from noetl_dagster.storage.tables import convert; import pyarrow as pa; convert(pa.table({'a': [1]}), 'polars')",
         "a polars DataFrame needs: pip install 'noetl-dagster[tables]'"),
        ("from noetl_dagster.storage.payload import checksum_algorithm, CHECKSUM_ALGORITHMS; CHECKSUM_ALGORITHMS['blake3']()",
         "a blake3 checksum needs: pip install 'noetl-dagster[blake3]'"),
        ("from noetl_dagster.storage.object_stores import S3PayloadStore; S3PayloadStore('b')",
         "an s3:// store needs: pip install 'noetl-dagster[s3]'"),
        ("import os; os.environ['OPENLINEAGE_URL'] = 'http://127.0.0.1:9'\n"
         "from noetl_lineage import listener_from_env; listener_from_env()",
         "OpenLineage events (configured by openlineage.yml or OPENLINEAGE_*) needs: pip install 'noetl-dagster[lineage]'"),
    ],
    ids=["polars", "blake3", "s3", "lineage"],
)  # fmt: skip
def test_a_core_module_using_an_optional_package_gives_the_hint(snippet, hint):
    code = f"from noetl_dagster.util.extras import MissingExtra\ntry:\n    exec({snippet!r})\nexcept MissingExtra as e:\n    print(e)\n"
    out = _core(Path(os.environ.get("TMPDIR", "/tmp")), "code", code)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith(hint), out.stdout
