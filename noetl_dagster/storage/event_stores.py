"""``open_event_store``: an EventStore adapter chosen by URL."""

from __future__ import annotations

import os
import re
from pathlib import Path

from noetl_dagster.engine.ports import EventStore
from noetl_dagster.storage.local_mode import local_root


def open_event_store(url: str | None = None, *, data_dir: str | os.PathLike[str] | None = None) -> EventStore:
    """Open an EventStore by URL: ``sqlite:///path``, a bare path, ``postgresql://...`` or
    ``nats://host:4222?projection=<postgresql URL>&payload=<payload URL>`` (storage/nats_events.py).

    Any other scheme (``mysql://``...) is refused with ValueError, so is a bare
    string that is not a SQLite file path. Without a URL: ``$NOETL_EVENT_STORE_URL``, else SQLite at ``<data_dir>/events.db``,
    read together with the local executions under ``<data_dir>/local`` when there are any
    (storage/local_mode.py; new executions still go to SQLite: only ``run`` writes locally).
    """
    url = url or os.environ.get("NOETL_EVENT_STORE_URL") or None
    # imported here: a local-mode run (storage/local_mode.py) loads no sqlite3
    from noetl_dagster.storage.events import SqliteEventStore  # noqa: PLC0415

    if not url:
        base = Path(data_dir or os.environ.get("NOETL_DAGSTER_HOME", ".noetl"))
        if local_root(data_dir).is_dir():  # local executions (``run``'s default) are read beside stored ones
            from noetl_dagster.storage.local_mode import open_reader  # noqa: PLC0415

            return open_reader(data_dir)
        return SqliteEventStore(base / "events.db")
    if url.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
        # imported here so SQLite users never load psycopg
        from noetl_dagster.storage.postgres_events import PostgresEventStore  # noqa: PLC0415

        return PostgresEventStore(url)
    if url.startswith(("nats://", "tls://")):
        # imported here so SQLite and Postgres users never load nats-py
        from noetl_dagster.storage.nats_events import NatsEventStore  # noqa: PLC0415

        return NatsEventStore(url)
    if url.startswith("local://"):  # the local mode's folder of executions (run's default, issue 46)
        from noetl_dagster.storage.feather_events import FeatherEventStore  # noqa: PLC0415

        return FeatherEventStore(url[len("local://") :] or local_root(data_dir))
    if url.startswith("sqlite:///"):
        return SqliteEventStore(_sqlite_path(url[len("sqlite:///") :], url))
    if url.startswith("sqlite://"):
        return SqliteEventStore(_sqlite_path(url[len("sqlite://") :], url) or ":memory:")
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", url) and not re.match(r"^[A-Za-z]:[\\/]", url):
        raise ValueError(
            f"unsupported event store URL {_scheme(url)}: use sqlite:///path, postgresql://..., "
            "nats://...?projection=postgresql... or local:///dir"
        )
    if not (url.endswith((".db", ".sqlite", ".sqlite3")) or Path(url).is_file()):
        raise ValueError(
            f"event store {url!r} is neither a URL nor a SQLite file path (*.db, *.sqlite, an existing file)"
        )
    return SqliteEventStore(_sqlite_path(url, url))


def _scheme(url: str) -> str:
    return repr(url.split(":", 1)[0] + "://...")


def _sqlite_path(path: str, url: str) -> str:
    """Refuse what SQLite cannot open as a database file, with one clear message."""
    if path in ("", ":memory:"):
        return path
    if any(ord(c) < 32 for c in path):
        raise ValueError("event store path contains control characters")
    if Path(path).is_dir():
        raise ValueError(f"event store {path!r} is a directory, not a SQLite file")
    return path
