"""SQL storage for the registry: SQLite (embedded default) or Postgres (production).

Both dialects run the same statements, written with ``?`` placeholders and
translated for psycopg. Schema changes are numbered migrations recorded in
``registry_schema_version`` and applied under a lock (``BEGIN IMMEDIATE`` on
SQLite, an advisory lock on Postgres), so several processes may start at once.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from noetl_registry.errors import Conflict
from noetl_registry.models import iso

# Timestamps are fixed-width UTC text in both dialects (see models.iso), for display and
# ordering; grant expiry, which decides access, is also kept as an instant (migration 2).
# JSON is jsonb on Postgres.
_COMMON_V1 = """
CREATE TABLE IF NOT EXISTS registry_api_key (
    key_id TEXT PRIMARY KEY,
    secret_hash TEXT NOT NULL,
    tenant_id TEXT NOT NULL,
    project_id TEXT,
    label TEXT,
    created_at TEXT NOT NULL,
    revoked_at TEXT
);
CREATE TABLE IF NOT EXISTS registry_series (
    series_id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    project_id TEXT NOT NULL,
    namespace TEXT NOT NULL,
    resource_type TEXT NOT NULL,
    name TEXT NOT NULL,
    last_seq BIGINT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS registry_resource (
    resource_id TEXT PRIMARY KEY,
    series_id TEXT NOT NULL REFERENCES registry_series(series_id),
    seq BIGINT NOT NULL,
    uri TEXT NOT NULL UNIQUE,
    tenant_id TEXT NOT NULL,
    project_id TEXT NOT NULL,
    namespace TEXT NOT NULL,
    resource_type TEXT NOT NULL,
    name TEXT NOT NULL,
    version TEXT NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    home_shard TEXT NOT NULL,
    metadata {json} NOT NULL,
    created_at TEXT NOT NULL,
    created_by TEXT,
    execution_id TEXT,
    step TEXT,
    task TEXT,
    UNIQUE (series_id, seq),
    UNIQUE (series_id, version)
);
CREATE INDEX IF NOT EXISTS registry_resource_scope ON registry_resource (tenant_id, project_id, namespace, name);
CREATE TABLE IF NOT EXISTS registry_location (
    location_id TEXT PRIMARY KEY,
    resource_id TEXT NOT NULL REFERENCES registry_resource(resource_id),
    storage_type TEXT NOT NULL,
    storage_uri TEXT NOT NULL,
    region TEXT NOT NULL,
    shard_id TEXT,
    storage_class TEXT NOT NULL,
    role TEXT NOT NULL,
    status TEXT NOT NULL,
    checksum TEXT,
    size_bytes BIGINT,
    format TEXT,
    row_count BIGINT,
    schema_fingerprint TEXT,
    metadata {json} NOT NULL,
    created_at TEXT NOT NULL,
    UNIQUE (resource_id, storage_uri)
);
CREATE INDEX IF NOT EXISTS registry_location_resource ON registry_location (resource_id);
CREATE TABLE IF NOT EXISTS registry_grant (
    grant_id TEXT PRIMARY KEY,
    owner_tenant TEXT NOT NULL,
    owner_project TEXT NOT NULL,
    target_uri TEXT NOT NULL,
    series_id TEXT NOT NULL,
    resource_id TEXT,
    subject TEXT NOT NULL,
    subject_tenant TEXT NOT NULL,
    subject_project TEXT,
    permission TEXT NOT NULL,
    purpose TEXT,
    conditions {json} NOT NULL,
    expires_at TEXT,
    created_at TEXT NOT NULL,
    created_by TEXT,
    revoked_at TEXT
);
CREATE INDEX IF NOT EXISTS registry_grant_lookup ON registry_grant (series_id, subject_tenant);
CREATE INDEX IF NOT EXISTS registry_grant_subject ON registry_grant (subject_tenant);
CREATE TABLE IF NOT EXISTS registry_lineage (
    lineage_id TEXT PRIMARY KEY,
    output_resource_id TEXT NOT NULL REFERENCES registry_resource(resource_id),
    input_resource_id TEXT NOT NULL REFERENCES registry_resource(resource_id),
    relationship TEXT NOT NULL,
    execution_id TEXT,
    step TEXT,
    task TEXT,
    created_at TEXT NOT NULL,
    UNIQUE (output_resource_id, input_resource_id)
);
CREATE INDEX IF NOT EXISTS registry_lineage_input ON registry_lineage (input_resource_id);
CREATE TABLE IF NOT EXISTS registry_event (
    seq BIGINT PRIMARY KEY,
    event_id TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    tenant_id TEXT NOT NULL,
    project_id TEXT NOT NULL,
    resource_id TEXT,
    uri TEXT,
    actor TEXT,
    ts TEXT NOT NULL,
    data {json} NOT NULL
);
CREATE INDEX IF NOT EXISTS registry_event_scope ON registry_event (tenant_id, seq);
CREATE TABLE IF NOT EXISTS registry_audit (
    seq BIGINT PRIMARY KEY,
    ts TEXT NOT NULL,
    action TEXT NOT NULL,
    allowed {bool} NOT NULL,
    reason TEXT,
    uri TEXT,
    actor_key_id TEXT,
    actor_tenant TEXT NOT NULL,
    actor_project TEXT,
    owner_tenant TEXT,
    owner_project TEXT
);
CREATE INDEX IF NOT EXISTS registry_audit_owner ON registry_audit (owner_tenant, seq);
CREATE INDEX IF NOT EXISTS registry_audit_actor ON registry_audit (actor_tenant, seq);
-- gap-free, commit-ordered sequences for the outbox and the audit log: the row lock
-- taken by the increment is held to commit, so a reader tailing 'after=N' never
-- sees N+2 committed before N+1.
CREATE TABLE IF NOT EXISTS registry_counter (
    name TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);
INSERT INTO registry_counter (name, value) VALUES ('event', 0) ON CONFLICT (name) DO NOTHING;
INSERT INTO registry_counter (name, value) VALUES ('audit', 0) ON CONFLICT (name) DO NOTHING;
"""


def _statements(script: str, dialect: str) -> list[str]:
    json_type, bool_type = ("JSONB", "BOOLEAN") if dialect == "postgres" else ("TEXT", "INTEGER")
    script = script.replace("{json}", json_type).replace("{bool}", bool_type)
    lines = [ln for ln in script.splitlines() if not ln.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


def instant(dialect: str, ts: datetime) -> Any:
    """A timestamp as the store compares it: timestamptz on Postgres, epoch microseconds on SQLite."""
    if ts.tzinfo is None:
        raise ValueError("instants carry a timezone")
    return ts.astimezone(UTC) if dialect == "postgres" else (ts - _EPOCH) // _MICRO


_TEXT_TS_RE = re.compile(r"^(\d{1,4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?Z$")


def _parse_stored_ts(text: str) -> datetime:
    """A timestamp written by earlier versions (years below 1000 were not zero-padded).
    Anything unreadable becomes the earliest instant: a grant must never outlive a bad date."""
    m = _TEXT_TS_RE.match(text or "")
    try:
        if m:
            y, mo, d, h, mi, sec, frac = m.groups()
            return datetime(
                int(y),
                int(mo),
                int(d),
                int(h),
                int(mi),
                int(sec),
                int((frac or "0").ljust(6, "0")),
                tzinfo=UTC,
            )
    except ValueError:
        pass
    return datetime.min.replace(tzinfo=UTC)


def _v2_grant_instants(tx: Tx) -> None:
    """Grant expiry as an instant (issue 15): timestamptz on Postgres, epoch microseconds on SQLite;
    the ``auth`` counter that invalidates every process's key cache on revocation."""
    ts_type = "TIMESTAMPTZ" if tx.dialect == "postgres" else "INTEGER"
    tx.exec(f"ALTER TABLE registry_grant ADD COLUMN expires_ts {ts_type}")
    for grant_id, text in tx.all(
        "SELECT grant_id, expires_at FROM registry_grant WHERE expires_at IS NOT NULL"
    ):
        ts = _parse_stored_ts(text)
        tx.exec(
            "UPDATE registry_grant SET expires_ts = ?, expires_at = ? WHERE grant_id = ?",
            (instant(tx.dialect, ts), iso(ts), grant_id),
        )
    tx.exec("INSERT INTO registry_counter (name, value) VALUES ('auth', 0) ON CONFLICT (name) DO NOTHING")


# What the actor asked for (the URI as it named it, or the id of a call by id), beside `uri` (the
# resource the decision was about): a caller reading its own denied attempts sees only this (issue 29).
_V3_AUDIT_REQUESTED = "ALTER TABLE registry_audit ADD COLUMN requested TEXT"

# version -> script (SQL text, or a function of a Tx); append new versions, never edit shipped ones
MIGRATIONS: list[str | Callable[[Tx], None]] = [_COMMON_V1, _v2_grant_instants, _V3_AUDIT_REQUESTED]


class Tx:
    """One unit of work on a connection; statements use ``?`` placeholders."""

    def __init__(self, cur: Any, dialect: str):
        self._cur = cur
        self.dialect = dialect

    def _sql(self, sql: str) -> str:
        return _pg_sql(sql) if self.dialect == "postgres" else sql

    def exec(self, sql: str, params: Sequence[Any] = ()) -> int:
        self._cur.execute(self._sql(sql), tuple(params))
        return self._cur.rowcount

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        self._cur.execute(self._sql(sql), tuple(params))
        return self._cur.fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self._cur.execute(self._sql(sql), tuple(params))
        return self._cur.fetchall()

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self._cur.executemany(self._sql(sql), [tuple(r) for r in rows])

    def next_value(self, counter: str) -> int:
        row = self.one(
            "UPDATE registry_counter SET value = value + 1 WHERE name = ? RETURNING value", (counter,)
        )
        assert row is not None, f"counter {counter} missing"
        return int(row[0])


_PG_SQL_CACHE: dict[str, str] = {}


def _pg_sql(sql: str) -> str:
    out = _PG_SQL_CACHE.get(sql)
    if out is None:
        if "%" in sql:
            raise ValueError("literal '%' in SQL text; pass it as a parameter")
        out = sql.replace("?", "%s")
        _PG_SQL_CACHE[sql] = out
    return out


class RegistryStore:
    """Connections and transactions for one registry database."""

    dialect: str
    url: str

    @contextmanager
    def read(self) -> Iterator[Tx]:  # pragma: no cover - abstract
        raise NotImplementedError
        yield

    @contextmanager
    def write(self) -> Iterator[Tx]:  # pragma: no cover - abstract
        raise NotImplementedError
        yield

    def close(self) -> None:
        pass

    def schema_version(self) -> int:
        with self.read() as tx:
            row = tx.one("SELECT MAX(version) FROM registry_schema_version")
        return int(row[0] or 0) if row else 0


class SqliteRegistryStore(RegistryStore):
    dialect = "sqlite"

    def __init__(self, path: str | os.PathLike[str]):
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.url = f"sqlite:///{self.path}"
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=60)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        self._conn.execute("PRAGMA busy_timeout=60000")
        self._migrate()

    def _migrate(self) -> None:
        with self._lock:
            c = self._conn
            c.execute("BEGIN IMMEDIATE")
            try:
                c.execute("CREATE TABLE IF NOT EXISTS registry_schema_version (version INTEGER NOT NULL)")
                current = c.execute("SELECT MAX(version) FROM registry_schema_version").fetchone()[0] or 0
                for version, script in enumerate(MIGRATIONS, start=1):
                    if version > current:
                        if callable(script):
                            script(Tx(c.cursor(), "sqlite"))
                        else:
                            for stmt in _statements(script, "sqlite"):
                                c.execute(stmt)
                        c.execute("INSERT INTO registry_schema_version VALUES (?)", (version,))
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise

    @contextmanager
    def read(self) -> Iterator[Tx]:
        with self._lock:
            yield Tx(self._conn.cursor(), "sqlite")

    @contextmanager
    def write(self) -> Iterator[Tx]:
        with self._lock:
            c = self._conn
            c.execute("BEGIN IMMEDIATE")  # take the write lock now: no upgrade deadlocks
            try:
                yield Tx(c.cursor(), "sqlite")
                c.execute("COMMIT")
            except sqlite3.IntegrityError as e:
                c.execute("ROLLBACK")
                raise Conflict(f"conflicts with an existing record: {e}") from e
            except BaseException:
                c.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class PostgresRegistryStore(RegistryStore):
    dialect = "postgres"

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10):
        import psycopg  # noqa: PLC0415
        from psycopg_pool import ConnectionPool  # noqa: PLC0415

        self._psycopg = psycopg
        self.url = url
        dsn = url.replace("postgresql+psycopg://", "postgresql://", 1)
        self._pool = ConnectionPool(
            dsn, min_size=min_size, max_size=max_size, open=True, kwargs={"autocommit": True}
        )
        self._migrate()

    def _migrate(self) -> None:
        with self._pool.connection() as conn, conn.transaction():
            cur = conn.cursor()
            cur.execute("SELECT pg_advisory_xact_lock(7412093561)")  # one migrator at a time
            cur.execute("CREATE TABLE IF NOT EXISTS registry_schema_version (version INTEGER NOT NULL)")
            cur.execute("SELECT MAX(version) FROM registry_schema_version")
            current = cur.fetchone()[0] or 0
            for version, script in enumerate(MIGRATIONS, start=1):
                if version > current:
                    if callable(script):
                        script(Tx(cur, "postgres"))
                    else:
                        for stmt in _statements(script, "postgres"):
                            cur.execute(stmt)
                    cur.execute("INSERT INTO registry_schema_version VALUES (%s)", (version,))

    @contextmanager
    def read(self) -> Iterator[Tx]:
        with self._pool.connection() as conn:
            yield Tx(conn.cursor(), "postgres")

    @contextmanager
    def write(self) -> Iterator[Tx]:
        errors = self._psycopg.errors
        try:
            with self._pool.connection() as conn, conn.transaction():
                yield Tx(conn.cursor(), "postgres")
        except (errors.UniqueViolation, errors.ForeignKeyViolation) as e:
            raise Conflict(f"conflicts with an existing record: {e.diag.message_primary}") from e

    def close(self) -> None:
        self._pool.close()


def default_db_path() -> Path:
    return Path(os.environ.get("NOETL_DAGSTER_HOME", ".noetl")) / "registry.db"


def open_store(url: str | os.PathLike[str] | None = None) -> RegistryStore:
    """``sqlite:///path``, a bare path, ``postgresql://...``; None: the embedded default."""
    if url is None or str(url) == "":
        return SqliteRegistryStore(default_db_path())
    text = str(url)
    if text.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
        return PostgresRegistryStore(text)
    if text.startswith("sqlite:///"):
        return SqliteRegistryStore(text[len("sqlite:///") :])
    if text.startswith("sqlite://"):
        return SqliteRegistryStore(text[len("sqlite://") :] or ":memory:")
    if "://" in text:
        raise ValueError(f"unsupported registry database URL: {text!r} (sqlite:///path or postgresql://...)")
    return SqliteRegistryStore(text)
