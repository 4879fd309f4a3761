"""The facts store: a ClickHouse database reached through clickhouse-connect.

One code path for both deployments: ``chdb:///<dir>`` runs a real ClickHouse
engine in-process (the embedded default, under ``$NOETL_DAGSTER_HOME/facts`` or
``./.noetl/facts``); ``http(s)://user:pass@host:8123`` reaches a server.

chdb hosts one engine per process and one process per path, so clients are
kept in a module-level cache (one per URL); opening a different chdb path
closes the cached ones first, and :meth:`FactsStore.release` lets a
long-running process (the Dagster sensor) free the path between ticks. The
process that opens a chdb path holds its owner file
(:mod:`noetl_analytics.store_owner`) until it releases the path, so another
process is told who holds it (and can hand its export to a serving owner).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import clickhouse_connect
import pyarrow as pa
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ProgrammingError

from noetl_analytics import store_owner
from noetl_analytics.schema import apply_migrations

DEFAULT_DATABASE = "noetl"
# no leading underscore: the views alias their tables as _name
_DB_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")

# Every read collapses rows re-sent by the exporter (ReplacingMergeTree + FINAL).
_CLIENT_SETTINGS = {"final": 1}

_clients: dict[str, Client] = {}
_owned: dict[str, store_owner.OwnerLock] = {}  # chdb URL -> this process's hold on its path
_lock = threading.RLock()


class FactsStoreError(RuntimeError):
    """The facts store cannot be opened or used (clear message for the CLI)."""


class FactsStoreHeld(FactsStoreError):
    """Another live process holds the embedded store (``holder`` names it)."""

    def __init__(self, held: store_owner.StoreHeld):
        super().__init__(str(held))
        self.path, self.holder = held.path, held.holder


def default_facts_url(data_dir: str | os.PathLike[str] | None = None) -> str:
    base = Path(data_dir or os.environ.get("NOETL_DAGSTER_HOME") or ".noetl")
    return f"chdb://{(base / 'facts').resolve()}"


def resolve_facts_url(url: str | None = None, data_dir: str | os.PathLike[str] | None = None) -> str:
    """``url`` > ``$NOETL_CLICKHOUSE_URL`` > embedded chdb under the data dir."""
    url = url or os.environ.get("NOETL_CLICKHOUSE_URL") or os.environ.get("NOETL_DAGSTER_CLICKHOUSE_URL")
    if not url:
        return default_facts_url(data_dir)
    if url.startswith("chdb://"):
        path = url[len("chdb://") :]
        if path in ("", "memory", ":memory:", "/:memory:"):
            return "chdb://:memory:"
        return "chdb://" + str(Path(path).resolve())
    if url.startswith(("http://", "https://", "clickhouse://", "clickhouses://")):
        return url
    raise FactsStoreError(
        f"unsupported facts store URL {url!r}: use chdb:///<dir> (embedded) or http(s)://host:8123 (server)"
    )


def _is_chdb(url: str) -> bool:
    return url.startswith("chdb://")


def _chdb_wait() -> float:
    return float(os.environ.get("NOETL_DAGSTER_CHDB_WAIT", "10"))


def _hold(url: str) -> None:
    """Take the owner file of a chdb path before opening it (once per process and path)."""
    path = url[len("chdb://") :]
    if path == ":memory:" or url in _owned:
        return
    try:
        _owned[url] = store_owner.take(path, _chdb_wait())
    except store_owner.StoreHeld as e:
        raise FactsStoreHeld(e) from None


def owner_lock(url: str) -> store_owner.OwnerLock | None:
    """This process's hold on the chdb path of ``url`` (None: not held here, or not chdb)."""
    return _owned.get(url)


def _open(url: str) -> Client:
    if _is_chdb(url):
        path = url[len("chdb://") :]
        if path != ":memory:":
            Path(path).mkdir(parents=True, exist_ok=True)
        _hold(url)
        # a process that does not take the owner file (an older version) may still hold the path
        deadline = time.monotonic() + _chdb_wait()
        while True:
            try:
                return clickhouse_connect.get_client(
                    interface="chdb", path=None if path == ":memory:" else path, settings=_CLIENT_SETTINGS
                )
            except ProgrammingError as e:
                if time.monotonic() >= deadline:
                    _let_go(url)
                    raise FactsStoreError(
                        f"cannot open the embedded facts store at {path}: {e}. chdb allows one process per"
                        " path and a process that does not write the owner file holds it; stop it or use a"
                        " ClickHouse server URL"
                    ) from e
                time.sleep(0.2)
    try:
        # the database named in the URL path is the facts database (created by the migrations),
        # so the client connects without one
        parts = urlsplit(url)
        return clickhouse_connect.get_client(
            dsn=urlunsplit(parts._replace(path="")), settings=_CLIENT_SETTINGS
        )
    except Exception as e:  # noqa: BLE001 - surface any connect failure with the URL
        raise FactsStoreError(f"cannot connect to ClickHouse at {_redact(url)}: {e}") from e


def _redact(url: str) -> str:
    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", url)


def get_client(url: str) -> Client:
    """The process-wide client for ``url`` (a resolved URL)."""
    with _lock:
        client = _clients.get(url)
        if client is not None:
            return client
        if _is_chdb(url):
            # one chdb engine per process: release any other path first
            for other in [u for u in _clients if _is_chdb(u)]:
                _close(other)
                _let_go(other)
        client = _open(url)
        _clients[url] = client
        return client


def _close(url: str) -> None:
    client = _clients.pop(url, None)
    if client is not None:
        try:
            client.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass


def _let_go(url: str) -> None:
    lock = _owned.pop(url, None)
    if lock is not None:
        lock.release()


def close_all() -> None:
    with _lock:
        for url in list(_clients):
            _close(url)
        for url in list(_owned):
            _let_go(url)


class FactsStore:
    """A facts database (``noetl`` by default) in ClickHouse."""

    def __init__(
        self,
        url: str | None = None,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        database: str | None = None,
        migrate: bool = True,
    ):
        self.url = resolve_facts_url(url, data_dir)
        in_url = urlsplit(self.url).path.strip("/") if not _is_chdb(self.url) else ""
        self.database = database or in_url or os.environ.get("NOETL_DAGSTER_FACTS_DB") or DEFAULT_DATABASE
        if not _DB_NAME.match(self.database):
            raise FactsStoreError(f"invalid ClickHouse database name {self.database!r}")
        self._migrated = False
        if migrate:
            self.migrate()

    @property
    def client(self) -> Client:
        return get_client(self.url)

    @property
    def embedded(self) -> bool:
        return _is_chdb(self.url)

    def migrate(self) -> list[int]:
        applied = apply_migrations(self.client, self.database)
        self._migrated = True
        return applied

    def table(self, name: str) -> str:
        return f"{self.database}.{name}"

    def sql(self, text: str) -> str:
        """Qualify ``$db.`` placeholders with this store's database."""
        return text.replace("$db", self.database)

    def command(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        return self.client.command(self.sql(sql), parameters=parameters)

    def query(
        self, sql: str, parameters: dict[str, Any] | None = None, *, readonly: bool = False
    ) -> tuple[list[str], list[tuple]]:
        # readonly: ClickHouse itself refuses writes, DDL, OPTIMIZE and SYSTEM (setting readonly=1)
        settings = {"readonly": 1} if readonly else None
        try:
            result = self.client.query(self.sql(sql), parameters=parameters, settings=settings)
        finally:
            if readonly and _is_chdb(self.url):
                # chdb applies the setting to its session and cannot undo it (readonly forbids
                # changing readonly): drop that session, the next call opens a fresh one
                with _lock:
                    _close(self.url)
        return list(result.column_names), [tuple(r) for r in result.result_rows]

    def query_dicts(self, sql: str, parameters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        cols, rows = self.query(sql, parameters)
        return [dict(zip(cols, r, strict=True)) for r in rows]

    def scalar(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        _, rows = self.query(sql, parameters)
        return rows[0][0] if rows else None

    def insert_arrow(self, table: str, data: pa.Table) -> None:
        if data.num_rows:
            self.client.insert_arrow(self.table(table), data)

    def insert_rows(self, table: str, rows: Sequence[Sequence[Any]], columns: Sequence[str]) -> None:
        if rows:
            self.client.insert(self.table(table), list(rows), column_names=list(columns))

    def release(self) -> None:
        """Close this store's client so another process may open the chdb path."""
        with _lock:
            _close(self.url)
            _let_go(self.url)

    def __enter__(self) -> FactsStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"FactsStore({_redact(self.url)!r}, database={self.database!r})"
