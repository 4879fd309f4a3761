"""``kind: postgres`` on psycopg 3.

Inputs: ``auth`` (alias ``credential``) — a credential name resolved through the
keychain, an inline mapping, or a connection string — or ``connection_string`` |
``dsn``; the SQL in ``command`` | ``query`` (a string with one or more
statements, or a list of statements); ``params`` (a list for ``%s`` or a mapping
for ``%(name)s``) bound server-side; ``schema`` (sets ``search_path`` for the call).

Result of the last statement: ``{rows: [ {column: value} ], row_count, columns}``,
plus each statement's own result as ``command_0``, ``command_1``… (the NoETL
Python worker's shape, which many playbooks read: ``{{ step.command_0.rows }}``).
Statements run in one transaction: without ``params`` the text goes to the
server as one simple-protocol query (an implicit transaction); with ``params``
it is split on top-level ``;`` and run inside an explicit transaction.
Bulk: ``batch`` (a list of parameter sets for one statement: ``executemany`` in
pipeline mode) and ``copy: {table, columns, rows}`` (``COPY … FROM STDIN``), in
tools/postgres_batch.py.

Errors carry ``pg: {code, sqlstate}`` (``code`` the PostgreSQL condition name);
connection failures, serialization failures, deadlocks, lock timeouts and
resource shortages are retryable. One connection pool per credential (connection
string) per process, shared by the executions that process runs. Statements
with params are prepared server-side by psycopg from their second use on a
connection (``prepare_threshold`` 1, psycopg's default is 5), so a loop's INSERT
is parsed and planned once per pooled connection.

The per-call path is kept lean (a parallel loop calls it thousands of times):
statement splits cached, the server parsed once per connection string, and
measured network bytes read with one ``getsockopt(TCP_INFO)`` per call.
"""

from __future__ import annotations

import atexit
import os
import re
import socket
import struct
import threading
import weakref
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from noetl_dagster.engine.usage import count, in_cluster
from noetl_dagster.tools.configs import PostgresConfig
from noetl_dagster.tools.credentials import lookup_credential
from noetl_dagster.tools.postgres_batch import run_batch, run_copy, set_search_path
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool
from noetl_dagster.util.jsonutil import plain
from noetl_dagster.util.sql import split_sql

DEFAULT_POOL_SIZE = 16
# psycopg prepares a statement server-side once it ran this many times on a connection (its default
# is 5): a loop's statement is parsed and planned once per pooled connection from its second call,
# while a one-off statement (values spliced into the text by a template) is never prepared.
PREPARE_THRESHOLD = 1
CONNECT_TIMEOUT = 10  # seconds, for a new connection and for waiting on the pool
# SQLSTATE classes/codes worth retrying: the same call may succeed a moment later.
RETRYABLE_SQLSTATE_CLASSES = ("08", "53", "57")  # connection, insufficient resources, operator intervention
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01", "55P03", "57014"})
# libpq reports connection-time failures without a SQLSTATE; recover it from the message.
_CONNECT_MESSAGES = (
    (re.compile(r"password authentication failed|authentication failed", re.I), "28P01", "invalid_password"),
    (
        re.compile(r'role ".*" does not exist|no pg_hba\.conf entry', re.I),
        "28000",
        "invalid_authorization_specification",
    ),
    (re.compile(r'database ".*" does not exist', re.I), "3D000", "invalid_catalog_name"),
    (re.compile(r"too many (connections|clients)", re.I), "53300", "too_many_connections"),
    (re.compile(r"the database system is (starting up|shutting down)", re.I), "57P03", "cannot_connect_now"),
)

# credential fields → libpq keywords
_FIELD_ALIASES = {
    "host": ("db_host", "host", "hostname"),
    "port": ("db_port", "port"),
    "user": ("db_user", "user", "username"),
    "password": ("db_password", "password"),
    "dbname": ("db_name", "dbname", "database", "db"),
    "sslmode": ("sslmode", "db_sslmode"),
}


def conninfo_from(auth: Any, ctx: ToolContext) -> tuple[str, str]:
    """(conninfo, label) for an ``auth`` value: credential name, mapping, or DSN."""
    if isinstance(auth, str) and (auth.startswith(("postgres://", "postgresql://")) or "=" in auth):
        _redact_conninfo(auth, ctx)
        return auth, "connection string"
    if isinstance(auth, str):
        record = lookup_credential(ctx, auth, "postgres")
        label = f"credential {auth!r}"
    elif isinstance(auth, Mapping):
        record, label = dict(auth), "inline auth"
    else:
        raise ToolError(
            "postgres: 'auth' (a credential name) or 'connection_string' is required", kind="config_error"
        )
    for key in ("connection_string", "dsn", "conninfo", "url", "database_url"):
        if isinstance(record.get(key), str):
            _redact_conninfo(record[key], ctx)
            return record[key], label
    kwargs: dict[str, Any] = {}
    for kw, names in _FIELD_ALIASES.items():
        for name in names:
            if record.get(name) not in (None, ""):
                kwargs[kw] = str(record[name])
                break
    if "host" not in kwargs and "dbname" not in kwargs:
        raise ToolError(f"postgres: {label} has no db_host/db_name or connection string", kind="auth_error")
    if kwargs.get("password"):
        ctx.redact(kwargs["password"])
    return make_conninfo(**kwargs), label


def _redact_conninfo(conninfo: str, ctx: ToolContext) -> None:
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return
    if params.get("password"):
        ctx.redact(str(params["password"]))


class PgConnector:
    """A lazily opened pool for one conninfo; surfaces the real connect error fast."""

    def __init__(self, conninfo: str, max_size: int = DEFAULT_POOL_SIZE):
        self.conninfo = conninfo
        self.server = server_of(conninfo)  # parsed once: libpq's parser costs ~0.1-0.4 ms a call
        self.host = self.server[3]
        self.egress = not in_cluster(self.host)  # measured usage: decided once, not per call (~0.1 ms)
        self.max_size = max_size
        self._pool: ConnectionPool | None = None
        self._lock = threading.Lock()

    def _probe(self) -> None:
        # A direct connect gives libpq's own error (refused, bad role…) instead of a pool timeout.
        psycopg.connect(self.conninfo, connect_timeout=CONNECT_TIMEOUT).close()

    def pool(self) -> ConnectionPool:
        pool = self._pool  # the hot path: no lock once the pool is open
        if pool is not None:
            return pool
        with self._lock:
            if self._pool is None:
                self._probe()
                self._pool = ConnectionPool(
                    self.conninfo,
                    min_size=1,
                    max_size=self.max_size,
                    kwargs={
                        "autocommit": True,
                        "connect_timeout": CONNECT_TIMEOUT,
                        "prepare_threshold": PREPARE_THRESHOLD,
                    },
                    open=True,
                    name="noetl-postgres",
                )
            return self._pool

    def connection(self):
        pool = self.pool()
        try:
            return pool.connection(timeout=CONNECT_TIMEOUT)
        except PoolTimeout:
            self._probe()  # raises the underlying error when the server is unreachable
            raise

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def pg_error(e: BaseException, label: str) -> ToolError:
    sqlstate = getattr(e, "sqlstate", None)
    code = None
    message = str(e).strip()
    if isinstance(e, PoolTimeout):
        sqlstate, code = "08001", "pool_timeout"
    elif sqlstate:
        code = _snake(type(e).__name__) if type(e).__module__.startswith("psycopg.errors") else None
    elif isinstance(e, psycopg.OperationalError):
        for pattern, state, name in _CONNECT_MESSAGES:
            if pattern.search(message):
                sqlstate, code = state, name
                break
        else:
            sqlstate, code = "08001", "sqlclient_unable_to_establish_sqlconnection"
    sqlstate = sqlstate or None
    retryable = bool(sqlstate) and (
        sqlstate in RETRYABLE_SQLSTATES or sqlstate[:2] in RETRYABLE_SQLSTATE_CLASSES
    )
    return ToolError(
        f"postgres ({label}): {message}",
        kind="pg_error",
        retryable=retryable,
        code=code or sqlstate,
        details={"pg": {"code": code or sqlstate, "sqlstate": sqlstate}},
    )


def _statements(inputs: Mapping[str, Any]) -> list[str] | str:
    for key in ("command", "query", "commands", "sql"):  # the first key present wins, even if None
        if key in inputs:
            sql = inputs[key]
            break
    else:
        sql = None
    if sql is None or (isinstance(sql, str) and not sql.strip()):
        raise ToolError("postgres: 'command' (or 'query') is required", kind="config_error")
    if isinstance(sql, str):
        return sql
    if isinstance(sql, Sequence) and all(isinstance(s, str) for s in sql):
        return [s for s in sql if s.strip()]
    raise ToolError("postgres: 'command' must be a string or a list of strings", kind="config_error")


def _result(cur: psycopg.Cursor) -> dict[str, Any]:
    if cur.description is None:
        return {"rows": [], "row_count": max(cur.rowcount, 0), "columns": []}
    columns = [c.name for c in cur.description]
    rows = plain(cur.fetchall())  # JSON types, so a live run and a replay see the same values
    return {"rows": rows, "row_count": len(rows), "columns": columns}


_PLACEHOLDER = re.compile(r"%(\([^)]+\))?s")


@lru_cache(maxsize=1024)
def _uses_placeholders(stmt: str) -> bool:
    return bool(_PLACEHOLDER.search(stmt))


@lru_cache(maxsize=512)
def _split(sql: str) -> tuple[str, ...]:
    """split_sql, cached: a loop runs the same statement text thousands of times (50 us a split)."""
    return tuple(split_sql(sql))


def run_sql(
    conn: psycopg.Connection, sql: list[str] | str, params: Any, schema: str | None
) -> dict[str, Any]:
    positional = type(params) is list or type(params) is tuple  # exact types first: this runs every call
    if params is not None and not positional and not isinstance(params, (Mapping, list, tuple)):
        raise ToolError(
            f"postgres: params must be a list or a mapping, got {type(params).__name__}", kind="config_error"
        )
    if params is not None and len(params) == 0:
        params = None
    statements = _split(sql) if isinstance(sql, str) and (params is not None or schema) else sql
    with conn.cursor(row_factory=dict_row) as cur:
        if isinstance(statements, str):
            # One simple-protocol round trip; Postgres runs it as one implicit transaction.
            cur.execute(statements, prepare=False)
            results = [_result(cur)]
            while cur.nextset():
                results.append(_result(cur))
            return _combined(results)
        if params is not None and len(statements) > 1 and (positional or not isinstance(params, Mapping)):
            with_placeholders = [s for s in statements if _uses_placeholders(s)]
            if len(with_placeholders) > 1:
                raise ToolError(
                    "postgres: positional params with several statements that take them; use named params %(name)s",
                    kind="config_error",
                )
        results: list[dict[str, Any]] = []
        if len(statements) == 1 and not schema:  # autocommit already makes one statement atomic
            stmt = statements[0]
            if params is not None and _uses_placeholders(stmt):
                cur.execute(stmt, params)
            else:
                cur.execute(stmt, prepare=False)
            return _combined([_result(cur)])
        with conn.transaction():
            if schema:
                set_search_path(cur, schema)
            for stmt in statements:
                if params is not None and _uses_placeholders(stmt):
                    cur.execute(stmt, params)
                else:
                    cur.execute(stmt, prepare=False)
                results.append(_result(cur))
        return _combined(results)


def _combined(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The last statement's result, plus every statement's as ``command_<i>`` (NoETL's shape)."""
    if len(results) == 1:
        return {**results[0], "command_0": results[0]}
    last = results[-1] if results else {"rows": [], "row_count": 0, "columns": []}
    return {**last, **{f"command_{i}": r for i, r in enumerate(results)}}


_POOLS: dict[tuple[int, str, int], PgConnector] = {}
_POOLS_LOCK = threading.Lock()
_PID = [os.getpid()]  # refreshed in a forked child, so the hot path makes no getpid() call
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


def connector_for(conninfo: str, ctx: ToolContext) -> PgConnector:
    """The process's pool for this connection string: executions share it, so a
    loop's sixteen connections are opened once, not once per execution."""
    spec = ctx.spec
    size = (
        int(spec.get("pool_size") or DEFAULT_POOL_SIZE)
        if isinstance(spec, dict | Mapping) and spec
        else DEFAULT_POOL_SIZE
    )
    key = (_PID[0], conninfo, size)  # a forked worker never reuses its parent's sockets
    connector = _POOLS.get(key)  # the hot path: no lock once the pool exists (dict reads are atomic)
    if connector is not None:
        return connector
    with _POOLS_LOCK:
        connector = _POOLS.get(key)
        if connector is None:
            connector = _POOLS[key] = PgConnector(conninfo, size)
        return connector


@atexit.register
def close_pools() -> None:
    with _POOLS_LOCK:
        for key, connector in list(_POOLS.items()):
            if key[0] == os.getpid():
                connector.close()
            del _POOLS[key]


@lru_cache(maxsize=256)
def server_of(conninfo: str) -> tuple[str, str | None, str, str | None]:
    """(lineage namespace ``postgres://host:port``, dbname, default host, host as written) of a
    connection string — parsed once per string, never the password."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        params = {}
    host = str(params.get("host") or "localhost").split(",")[0]
    port = str(params.get("port") or "5432").split(",")[0]
    return f"postgres://{host}:{port}", params.get("dbname"), host, params.get("host")


def note_sql(sql: list[str] | str, conninfo: str, schema: Any, ctx: ToolContext) -> None:
    """The statement and server, for OpenLineage column lineage (lineage/noetl_lineage/sql.py); never the password."""
    note = getattr(ctx, "note", None)
    if note is None:
        return
    namespace, dbname, _, _ = server_of(conninfo)
    note(
        sql=sql if isinstance(sql, str) else ";\n".join(sql),
        sql_namespace=namespace,
        sql_database=dbname,
        sql_default_schema=schema if isinstance(schema, str) else "public",
        sql_dialect="postgres",
    )


# struct tcp_info (Linux >= 4.2): tcpi_bytes_acked, tcpi_bytes_received at byte 120
_TCP_INFO_BYTES = struct.Struct("=QQ")
_TCP_INFO_AT = 120
_TCP_INFO_LEN = _TCP_INFO_AT + _TCP_INFO_BYTES.size


class _Wire:
    """One pooled connection's TCP socket for TCP_INFO reads: a dup of libpq's fd kept open (made once
    per connection: a socket per call cost two 10-20 us dup/probe/close rounds), and the counters read
    when the connection last went back to the pool — the next call's "before", so a call costs one
    getsockopt. Between two calls a pooled connection carries no traffic of anyone else's."""

    __slots__ = ("fd", "sock", "last")

    def __init__(self, fd: int, sock: socket.socket | None):
        self.fd, self.sock, self.last = fd, sock, None

    def read(self) -> tuple[int, int] | None:
        if self.sock is None:
            return None
        try:
            raw = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
        except OSError:
            return None
        return _TCP_INFO_BYTES.unpack_from(raw, _TCP_INFO_AT) if len(raw) >= _TCP_INFO_LEN else None


_WIRES: weakref.WeakKeyDictionary[psycopg.Connection, _Wire] = weakref.WeakKeyDictionary()
_WIRES_LOCK = threading.Lock()


def _wire(conn: psycopg.Connection) -> _Wire:
    fd = conn.pgconn.socket
    wire = _WIRES.get(conn)
    if wire is not None and wire.fd == fd:
        return wire
    sock: socket.socket | None = None
    if hasattr(socket, "TCP_INFO"):
        try:
            sock = socket.socket(fileno=os.dup(fd))  # a dup: closing it leaves libpq's fd open
        except OSError:
            sock = None
        if sock is not None and sock.family not in (socket.AF_INET, socket.AF_INET6):  # a Unix socket
            sock.close()
            sock = None
    wire = _Wire(fd, sock)
    with _WIRES_LOCK:
        old = _WIRES.get(conn)
        _WIRES[conn] = wire
    if old is not None and old.sock is not None:
        old.sock.close()
    if sock is not None:
        weakref.finalize(conn, sock.close)  # the dup goes with the connection
    return wire


def socket_bytes(conn: psycopg.Connection) -> tuple[int, int] | None:
    """(sent and acknowledged, received) bytes of the connection's TCP socket, read from the kernel's
    TCP_INFO: the real wire bytes, protocol framing included. None on a Unix socket or without TCP_INFO."""
    try:
        return _wire(conn).read()
    except psycopg.Error:
        return None


def _wire_before(conn: psycopg.Connection) -> _Wire | None:
    """The connection's wire, with ``last`` set to the counters now unless the last call left them."""
    try:
        wire = _wire(conn)
    except psycopg.Error:
        return None
    if wire.last is None:
        wire.last = wire.read()
    return wire if wire.last is not None else None


def _count_wire_bytes(wire: _Wire | None, egress: bool) -> None:
    """engine.usage.count_network's counters (in-cluster decided once per connector, not per call)."""
    if wire is None:
        return
    before, after = wire.last, wire.read()
    wire.last = after
    if before is not None and after is not None:
        sent = max(after[0] - before[0], 0)
        count(
            net_out_bytes=sent, net_in_bytes=max(after[1] - before[1], 0), egress_bytes=sent if egress else 0
        )


def _copy_sql(copy: Any) -> str:
    """The COPY as a statement, for lineage (the rows themselves are streamed, never noted)."""
    if not isinstance(copy, Mapping):
        raise ToolError("postgres: 'copy' must be a mapping {table, columns, rows}", kind="config_error")
    cols = copy.get("columns")
    cols = f" ({', '.join(map(str, cols))})" if isinstance(cols, list) and cols else ""
    return f"COPY {copy.get('table')}{cols} FROM STDIN"


def postgres_tool(inputs: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """SQL against PostgreSQL (psycopg 3); result {rows, row_count, columns}."""
    auth = (
        inputs.get("auth") or inputs.get("credential") or inputs.get("connection_string") or inputs.get("dsn")
    )
    if auth is None:
        raise ToolError(
            "postgres: 'auth' (a credential name) or 'connection_string' is required", kind="config_error"
        )
    if isinstance(auth, str):  # resolved once per execution and credential
        conninfo, label = ctx.resource(f"pg.conninfo:{auth}", lambda: conninfo_from(auth, ctx))
    else:
        conninfo, label = conninfo_from(auth, ctx)
    copy, batch, schema = inputs.get("copy"), inputs.get("batch"), inputs.get("schema")
    sql = _statements(inputs) if copy is None else _copy_sql(copy)
    note_sql(sql, conninfo, schema, ctx)
    connector = connector_for(conninfo, ctx)
    try:
        with connector.connection() as conn:
            wire = _wire_before(conn)  # measured usage (engine/usage.py): network bytes of this call
            try:
                if copy is not None:
                    return _combined([run_copy(conn, copy, schema)])
                if batch is not None:
                    return _combined(
                        [run_batch(conn, _split(sql) if isinstance(sql, str) else sql, batch, schema)]
                    )
                return run_sql(conn, sql, inputs.get("params"), schema)
            finally:
                _count_wire_bytes(wire, connector.egress)
    except ToolError:
        raise
    except (psycopg.Error, PoolTimeout) as e:
        raise pg_error(e, label) from None


register_tool(
    "postgres",
    postgres_tool,
    config=PostgresConfig,
    description="SQL on PostgreSQL (psycopg 3); result {rows, row_count, columns}",
)
