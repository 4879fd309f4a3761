"""``kind: ducklake``: SQL on a DuckLake lakehouse (DuckDB's ``ducklake`` extension).

Inputs (NoETL's names, docs/tools.md):

* ``catalog_connection``: where the catalog (metadata) lives: a Postgres URL (``postgresql://…``) or a
  libpq string (``postgres:dbname=… host=…``), or a DuckDB file path (relative paths resolve against the
  execution's data directory). ``auth: <credential>`` (a Postgres record) names a Postgres catalog
  instead, as upstream does.
* ``catalog_name``: the name the lake is attached under (default ``lake``); statements run with it as
  the default database (``use_catalog: false`` keeps DuckDB's in-memory one).
* ``data_path``: where the Parquet data files go: a directory or ``s3://bucket/prefix``. S3 takes
  ``s3: {endpoint_url, region, key, secret, session_token, path_style}`` or ``s3: {credential: name}``
  (a record with the same fields or AWS's names), else the ``AWS_*`` environment.
* ``command`` | ``commands`` | ``query`` | ``sql`` and ``params``, as ``kind: duckdb``; time travel is
  DuckLake's SQL: ``SELECT … FROM t AT (VERSION => 3)``.
* ``register: {table, uri | resource [, namespace, type, inputs, metadata]}``: after the statements,
  record ``table`` at the catalog's newest snapshot as a new version of a ``noetl://`` resource.
* ``data_inlining_row_limit``, ``memory_limit``, ``threads``: DuckLake/DuckDB settings.

Result: the last statement's ``{rows, row_count, columns}`` (an Arrow ``$ref`` when large, as duckdb's),
plus ``snapshot_id`` (the catalog's newest snapshot after the call) and ``registered`` (the registry
reference) when asked.

The extensions are the PyPI packages ``duckdb-extension-{ducklake,postgres-scanner,httpfs}`` (the
``[ducklake]`` extra), LOADed from their files: DuckDB never installs or downloads one at run time.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import duckdb

from noetl_dagster.tools.configs import DucklakeConfig
from noetl_dagster.tools.credentials import lookup_credential
from noetl_dagster.tools.duckdb_tool import _sql, confined, run_duckdb
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PG_PREFIXES = ("postgres:", "postgresql:")
# AWS's record names next to the S3 payload store's (storage/object_stores.py)
_S3_FIELDS = {
    "key": ("key", "key_id", "aws_access_key_id", "access_key_id"),
    "secret": ("secret", "aws_secret_access_key", "secret_access_key"),
    "session_token": ("session_token", "token", "aws_session_token"),
    "region": ("region", "region_name", "aws_region"),
    "endpoint_url": ("endpoint_url", "endpoint"),
    "path_style": ("path_style", "url_style"),
}


def _data_dir(ctx: ToolContext) -> Path:
    return Path(getattr(ctx, "data_dir", None) or os.environ.get("NOETL_DAGSTER_HOME", ".noetl"))


def extension_file(name: str) -> str:
    """The ``.duckdb_extension`` file that ``duckdb-extension-<name>`` ships for this DuckDB."""
    package = "duckdb_extension_" + name
    hint = "pip install 'noetl-dagster[ducklake]'"
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ToolError(f"ducklake: DuckDB's {name} extension is not installed: {hint}", kind="config_error")
    root = Path(next(iter(spec.submodule_search_locations))) / "extensions"
    path = root / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    if not path.is_file():
        shipped = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
        raise ToolError(f"ducklake: {package} ships the {name} extension for DuckDB {shipped}, not this DuckDB "
                        f"v{duckdb.__version__}; reinstall with {hint} (it pins the matching DuckDB)",
                        kind="config_error")  # fmt: skip
    return str(path)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _local(path: str, ctx: ToolContext) -> str:
    sandbox = getattr(ctx, "scope_dir", None)
    if sandbox is not None:  # DuckDB attaches the catalog before its own sandbox is set
        return confined(path, sandbox)
    p = Path(path).expanduser()
    return str((p if p.is_absolute() else _data_dir(ctx) / p).resolve())


def _catalog(inputs: Mapping[str, Any], ctx: ToolContext) -> tuple[str, str, str]:
    """(``ATTACH`` target, kind ``postgres``|``duckdb``, identity without secrets) of the catalog."""
    from noetl_dagster.tools.postgres import conninfo_from, server_of  # noqa: PLC0415

    conn = inputs.get("catalog_connection")
    auth = inputs.get("auth", inputs.get("credential"))
    if conn in (None, "") and auth in (None, ""):
        raise ToolError("ducklake: 'catalog_connection' (a Postgres URL or a DuckDB file) or 'auth' "
                        "(a Postgres credential) is required", kind="config_error")  # fmt: skip
    if conn in (None, ""):
        conninfo, _ = conninfo_from(auth, ctx)
    elif not isinstance(conn, str):
        raise ToolError("ducklake: 'catalog_connection' must be a string", kind="config_error")
    else:
        text = conn.strip().removeprefix("ducklake:").removeprefix("file://")
        low = text.lower()
        if low.startswith(_PG_PREFIXES) and not low.startswith(("postgres://", "postgresql://")):
            text = text.split(":", 1)[1]  # ducklake's own spelling: postgres:<libpq string>
        elif not (low.startswith(("postgres://", "postgresql://")) or "=" in text):
            path = _local(text, ctx)
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            return "ducklake:" + path, "duckdb", path
        conninfo, _ = conninfo_from(text, ctx)
    server, db, _, _ = server_of(conninfo)
    return "ducklake:postgres:" + conninfo, "postgres", f"{server}/{db or ''}"


def _s3(inputs: Mapping[str, Any], ctx: ToolContext) -> dict[str, str]:
    spec = inputs.get("s3") or {}
    if not isinstance(spec, Mapping):
        raise ToolError("ducklake: 's3' must be a mapping (endpoint_url, region, key, secret, …) or "
                        "{credential: name}", kind="config_error")  # fmt: skip
    record: Mapping[str, Any] = spec
    if spec.get("credential"):
        record = {
            **lookup_credential(ctx, str(spec["credential"]), "ducklake"),
            **{k: v for k, v in spec.items() if k != "credential"},
        }
    out = {}
    for field, names in _S3_FIELDS.items():
        value = next((record[n] for n in names if record.get(n) not in (None, "")), None)
        if value is None and not getattr(
            ctx, "restricted", False
        ):  # a generated playbook never reads the env
            env = {"key": "AWS_ACCESS_KEY_ID", "secret": "AWS_SECRET_ACCESS_KEY", "session_token": "AWS_SESSION_TOKEN",
                   "region": "AWS_REGION", "endpoint_url": "AWS_ENDPOINT_URL_S3"}.get(field)  # fmt: skip
            value = os.environ.get(env) if env else None
            if value is None and field == "endpoint_url":
                value = os.environ.get("AWS_ENDPOINT_URL")
        if value not in (None, ""):
            out[field] = str(value)
    for field in ("secret", "session_token"):
        if out.get(field):
            ctx.redact(out[field])
    return out


def _s3_secret(s3: Mapping[str, str]) -> str:
    parts = ["TYPE s3"]
    names = {"key": "KEY_ID", "secret": "SECRET", "session_token": "SESSION_TOKEN", "region": "REGION"}
    parts += [f"{names[k]} {_quote(v)}" for k, v in s3.items() if k in names]
    endpoint = s3.get("endpoint_url")
    if endpoint:
        scheme, _, host = endpoint.rpartition("://")
        parts += [
            f"ENDPOINT {_quote(host.rstrip('/'))}",
            f"USE_SSL {'false' if scheme == 'http' else 'true'}",
        ]
    path_style = str(s3.get("path_style", "true" if endpoint else "false")).lower() in (
        "true",
        "1",
        "path",
        "yes",
    )
    parts.append(f"URL_STYLE {_quote('path' if path_style else 'vhost')}")
    return "CREATE OR REPLACE SECRET noetl_ducklake_s3 (" + ", ".join(parts) + ")"


class _Lake:
    """One attached catalog of an execution: DuckDB lets a process attach a catalog file once, so every
    task of the execution on that catalog shares it (a per-call cursor each) with the first one's settings."""

    def __init__(self, conn: duckdb.DuckDBPyConnection, settings: str, name: str):
        self.conn = conn
        self.settings = settings
        self.name = name  # the catalog's name in this connection

    def close(self) -> None:
        self.conn.close()


def _connect(inputs: Mapping[str, Any], ctx: ToolContext, name: str) -> tuple[duckdb.DuckDBPyConnection, str]:
    lake, identity = _attach(inputs, ctx, name)
    return lake.conn, identity


def _attach(
    inputs: Mapping[str, Any], ctx: ToolContext, name: str, *, any_settings: bool = False
) -> tuple[_Lake, str]:
    """The execution's connection with the catalog attached (made on first use). ``any_settings``: a
    reader takes the catalog as attached already, whatever settings a writer gave it."""
    target, catalog_kind, identity = _catalog(inputs, ctx)
    raw_data = inputs.get("data_path")
    if raw_data not in (None, "") and not isinstance(raw_data, str):
        raise ToolError("ducklake: 'data_path' must be a string", kind="config_error")
    raw_data = (raw_data or "").strip().removeprefix("file://")
    data_path = None if not raw_data else raw_data if "://" in raw_data else _local(raw_data, ctx)
    remote = bool(data_path and "://" in data_path)
    s3 = _s3(inputs, ctx) if remote or inputs.get("s3") else {}
    limit = inputs.get("data_inlining_row_limit")
    sandbox = getattr(ctx, "scope_dir", None)
    config: dict[str, Any] = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    if sandbox is not None:  # as kind duckdb's connect: the spill directory is allowed implicitly
        config["temp_directory"] = str(Path(sandbox).resolve() / ".duckdb_tmp")
    for key in ("memory_limit", "threads"):
        if inputs.get(key) not in (None, ""):
            config[key] = inputs[key]
    # hashed: neither the key nor the settings kept with the connection hold a secret
    key = "ducklake:" + hashlib.sha256(json.dumps([target, sandbox]).encode()).hexdigest()
    settings = hashlib.sha256(json.dumps([name, data_path, sorted(s3.items()), limit, sorted(config.items())],
                                         default=str).encode()).hexdigest()  # fmt: skip

    def build() -> _Lake:
        try:
            conn = duckdb.connect(":memory:", config=config)
        except duckdb.Error as e:
            raise ToolError(f"ducklake: {e}", kind="config_error") from None
        try:
            for ext in ("ducklake", *(("postgres_scanner",) if catalog_kind == "postgres" else ()),
                        *(("httpfs",) if s3 or remote else ())):  # fmt: skip
                conn.execute(f"LOAD {_quote(extension_file(ext))}")
            if s3 or remote:
                conn.execute(_s3_secret(s3))
            options = [f"DATA_PATH {_quote(data_path)}"] if data_path else []
            if limit not in (None, ""):
                options.append(f"DATA_INLINING_ROW_LIMIT {int(limit)}")
            if data_path and not remote:
                Path(data_path).mkdir(parents=True, exist_ok=True)
            conn.execute(
                f"ATTACH {_quote(target)} AS {name}" + (f" ({', '.join(options)})" if options else "")
            )
            if (
                sandbox is not None
            ):  # a generated playbook: as kind duckdb's sandbox, after the catalog is attached
                allowed = [str(Path(sandbox).resolve()).rstrip("/") + "/"]
                if remote and data_path:
                    allowed.append(data_path.rstrip("/") + "/")
                conn.execute("SET allowed_directories = ?", [allowed])
                conn.execute("SET enable_external_access = false")
                conn.execute("SET lock_configuration = true")
        except ToolError:
            conn.close()
            raise
        except (duckdb.Error, ValueError) as e:
            conn.close()
            busy = "Unique file handle conflict" in str(e) or "Could not set lock" in str(e)
            why = ("the catalog file is attached by another execution or process; a DuckDB-file catalog has one "
                   "client at a time (use a Postgres catalog to share a lake)" if busy else str(e))  # fmt: skip
            raise ToolError(f"ducklake: attaching the catalog ({identity}): {why}", kind="ducklake_error",
                            code=type(e).__name__, retryable=busy) from None  # fmt: skip
        return _Lake(conn, settings, name)

    lake = ctx.resource(key, build)
    if lake.settings != settings and not any_settings:
        raise ToolError(f"ducklake: the catalog {identity} is attached in this execution with other settings "
                        "(catalog_name, data_path, s3, data_inlining_row_limit, memory_limit, threads); give every "
                        "task on one catalog the same ones", kind="config_error")  # fmt: skip
    return lake, identity


def _snapshot(conn: duckdb.DuckDBPyConnection, name: str) -> int:
    cur = conn.cursor()
    try:
        row = cur.execute(f"SELECT id FROM {name}.current_snapshot()").fetchone()
    finally:
        cur.close()
    return int(row[0]) if row else 0


def _name(path: Any) -> str | None:
    return None if path is None else str(path).replace("\\", "/").rsplit("/", 1)[-1]


def _version_facts(
    cur: Any, name: str, schema: str, table: str, snapshot: int
) -> tuple[int, list, list, str]:
    """(rows, columns, files, checksum) of ``schema.table`` at ``snapshot``: what a registered version
    records, and what a read recomputes to verify it."""
    at = f"{name}.{schema}.{table} AT (VERSION => {int(snapshot)})"
    rows = int(cur.execute(f"SELECT count(*) FROM {at}").fetchone()[0])
    columns = [(str(d[0]), str(d[1])) for d in cur.execute(f"SELECT * FROM {at} LIMIT 0").description]
    files = cur.execute(
        "SELECT data_file, data_file_size_bytes, delete_file, delete_file_size_bytes FROM "
        f"ducklake_list_files({_quote(name)}, {_quote(table)}, schema => {_quote(schema)}, "
        f"snapshot_version => {int(snapshot)}) ORDER BY data_file").fetchall()  # fmt: skip
    listed = [[_name(f[0]), int(f[1] or 0), _name(f[2]), int(f[3] or 0)] for f in files]
    # a snapshot is immutable: its id, its data and delete files (names and sizes, wherever the lake lives),
    # columns and row count identify it (rows inlined in the catalog belong to the snapshot too)
    digest = "sha256:" + hashlib.sha256(json.dumps([snapshot, listed, columns, rows]).encode()).hexdigest()
    return rows, columns, listed, digest


def read_version(
    location: Any, checksum: str | None, ctx: ToolContext, columns: list[str] | None = None
) -> Any:
    """A registered version (``op: read`` of a ``ducklake`` location) as an Arrow table: the table at
    the recorded snapshot, after its checksum is recomputed from the catalog and compared with the
    registry's (as a Parquet file's bytes are). A DuckDB-file catalog is attached from the recorded
    path (or used as this execution attached it already); a Postgres catalog is recorded without its
    credential, so its versions are read with ``kind: ducklake`` and time travel instead."""
    from noetl_dagster.storage.payload import ChecksumMismatch  # noqa: PLC0415
    from noetl_dagster.storage.tables import TableDataError  # noqa: PLC0415

    meta = dict(location.metadata or {})
    catalog, schema, table = meta.get("catalog"), meta.get("schema") or "main", meta.get("table")
    snapshot, name = meta.get("snapshot_id"), str(meta.get("catalog_name") or "lake")
    if not (isinstance(catalog, str) and isinstance(table, str) and isinstance(snapshot, int)):
        raise TableDataError(f"{location.uri}: the ducklake location records no catalog, table and snapshot")
    if not (_NAME.match(schema) and _NAME.match(table) and _NAME.match(name)):
        raise TableDataError(f"{location.uri}: {schema}.{table} is not a [schema.]table name")
    if not catalog.startswith("/"):
        raise TableDataError(f"{location.uri}: the catalog {catalog} is a Postgres catalog, recorded without "
                             "its credential: read the version with kind: ducklake, AT (VERSION => snapshot)")  # fmt: skip
    if not checksum:
        raise ChecksumMismatch(
            f"{location.uri}: the registry records no checksum; refusing an unverified read"
        )
    data = meta.get("data_path")
    remote = isinstance(data, str) and "://" in data and not data.startswith("file://")
    lake, _ = _attach({"catalog_connection": catalog, **({"data_path": data} if remote else {})}, ctx, name,
                      any_settings=True)  # fmt: skip
    cur = lake.conn.cursor()
    try:
        digest = _version_facts(cur, lake.name, schema, table, snapshot)[3]
        if digest != checksum:
            raise ChecksumMismatch(f"{location.uri}: checksum mismatch (snapshot {snapshot} of {schema}.{table} "
                                   "in the lake is not the registered one)")  # fmt: skip
        cols = "*" if not columns else ", ".join('"' + str(c).replace('"', '""') + '"' for c in columns)
        return cur.execute(
            f"SELECT {cols} FROM {lake.name}.{schema}.{table} AT (VERSION => {snapshot})"
        ).to_arrow_table()
    except duckdb.Error as e:
        raise TableDataError(
            f"{location.uri}: reading {schema}.{table} at snapshot {snapshot}: {e}"
        ) from None
    finally:
        cur.close()


def _register(spec: Any, conn: duckdb.DuckDBPyConnection, name: str, identity: str, data_path: Any,
              snapshot: int, ctx: ToolContext) -> dict[str, Any]:  # fmt: skip
    """Record ``spec.table`` at ``snapshot`` as a new version of a noetl:// resource."""
    from noetl_dagster.tools.table_access import _storage, _target_uri  # noqa: PLC0415
    from noetl_registry.errors import RegistryError  # noqa: PLC0415

    if not isinstance(spec, Mapping) or not spec.get("table"):
        raise ToolError("ducklake: 'register' needs {table, uri | resource}", kind="config_error")
    schema, _, table = str(spec["table"]).rpartition(".")
    schema = schema or "main"
    if not (_NAME.match(schema) and _NAME.match(table)):
        raise ToolError(
            f"ducklake: register.table {spec['table']!r} is not a [schema.]table name", kind="config_error"
        )
    cur = conn.cursor()
    try:
        rows, columns, listed, digest = _version_facts(cur, name, schema, table, snapshot)
    except duckdb.Error as e:
        raise ToolError(f"ducklake: register {schema}.{table}: {e}", kind="ducklake_error") from None
    finally:
        cur.close()
    fingerprint = "sha256:" + hashlib.sha256(json.dumps(columns).encode()).hexdigest()
    location = {
        "uri": f"ducklake://{name}/{schema}.{table}?snapshot_id={snapshot}", "storage_type": "ducklake",
        "format": "ducklake", "checksum": digest, "rows": rows, "schema_fingerprint": fingerprint,
        "size_bytes": sum(f[1] + f[3] for f in listed),
        "metadata": {"catalog": identity, "catalog_name": name, "data_path": data_path, "schema": schema,
                     "table": table, "snapshot_id": snapshot, "files": len(listed)},
    }  # fmt: skip
    inputs = spec.get("inputs") or []
    try:
        storage = _storage(spec, ctx)
        uri = _target_uri(spec, ctx, storage)
        resource = storage.registry.register(
            uri, kind=spec.get("resource_kind"), locations=[location], inputs=[inputs] if isinstance(inputs, str)
            else list(inputs), metadata={"content_type": "application/x-ducklake", "columns": [c[0] for c in columns],
                                         **dict(spec.get("metadata") or {})},
            execution_id=getattr(ctx, "execution_id", None), step=getattr(ctx, "step", None),
            task=getattr(ctx, "task", None),
        )  # fmt: skip
    except RegistryError as e:
        raise ToolError(
            f"ducklake: registry: {e.message}", kind=f"registry_{e.code}", code=e.status
        ) from None
    return {"uri": resource.uri, "urn": resource.urn, "resource_id": resource.resource_id,
            "version": resource.version, "store": "ducklake", "format": "ducklake", "size": location["size_bytes"],
            "checksum": digest, "rows": rows, "schema_fingerprint": fingerprint, "location": location["uri"],
            "snapshot_id": snapshot}  # fmt: skip


def ducklake_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    """SQL on a DuckLake catalog (Postgres or DuckDB file; data local or S3); time travel, registry record."""
    try:
        sql = _sql(inputs)
    except ToolError as e:
        raise ToolError(e.message.replace("duckdb:", "ducklake:", 1), kind=e.kind) from None
    name = str(inputs.get("catalog_name") or "lake")
    if not _NAME.match(name):
        raise ToolError(f"ducklake: catalog_name {name!r} must be a plain identifier", kind="config_error")
    conn, identity = _connect(inputs, ctx, name)
    note = getattr(ctx, "note", None)
    if note is not None:  # OpenLineage column lineage (lineage/noetl_lineage/sql.py)
        note(
            sql=sql,
            sql_namespace=f"ducklake://{identity.split('://')[-1]}",
            sql_default_schema="main",
            sql_dialect="duckdb",
        )
    use = inputs.get("use_catalog", True) not in (False, "false", "False")
    out = run_duckdb(
        conn, sql, inputs.get("params"), ctx, prelude=[f"USE {name}"] if use else [], label="ducklake"
    )
    out["snapshot_id"] = _snapshot(conn, name)
    if inputs.get("register"):
        out["registered"] = _register(inputs["register"], conn, name, identity, inputs.get("data_path"),
                                      out["snapshot_id"], ctx)  # fmt: skip
    return out


register_tool(
    "ducklake",
    ducklake_tool,
    config=DucklakeConfig,
    description="SQL on a DuckLake catalog; result {rows, row_count, columns, snapshot_id}",
)
