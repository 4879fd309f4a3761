"""``kind: snowflake``: SQL on Snowflake through the official ``snowflake-connector-python``.

Inputs: ``auth`` (a credential name or an inline mapping) and ``command`` | ``commands`` |
``query`` | ``sql`` (one or more statements, or a list; ``command_b64`` as NoETL). The
credential holds NoETL's ``sf_*`` fields or the connector's own names: ``account``, ``user``,
``password`` | ``private_key`` (PEM, ``private_key_passphrase``), ``warehouse``, ``database``,
``schema``, ``role`` — and optionally ``host`` / ``port`` / ``protocol`` for a private link or
a local emulator (the tests use fakesnow's server, a Snowflake REST API over DuckDB).

Result of the last statement: ``{rows, row_count, columns}`` plus each statement's own as
``command_0``, ``command_1`` … (the ``postgres`` shape). Errors are ``snowflake_error`` with
Snowflake's ``errno`` as ``code`` and ``snowflake: {errno, sqlstate}``; connection failures
(``OperationalError``) are retryable. ``transfer`` uses :func:`snowflake_batches` and
:func:`snowflake_write` for Snowflake sources and targets.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa
from pydantic import Field

from noetl_dagster.tools.configs import ToolConfig
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool
from noetl_dagster.util.jsonutil import plain

_FIELDS = {
    "account": ("sf_account", "account"),
    "user": ("sf_user", "user", "username"),
    "password": ("sf_password", "password"),
    "private_key": ("sf_private_key", "private_key"),
    "private_key_passphrase": ("sf_private_key_passphrase", "private_key_passphrase"),
    "warehouse": ("sf_warehouse", "warehouse"),
    "database": ("sf_database", "database"),
    "schema": ("sf_schema", "schema"),
    "role": ("sf_role", "role"),
    "host": ("sf_host", "host"),
    "port": ("sf_port", "port"),
    "protocol": ("sf_protocol", "protocol"),
}
SECRET_FIELDS = ("password", "private_key", "private_key_passphrase")


class SnowflakeConfig(ToolConfig):
    auth: str | dict[str, Any] | None = Field(
        None, description="credential name or inline {account, user, ...}"
    )
    credential: str | dict[str, Any] | None = Field(None, description="alias of auth")
    command: str | list[str] | None = Field(None, description="one or more SQL statements")
    commands: str | list[str] | None = Field(None, description="alias of command")
    query: str | list[str] | None = Field(None, description="alias of command")
    sql: str | list[str] | None = Field(None, description="alias of command")
    command_b64: str | None = Field(None, description="base64 of the SQL (NoETL)")
    commands_b64: str | None = Field(None, description="alias of command_b64")
    params: list[Any] | dict[str, Any] | None = Field(
        None, description="bind parameters of a single statement"
    )


def _import_connector() -> Any:
    try:
        import snowflake.connector  # noqa: PLC0415
    except ImportError:
        raise ToolError(
            "snowflake: snowflake-connector-python is not installed (pip install 'noetl-dagster[snowflake]')",
            kind="config_error",
        ) from None
    return snowflake.connector


def connect_params(auth: Any, ctx: ToolContext) -> dict[str, Any]:
    if isinstance(auth, str):
        record = ctx.credential(auth)
    elif isinstance(auth, Mapping):
        record = dict(auth)
    else:
        raise ToolError("snowflake: 'auth' (a credential name or mapping) is required", kind="config_error")
    params: dict[str, Any] = {}
    for key, names in _FIELDS.items():
        for n in names:
            if record.get(n) not in (None, ""):
                params[key] = record[n]
                break
    for key in SECRET_FIELDS:
        if isinstance(params.get(key), str):
            ctx.redact(params[key])
    if not params.get("account") or not params.get("user"):
        raise ToolError(
            "snowflake: the credential needs account and user (sf_account, sf_user)", kind="auth_error"
        )
    if "port" in params:
        params["port"] = int(params["port"])
    pem = params.pop("private_key", None)
    if pem:
        from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

        phrase = params.pop("private_key_passphrase", None)
        key = serialization.load_pem_private_key(
            str(pem).encode(), password=phrase.encode() if phrase else None
        )
        params["private_key"] = key.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    elif not params.get("password"):
        raise ToolError("snowflake: the credential needs password or private_key", kind="auth_error")
    params.pop("private_key_passphrase", None)
    for key in ("login_timeout", "network_timeout"):
        if record.get(key) is not None:
            params[key] = int(record[key])
    params.setdefault("login_timeout", 30)
    params.setdefault("session_parameters", {"CLIENT_OUT_OF_BAND_TELEMETRY_ENABLED": False})
    return params


def sf_error(e: BaseException, what: str) -> ToolError:
    connector = _import_connector()
    errno = getattr(e, "errno", None)
    sqlstate = getattr(e, "sqlstate", None)
    msg = getattr(e, "msg", None) or str(e)
    return ToolError(
        f"snowflake: {what}: {msg}".strip(),
        kind="snowflake_error",
        retryable=isinstance(e, (connector.errors.OperationalError, connector.errors.InterfaceError)),
        code=errno,
        details={"snowflake": {"errno": errno, "sqlstate": sqlstate}},
    )


def connect(auth: Any, ctx: ToolContext, params: dict[str, Any] | None = None) -> Any:
    connector = _import_connector()
    try:
        return connector.connect(**(params or connect_params(auth, ctx)))
    except connector.errors.Error as e:
        raise sf_error(e, "connecting") from None


def _sql(inputs: Mapping[str, Any]) -> str:
    b64 = inputs.get("command_b64") or inputs.get("commands_b64")
    if b64:
        return base64.b64decode(b64).decode()
    sql = next((inputs[k] for k in ("command", "commands", "query", "sql") if inputs.get(k)), None)
    if isinstance(sql, list):
        sql = ";\n".join(str(s).rstrip().rstrip(";") for s in sql if str(s).strip())
    if not isinstance(sql, str) or not sql.strip():
        raise ToolError("snowflake: 'command' (or 'commands' / 'query') is required", kind="config_error")
    return sql


def note_sql(sql: str, params: Mapping[str, Any], ctx: ToolContext) -> None:
    """The statement and account, for OpenLineage column lineage (lineage/noetl_lineage/sql.py; OpenLineage's
    Snowflake naming: namespace ``snowflake://<account>``, name ``database.schema.table``)."""
    note = getattr(ctx, "note", None)
    if note is not None:
        note(
            sql=sql,
            sql_namespace=f"snowflake://{str(params.get('account')).lower()}",
            sql_database=params.get("database"),
            sql_default_schema=params.get("schema") or "PUBLIC",
            sql_dialect="snowflake",
        )


def _cursor_result(cur: Any) -> dict[str, Any]:
    if not cur.description:
        return {"rows": [], "row_count": max(cur.rowcount or 0, 0), "columns": []}
    cols = [d[0] for d in cur.description]
    rows = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
    return {"rows": plain(rows), "row_count": len(rows), "columns": cols}


@register_tool(
    "snowflake", config=SnowflakeConfig, description="SQL on Snowflake (snowflake-connector-python)"
)
def snowflake_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    """SQL on Snowflake; result {rows, row_count, columns, command_0…}."""
    sql = _sql(inputs)
    auth = inputs.get("auth") or inputs.get("credential")
    params = connect_params(auth, ctx)
    note_sql(sql, params, ctx)
    conn = connect(auth, ctx, params)
    connector = _import_connector()
    try:
        results: list[dict[str, Any]] = []
        params = inputs.get("params")
        if params is not None:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                results.append(_cursor_result(cur))
        else:
            for cur in conn.execute_string(sql, remove_comments=True):
                results.append(_cursor_result(cur))
                cur.close()
        if not results:
            raise ToolError("snowflake: the SQL holds no statement", kind="config_error")
        out = dict(results[-1])
        for i, r in enumerate(results):
            out[f"command_{i}"] = r
        return out
    except connector.errors.Error as e:
        raise sf_error(e, "query failed") from None
    finally:
        conn.close()


# -- transfer support ------------------------------------------------------------------------------
def snowflake_batches(
    src: Mapping[str, Any],
    chunk: int,
    ctx: ToolContext,
    to_batch: Callable[[list[dict[str, Any]]], pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """The source query's rows, ``chunk`` at a time, as batches (``to_batch`` is transfer's converter)."""
    connector = _import_connector()
    params = connect_params(src.get("auth"), ctx)
    note_sql(str(src["query"]), params, ctx)  # the source query, for column lineage
    conn = connect(src.get("auth"), ctx, params)
    try:
        with conn.cursor() as cur:
            cur.execute(str(src["query"]))
            cols = [d[0] for d in cur.description or []]
            while rows := cur.fetchmany(chunk):
                yield to_batch([dict(zip(cols, r, strict=True)) for r in rows])
    except connector.errors.Error as e:
        raise sf_error(e, "source query") from None
    finally:
        conn.close()


def snowflake_write(
    tgt: Mapping[str, Any],
    mode: str,
    batches: Iterator[pa.RecordBatch],
    ctx: ToolContext,
    stats: dict[str, Any],
    mapped: Callable,
    count: Callable,
) -> None:
    """Insert batches into ``tgt.table`` (or run ``tgt.query`` per row) in one transaction."""
    connector = _import_connector()
    table, query = tgt.get("table"), tgt.get("query")
    if not table and not query:
        raise ToolError(
            "transfer: target.table or target.query is required for a snowflake target", kind="config_error"
        )
    if mode == "upsert":
        raise ToolError(
            "transfer: mode upsert is not supported for a snowflake target (use target.query with MERGE)",
            kind="config_error",
        )
    conn = connect(tgt.get("auth"), ctx)
    try:
        conn.autocommit(False)
        with conn.cursor() as cur:
            if mode == "replace" and table:
                cur.execute(f"TRUNCATE TABLE IF EXISTS {table}")
            for batch in batches:
                cols, rows = mapped(batch, tgt.get("mapping"))
                stmt = (
                    query
                    or f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(['%s'] * len(cols))})"
                )
                cur.executemany(stmt, rows)
                stats["columns"] = cols
                count(stats, batch)
        conn.commit()
    except connector.errors.Error as e:
        conn.rollback()
        raise sf_error(e, f"target {table or 'query'}") from None
    finally:
        conn.close()
