"""``kind: transfer``: move a query result from one system to another in Arrow batches.

NoETL's shape::

    kind: transfer
    source: {type: http|postgres|duckdb|snowflake, auth, query | url, method, headers, params, data_path}
    target: {type: postgres|duckdb|snowflake|parquet|arrow|iceberg, auth, table | query | uri, mapping, mode}
    chunk_size: 1000
    mode: append | replace | upsert        # also target.mode; upsert needs target.key (default: first column)

The source is read chunk by chunk (a server-side cursor on Postgres, DuckDB's record-batch reader,
Snowflake's fetchmany, an HTTP body cut into chunks) and each chunk becomes one ``pyarrow.RecordBatch``
that is written before the next is read — except for table formats (parquet / arrow / iceberg), which
publish one version through the registry (noetl_dagster.storage.tables, the IO managers' storage).
``target.mapping`` is ``{target_column: source_field}`` (dotted paths reach into nested JSON).

Result: ``{direction, source_type, target_type, mode, rows_transferred, chunks_processed, bytes,
columns, target_table | ref, duration_ms}`` — ``bytes`` is the Arrow buffer size of the batches moved.
A failure rolls the target's transaction back (Postgres, DuckDB) and is an error outcome
``transfer_error`` (or the source's own: ``http`` status, ``pg`` SQLSTATE) naming the side that failed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from noetl_dagster.tools.configs import ToolConfig
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool
from noetl_dagster.util.extras import require

SOURCES = ("http", "postgres", "duckdb", "snowflake")
TARGETS = ("postgres", "duckdb", "snowflake", "parquet", "arrow", "iceberg")
TABLE_FORMATS = ("parquet", "arrow", "iceberg")


class _End(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    type: str | None = Field(
        None, description="system: http, postgres, duckdb, snowflake, parquet, arrow, iceberg"
    )
    kind: str | None = Field(None, description="alias of type")
    tool: str | None = Field(None, description="alias of type")
    auth: str | dict[str, Any] | None = Field(None, description="credential name, inline mapping or DSN")
    query: str | None = Field(None, description="source: the SELECT; target: an INSERT with %s placeholders")


class TransferSource(_End):
    url: str | None = Field(None, description="http source URL")
    data_path: str | None = Field(None, description="dotted path to the records in the HTTP body")
    database: str | None = Field(
        None, description="duckdb file (default: the execution's in-memory database)"
    )


class TransferTarget(_End):
    table: str | None = Field(None, description="target table (schema.table)")
    mapping: dict[str, str] | None = Field(None, description="{target_column: source_field}")
    mode: Literal["append", "replace", "upsert"] | None = Field(
        None, description="overrides the top-level mode"
    )
    key: str | list[str] | None = Field(
        None, description="upsert conflict columns (default: the first column)"
    )
    uri: str | None = Field(None, description="noetl:// resource for parquet / arrow / iceberg targets")
    database: str | None = Field(
        None, description="duckdb file (default: the execution's in-memory database)"
    )


class TransferConfig(ToolConfig):
    source: TransferSource = Field(..., description="where the rows come from")
    target: TransferTarget = Field(..., description="where they go")
    chunk_size: int = Field(1000, ge=1, le=1_000_000, description="rows per Arrow batch")
    mode: Literal["append", "replace", "upsert"] = Field("append", description="append | replace | upsert")


def _type(end: Mapping[str, Any], side: str, allowed: tuple[str, ...]) -> str:
    t = str(end.get("type") or end.get("kind") or end.get("tool") or "").lower()
    if not t:
        raise ToolError(
            f"transfer: {side}.type is required (one of {', '.join(allowed)})", kind="config_error"
        )
    if t not in allowed:
        raise ToolError(
            f"transfer: {side}.type {t!r} is not supported (one of {', '.join(allowed)})", kind="config_error"
        )
    return t


def _plain_cell(v: Any) -> Any:
    return json.dumps(v, default=str) if isinstance(v, (dict, list)) else v


def to_batch(records: list[dict[str, Any]]) -> pa.RecordBatch:
    """Records as one Arrow batch; nested or mixed-type JSON values fall back to JSON text."""
    try:
        return _widened(pa.RecordBatch.from_pylist(records))
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        cols: dict[str, None] = {}
        for r in records:
            cols.update(dict.fromkeys(r))
        flat = [
            {c: (None if r.get(c) is None else str(_plain_cell(r.get(c)))) for c in cols} for r in records
        ]
        return pa.RecordBatch.from_pylist(flat)


def _widened(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Decimals at full precision: a type inferred from the first chunk must hold every later chunk."""
    fields = [
        pa.field(f.name, pa.decimal128(38, f.type.scale)) if pa.types.is_decimal(f.type) else f
        for f in batch.schema
    ]
    schema = pa.schema(fields)
    return batch if schema.equals(batch.schema) else batch.cast(schema)


# -- sources ---------------------------------------------------------------------------------------
def _dig(value: Any, path: str | None) -> Any:
    for part in (path or "").split("."):
        if part and isinstance(value, Mapping):
            value = value.get(part)
    return value


def _http_source(src: Mapping[str, Any], chunk: int, ctx: ToolContext) -> Iterator[pa.RecordBatch]:
    from noetl_dagster.tools.http import http_tool  # noqa: PLC0415 - same auth, overrides, errors as kind: http

    req = {
        k: v
        for k, v in src.items()
        if k not in ("type", "kind", "tool", "data_path", "query") and v is not None
    }
    body = http_tool(req, ctx)["data"]
    data = _dig(body, src.get("data_path"))
    if data is None:
        data = []
    records = data if isinstance(data, list) else [data]
    if not all(isinstance(r, Mapping) for r in records):
        records = [{"value": r} for r in records]
    for i in range(0, len(records), chunk):
        yield to_batch([dict(r) for r in records[i : i + chunk]])


def _pg_conninfo(end: Mapping[str, Any], ctx: ToolContext) -> tuple[str, str]:
    from noetl_dagster.tools.postgres import conninfo_from  # noqa: PLC0415

    auth = end.get("auth") or end.get("connection_string") or end.get("dsn")
    return conninfo_from(auth, ctx)


def _pg_source(src: Mapping[str, Any], chunk: int, ctx: ToolContext) -> Iterator[pa.RecordBatch]:
    import psycopg  # noqa: PLC0415

    from noetl_dagster.tools.postgres import note_sql, pg_error  # noqa: PLC0415

    conninfo, label = _pg_conninfo(src, ctx)
    note_sql(str(src["query"]), conninfo, src.get("schema"), ctx)  # the source query, for column lineage
    try:
        with psycopg.connect(conninfo) as conn, conn.cursor(name="noetl_transfer") as cur:
            cur.itersize = chunk
            cur.execute(str(src["query"]))
            while True:
                rows = cur.fetchmany(chunk)
                if not rows:
                    break
                names = [d.name for d in cur.description]
                yield to_batch([dict(zip(names, r, strict=True)) for r in rows])
    except psycopg.Error as e:
        raise pg_error(e, f"source {label}") from None


def _duck_conn(end: Mapping[str, Any], ctx: ToolContext) -> Any:
    from noetl_dagster.tools.duckdb_tool import _connection  # noqa: PLC0415 - the execution's shared database

    return _connection(end.get("database") or end.get("db_path"), ctx)


def _duck_source(src: Mapping[str, Any], chunk: int, ctx: ToolContext) -> Iterator[pa.RecordBatch]:
    duckdb = require("duckdb", "a transfer from DuckDB")

    from noetl_dagster.tools.duckdb_tool import note_sql  # noqa: PLC0415

    note_sql(
        str(src["query"]), src.get("database") or src.get("db_path"), ctx
    )  # the source query, for lineage
    cur = _duck_conn(src, ctx).cursor()
    try:
        reader = cur.sql(str(src["query"])).to_arrow_reader(chunk)
        yield from reader
    except duckdb.Error as e:
        raise ToolError(f"transfer: duckdb source: {e}", kind="duckdb_error", code=type(e).__name__) from None
    finally:
        cur.close()


def _source(kind: str, src: Mapping[str, Any], chunk: int, ctx: ToolContext) -> Iterator[pa.RecordBatch]:
    if kind == "http":
        if not src.get("url") and not src.get("endpoint"):
            raise ToolError("transfer: source.url is required for an http source", kind="config_error")
        return _http_source(src, chunk, ctx)
    if not src.get("query"):
        raise ToolError(f"transfer: source.query is required for a {kind} source", kind="config_error")
    if kind == "postgres":
        return _pg_source(src, chunk, ctx)
    if kind == "duckdb":
        return _duck_source(src, chunk, ctx)
    from noetl_dagster.tools.snowflake import snowflake_batches  # noqa: PLC0415

    return snowflake_batches(src, chunk, ctx, to_batch)


# -- targets ---------------------------------------------------------------------------------------
def _mapped(batch: pa.RecordBatch, mapping: Mapping[str, str] | None) -> tuple[list[str], list[tuple]]:
    records = batch.to_pylist()
    if not mapping:
        cols = list(batch.schema.names)
        return cols, [tuple(_plain_cell(r[c]) for c in cols) for r in records]
    cols = list(mapping)
    return cols, [tuple(_plain_cell(_dig(r, mapping[c])) for c in cols) for r in records]


def _qualified(table: str) -> Any:
    from psycopg import sql  # noqa: PLC0415

    return sql.Identifier(*[p.strip('"') for p in table.split(".")])


def _pg_target(
    tgt: Mapping[str, Any], mode: str, batches: Iterator[pa.RecordBatch], ctx: ToolContext, stats: dict
) -> None:
    import psycopg  # noqa: PLC0415
    from psycopg import sql  # noqa: PLC0415

    from noetl_dagster.tools.postgres import pg_error  # noqa: PLC0415

    conninfo, label = _pg_conninfo(tgt, ctx)
    table, query = tgt.get("table"), tgt.get("query")
    if not table and not query:
        raise ToolError(
            "transfer: target.table or target.query is required for a postgres target", kind="config_error"
        )
    try:
        with psycopg.connect(conninfo) as conn:  # one transaction: a failure leaves the table as it was
            with conn.cursor() as cur:
                if mode == "replace" and table:
                    cur.execute(sql.SQL("TRUNCATE TABLE {}").format(_qualified(table)))
                for batch in batches:
                    cols, rows = _mapped(batch, tgt.get("mapping"))
                    ident = sql.SQL(", ").join(map(sql.Identifier, cols))
                    if query:
                        cur.executemany(str(query), rows)
                    elif mode == "upsert":
                        key = tgt.get("key") or cols[0]
                        keys = [key] if isinstance(key, str) else list(key)
                        updates = sql.SQL(", ").join(
                            sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
                            for c in cols
                            if c not in keys
                        )
                        stmt = sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) DO {}").format(
                            _qualified(table),
                            ident,
                            sql.SQL(", ").join(sql.Placeholder() * len(cols)),
                            sql.SQL(", ").join(map(sql.Identifier, keys)),
                            sql.SQL("UPDATE SET ") + updates if cols != keys else sql.SQL("NOTHING"),
                        )
                        cur.executemany(stmt, rows)
                    else:
                        with cur.copy(
                            sql.SQL("COPY {} ({}) FROM STDIN").format(_qualified(table), ident)
                        ) as cp:
                            for r in rows:
                                cp.write_row(r)
                    stats["columns"] = cols
                    _count(stats, batch)
    except psycopg.Error as e:
        raise pg_error(e, f"target {label}") from None


def _duck_target(
    tgt: Mapping[str, Any], mode: str, batches: Iterator[pa.RecordBatch], ctx: ToolContext, stats: dict
) -> None:
    duckdb = require("duckdb", "a transfer into DuckDB")

    table = tgt.get("table")
    if not table:
        raise ToolError("transfer: target.table is required for a duckdb target", kind="config_error")
    if mode == "upsert":
        raise ToolError(
            "transfer: mode upsert is not supported for a duckdb target (append or replace)",
            kind="config_error",
        )
    cur = _duck_conn(tgt, ctx).cursor()
    try:
        cur.execute("BEGIN TRANSACTION")
        if mode == "replace":
            cur.execute(f"DROP TABLE IF EXISTS {table}")
        for batch in batches:
            mapping = tgt.get("mapping")
            if mapping:
                cols, rows = _mapped(batch, mapping)
                batch = pa.RecordBatch.from_pylist([dict(zip(cols, r, strict=True)) for r in rows])
            cur.register("__noetl_transfer_batch", batch)
            cur.execute(f"CREATE TABLE IF NOT EXISTS {table} AS SELECT * FROM __noetl_transfer_batch LIMIT 0")
            cur.execute(f"INSERT INTO {table} BY NAME SELECT * FROM __noetl_transfer_batch")
            cur.unregister("__noetl_transfer_batch")
            stats["columns"] = list(batch.schema.names)
            _count(stats, batch)
        cur.execute("COMMIT")
    except duckdb.Error as e:
        try:
            cur.execute("ROLLBACK")
        except duckdb.Error:
            pass
        raise ToolError(
            f"transfer: duckdb target {table}: {e}", kind="duckdb_error", code=type(e).__name__
        ) from None
    finally:
        cur.close()


def _table_target(
    fmt: str,
    tgt: Mapping[str, Any],
    mode: str,
    batches: Iterator[pa.RecordBatch],
    ctx: ToolContext,
    stats: dict,
) -> dict[str, Any]:
    from noetl_dagster.tools import storage  # noqa: PLC0415 - the registry-backed table storage

    collected = []
    for batch in batches:
        mapping = tgt.get("mapping")
        if mapping:
            cols, rows = _mapped(batch, mapping)
            batch = pa.RecordBatch.from_pylist([dict(zip(cols, r, strict=True)) for r in rows])
        collected.append(batch)
        _count(stats, batch)
    if not collected:
        raise ToolError("transfer: the source returned no rows; nothing to publish", kind="empty_source")
    table = pa.Table.from_batches(collected)
    stats["columns"] = list(table.schema.names)
    spec = {
        k: v
        for k, v in tgt.items()
        if k not in ("type", "kind", "tool", "mapping", "mode", "key", "table", "auth", "query", "database")
        and v is not None
    }
    spec.update({"data": table, "mode": "overwrite" if mode == "replace" else "append"})
    return {"parquet": storage.parquet_tool, "arrow": storage.arrow_tool, "iceberg": storage.iceberg_tool}[
        fmt
    ](spec, ctx)


def _count(stats: dict, batch: pa.RecordBatch) -> None:
    stats["rows_transferred"] += batch.num_rows
    stats["chunks_processed"] += 1
    stats["bytes"] += batch.nbytes


@register_tool(
    "transfer", config=TransferConfig, description="Move a query result between systems in Arrow batches"
)
def transfer_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    """Move rows from source to target (http/postgres/duckdb/snowflake -> postgres/duckdb/snowflake/parquet/iceberg)."""
    src, tgt = dict(inputs.get("source") or {}), dict(inputs.get("target") or {})
    s_kind, t_kind = _type(src, "source", SOURCES), _type(tgt, "target", TARGETS)
    chunk = int(inputs.get("chunk_size") or 1000)
    mode = str(tgt.get("mode") or inputs.get("mode") or "append")
    stats: dict[str, Any] = {"rows_transferred": 0, "chunks_processed": 0, "bytes": 0, "columns": []}
    start = time.monotonic()
    batches = _source(s_kind, src, chunk, ctx)
    out: dict[str, Any] = {
        "direction": f"{s_kind}_to_{t_kind}",
        "source_type": s_kind,
        "target_type": t_kind,
        "mode": "custom" if tgt.get("query") else mode,
    }
    try:
        if t_kind == "postgres":
            _pg_target(tgt, mode, batches, ctx, stats)
        elif t_kind == "duckdb":
            _duck_target(tgt, mode, batches, ctx, stats)
        elif t_kind == "snowflake":
            from noetl_dagster.tools.snowflake import snowflake_write  # noqa: PLC0415

            snowflake_write(tgt, mode, batches, ctx, stats, _mapped, _count)
        else:
            out["ref"] = _table_target(t_kind, tgt, mode, batches, ctx, stats)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # a failed target must not leave the source's cursor (and its locks) open
    if tgt.get("table"):
        out["target_table"] = tgt["table"]
    out.update(stats)
    out["duration_ms"] = int((time.monotonic() - start) * 1000)
    ctx.log(
        f"transfer {out['direction']}: {stats['rows_transferred']} rows, {stats['chunks_processed']} chunks, "
        f"{stats['bytes']} bytes"
    )
    return out
