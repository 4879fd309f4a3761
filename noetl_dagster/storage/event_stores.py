"""``open_event_store``: an EventStore adapter chosen by URL."""

from __future__ import annotations

import os
from pathlib import Path

from noetl_dagster.engine.ports import EventStore
from noetl_dagster.storage.events import SqliteEventStore


def open_event_store(url: str | None = None, *, data_dir: str | os.PathLike[str] | None = None) -> EventStore:
    """Open an EventStore by URL: ``sqlite:///path``, a bare path, or ``postgresql://...``.

    Without a URL: ``$NOETL_EVENT_STORE_URL``, else SQLite at ``<data_dir>/events.db``.
    """
    url = url or os.environ.get("NOETL_EVENT_STORE_URL") or None
    if not url:
        base = Path(data_dir or os.environ.get("NOETL_DAGSTER_HOME", ".noetl"))
        return SqliteEventStore(base / "events.db")
    if url.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
        # imported here so SQLite users never load psycopg
        from noetl_dagster.storage.postgres_events import PostgresEventStore  # noqa: PLC0415

        return PostgresEventStore(url)
    if url.startswith("sqlite:///"):
        return SqliteEventStore(url[len("sqlite:///") :])
    if url.startswith("sqlite://"):
        return SqliteEventStore(url[len("sqlite://") :] or ":memory:")
    return SqliteEventStore(url)
