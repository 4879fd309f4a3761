"""``kind: duckdb``.

Inputs: ``database`` (alias ``db_path``; a file path, or ``:memory:``) — without
one, or with ``:memory:``, the call uses the execution's shared in-memory
database, so tables made in one step are visible in the next; relative paths
resolve against the execution's data directory. The SQL goes in ``command`` |
``commands`` | ``query`` (a string with one or more statements, or a list);
``params`` (list for ``?``/``$1``, mapping for ``$name``) bind to the last statement.

Result of the last statement: ``{rows, row_count, columns}`` (for INSERT /
UPDATE / DELETE without RETURNING, ``row_count`` is the number of rows changed).
A result whose JSON would exceed the inline limit is not returned inline: the
rows are streamed as an Arrow IPC file (``.arrow``) into the payload store and
the result is ``{rows: {"$ref": {uri, store, format: "arrow", size, checksum,
rows, schema_fingerprint}}, row_count, columns}`` — ``row_count`` and
``columns`` stay usable in templates; :func:`load_arrow_table` /
:func:`load_arrow_result` read the rows back (checksum verified).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from noetl_dagster.storage.locator import Locator, sign_for
from noetl_dagster.storage.payload import (
    DEFAULT_INLINE_LIMIT,
    FilePayloadStore,
    PayloadStore,
    ResultRef,
    is_ref,
    sha256,
)
from noetl_dagster.tools.configs import DuckdbConfig
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool
from noetl_dagster.util.jsonutil import dumps, plain

BATCH_ROWS = 64 * 1024
DML_TYPES = {"INSERT", "UPDATE", "DELETE"}
# DuckDB raises these for conflicts that a later attempt may not hit (write-write conflict, file lock).
RETRYABLE_ERRORS = ("TransactionException", "IOException")


def _data_dir(ctx: ToolContext) -> Path:
    explicit = getattr(ctx, "data_dir", None)
    return Path(explicit or os.environ.get("NOETL_DAGSTER_HOME", ".noetl"))


def payload_store_for(ctx: ToolContext) -> PayloadStore:
    # the engine's context exposes the execution's store as ``payloads``
    store = getattr(ctx, "payloads", None) or getattr(ctx, "payload_store", None)
    if store is not None:
        return store
    return ctx.resource("payload_store", lambda: FilePayloadStore(_data_dir(ctx) / "payloads"))


def _path(database: Any, ctx: ToolContext) -> Path | None:
    """The database file (None: the execution's in-memory database)."""
    if database in (None, "", ":memory:"):
        return None
    if not isinstance(database, str):
        raise ToolError(
            f"duckdb: database must be a path string, got {type(database).__name__}", kind="config_error"
        )
    path = Path(database).expanduser()
    if not path.is_absolute():
        path = _data_dir(ctx) / path
    return path.resolve()


def confined(database: str, sandbox_dir: str) -> str:
    """The real path of a database file of a sandboxed execution, refused unless it is inside
    ``sandbox_dir``. DuckDB opens the file before its own ``allowed_directories`` applies, and reads
    any spelling (``x://..``, ``:memory:..``, a symlink) as a path: so the check is on the real path,
    and DuckDB is handed that absolute path (no prefix of its own can apply)."""
    scope = os.path.realpath(sandbox_dir)
    full = os.path.realpath(os.path.join(scope, os.path.expanduser(database)))
    if full != scope and not full.startswith(scope.rstrip(os.sep) + os.sep):
        raise ToolError(
            f"duckdb: {database!r} is outside this execution's directory (where a sandboxed run keeps files)",
            kind="trust_refused",
            result={"refused": "database outside the execution's directory"},
        )
    return full


def connect(database: str, sandbox_dir: str | None = None) -> duckdb.DuckDBPyConnection:
    """Every DuckDB connection a playbook opens (the tool and the cursor driver). With ``sandbox_dir``
    (a generated playbook, engine.trust.Gate) the SQL reaches no file, extension or URL outside that
    directory: ``read_text``, ``COPY ... TO``, ``ATTACH``, ``INSTALL``/``LOAD`` elsewhere are refused by
    DuckDB itself, and the configuration is locked so a statement cannot lift it."""
    if sandbox_dir is None:
        return duckdb.connect(database)
    if database != ":memory:":
        database = confined(database, sandbox_dir)
    scope = str(Path(sandbox_dir).resolve()).rstrip("/") + "/"
    # the spill directory is allowed implicitly: its default (``.tmp`` in the worker's cwd) is shared
    config = {"autoinstall_known_extensions": False, "autoload_known_extensions": False,
              "temp_directory": scope + ".duckdb_tmp"}  # fmt: skip
    conn = duckdb.connect(database, config=config)
    try:
        conn.execute(
            "SET allowed_directories = [?]", [scope]
        )  # before the switch: settable only while allowed
        conn.execute("SET enable_external_access = false")
        conn.execute("SET lock_configuration = true")
    except BaseException:
        conn.close()
        raise
    return conn


def _connection(database: Any, ctx: ToolContext) -> duckdb.DuckDBPyConnection:
    path = _path(database, ctx)
    sandbox = getattr(ctx, "scope_dir", None)
    if sandbox is not None:
        Path(sandbox).mkdir(parents=True, exist_ok=True)
    if path is None:
        return ctx.resource("duckdb::memory:", lambda: connect(":memory:", sandbox))
    if sandbox is not None:  # before any directory is made for it
        path = Path(confined(str(database), sandbox))  # relative: to the sandbox, as _path
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return ctx.resource(f"duckdb:{path}", lambda: connect(str(path), sandbox))
    except duckdb.Error as e:
        raise _error(e, f"opening {path}") from None


def _error(e: BaseException, what: str, label: str = "duckdb") -> ToolError:
    name = type(e).__name__
    return ToolError(
        f"{label}: {what}: {e}",
        kind="duckdb_error",
        retryable=name in RETRYABLE_ERRORS,
        code=name,
        details={"duckdb": {"exception": name}},
    )


def _sql(inputs: Mapping[str, Any]) -> str:
    sql = inputs.get("command", inputs.get("commands", inputs.get("query", inputs.get("sql"))))
    if isinstance(sql, Sequence) and not isinstance(sql, str):
        if not all(isinstance(s, str) for s in sql):
            raise ToolError("duckdb: 'commands' must be a string or a list of strings", kind="config_error")
        sql = ";\n".join(s.rstrip().rstrip(";") for s in sql if s.strip())
    if not isinstance(sql, str) or not sql.strip():
        raise ToolError("duckdb: 'command' (or 'commands' / 'query') is required", kind="config_error")
    return sql


def _write_arrow(store: PayloadStore, key: str, schema: pa.Schema, batches) -> tuple[str, int, str, int]:
    """(uri, size, checksum, rows) of an Arrow IPC file streamed into the store."""
    try:
        writer = store.writer(key)
    except NotImplementedError:
        writer = None
    if writer is None:  # a store without streaming writes: build the file in memory
        sink = pa.BufferOutputStream()
        rows = _write_batches(sink, schema, batches)
        data = sink.getvalue().to_pybytes()
        return store.put_bytes(key, data), len(data), sha256(data), rows
    with writer:
        rows = _write_batches(writer, schema, batches)
    return writer.uri, writer.size, writer.checksum, rows


def _write_batches(sink: Any, schema: pa.Schema, batches) -> int:
    rows = 0
    with pa.ipc.new_file(sink, schema) as out:
        for b in batches:
            out.write_batch(b)
            rows += b.num_rows
    return rows


def _spill(head: list[pa.RecordBatch], schema: pa.Schema, rest, ctx: ToolContext) -> dict[str, Any]:
    """Write the batches (and the rest of the reader) as an Arrow IPC file; the result references it."""
    store = payload_store_for(ctx)
    prefix = (
        getattr(getattr(ctx, "offloader", None), "key_prefix", "") or ""
    )  # the store's tenant/project layout
    key = f"{prefix}{ctx.execution_id}/{ctx.step}/{ctx.task}-attempt{ctx.attempt}.arrow"
    uri, size, checksum, rows = _write_arrow(store, key, schema, itertools.chain(head, rest))
    ref = ResultRef(
        uri=uri,
        store=store.name,
        format="arrow",
        size=size,
        checksum=checksum,
        rows=rows,
        schema_fingerprint=sha256(schema.to_string().encode()),
    )
    ref = sign_for(ctx, ref, store)  # readable by this tenant's later steps (storage/locator.py)
    return {"rows": ref.envelope(), "row_count": rows, "columns": list(schema.names)}


def _collect(reader: pa.RecordBatchReader, ctx: ToolContext) -> dict[str, Any]:
    limit = getattr(ctx, "inline_limit", None) or getattr(
        getattr(ctx, "offloader", None), "inline_limit", None
    )
    limit = int(limit or DEFAULT_INLINE_LIMIT)
    schema = reader.schema
    batches: list[pa.RecordBatch] = []
    size = 0
    it = iter(reader)
    for batch in it:
        batches.append(batch)
        size += batch.nbytes
        if size > limit:
            return _spill(batches, schema, it, ctx)
    table = pa.Table.from_batches(batches, schema=schema)
    rows = plain(table.to_pylist())
    if len(dumps(rows)) > limit:
        return _spill(table.to_batches(), schema, (), ctx)
    return {"rows": rows, "row_count": len(rows), "columns": list(schema.names)}


def run_duckdb(
    conn: duckdb.DuckDBPyConnection,
    sql: str,
    params: Any,
    ctx: ToolContext,
    prelude: Sequence[str] = (),
    label: str = "duckdb",
) -> dict[str, Any]:
    """Run ``sql`` on a fresh cursor of ``conn`` (after the ``prelude`` statements, e.g. ``USE lake``);
    errors name the kind ``label``."""
    if params is not None and not isinstance(params, (Mapping, list, tuple)):
        raise ToolError(
            f"duckdb: params must be a list or a mapping, got {type(params).__name__}", kind="config_error"
        )
    cur = conn.cursor()  # a per-call cursor is DuckDB's thread-safe handle on the shared database
    try:
        try:
            statements = cur.extract_statements(sql)
        except duckdb.Error as e:
            raise _error(e, "parsing SQL", label) from None
        if not statements:
            raise ToolError("duckdb: the SQL holds no statement", kind="config_error")
        *leading, last = statements
        try:
            for stmt in prelude:
                cur.execute(stmt)
            for stmt in leading:
                cur.execute(stmt)
            if last.type.name == "SELECT":
                # a lazy relation streams Arrow batches without a row-by-row copy
                return _collect(cur.sql(last.query, params=params or None).to_arrow_reader(BATCH_ROWS), ctx)
            cur.execute(last.query, params or None)
            if cur.description is None:
                return {"rows": [], "row_count": 0, "columns": []}
            columns = [d[0] for d in cur.description]
            fetched = cur.fetchall()
            if last.type.name in DML_TYPES and columns == ["Count"]:
                return {"rows": [], "row_count": int(fetched[0][0]) if fetched else 0, "columns": []}
            table = pa.Table.from_pylist([dict(zip(columns, r, strict=True)) for r in fetched])
            return (
                _collect(table.to_reader(), ctx)
                if fetched
                else {"rows": [], "row_count": 0, "columns": columns}
            )
        except duckdb.Error as e:
            raise _error(e, "query failed", label) from None
    finally:
        cur.close()


def load_arrow_table(
    value: Any, store: PayloadStore, reader: tuple[str, str] = ("default", "default")
) -> pa.Table:
    """The Arrow table behind a spilled result (``{rows: {"$ref": ...}}``) or a bare Arrow ``$ref``,
    read through the locator as ``reader`` (tenant, project)."""
    ref = value.get("rows") if isinstance(value, dict) and not is_ref(value) else value
    if not is_ref(ref) or ref["$ref"].get("format") != "arrow":
        raise ValueError("not an Arrow result reference")
    data = Locator(store).read(ResultRef.from_dict(ref["$ref"]), *reader)
    return pa.ipc.open_file(pa.BufferReader(data)).read_all()


def load_arrow_result(
    value: Any, store: PayloadStore, reader: tuple[str, str] = ("default", "default")
) -> Any:
    """A spilled result with its rows read back inline; any other value unchanged."""
    try:
        table = load_arrow_table(value, store, reader)
    except ValueError:
        return value
    return {
        "rows": plain(table.to_pylist()),
        "row_count": table.num_rows,
        "columns": list(table.schema.names),
    }


def note_sql(sql: str, database: Any, ctx: ToolContext) -> None:
    """The statement and database, for OpenLineage column lineage (lineage/noetl_lineage/sql.py)."""
    note = getattr(ctx, "note", None)
    if note is not None:
        path = _path(database, ctx)
        note(
            sql=sql,
            sql_namespace=f"duckdb://{path}" if path else "duckdb://memory",
            sql_default_schema="main",
            sql_dialect="duckdb",
        )


def duckdb_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    """SQL on DuckDB; result {rows, row_count, columns}, or an Arrow $ref when large."""
    sql = _sql(inputs)
    database = inputs.get("database", inputs.get("db_path", inputs.get("path")))
    conn = _connection(database, ctx)
    note_sql(sql, database, ctx)
    return run_duckdb(conn, sql, inputs.get("params"), ctx)


register_tool(
    "duckdb",
    duckdb_tool,
    config=DuckdbConfig,
    description="SQL on DuckDB; result {rows, row_count, columns} or an Arrow $ref",
)
