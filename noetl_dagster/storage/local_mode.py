"""The local mode (issue 46, seed 004 H.11): where ``run`` writes by default, how readers see a local
execution beside stored ones, and ``push`` of a local execution into SQLite or Postgres.

:class:`LocalFirstStore` is what ``open_event_store`` gives without a URL: executions found under
the local root (``<data dir>/local``, ``$NOETL_LOCAL_DIR``) are read from their Feather files, every
other one from the stored log (SQLite at ``<data dir>/events.db``, opened only when asked), so
``events``, ``explain``, ``replay``, ``resume``, ``archive``, ``verify`` and the explorer read a local
execution as a stored one. New executions are written locally."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from noetl_dagster.engine.chain import check_chain
from noetl_dagster.engine.events import Event
from noetl_dagster.engine.ports import EventStore, ExecutionInfo, StoredEvent
from noetl_dagster.storage.feather_events import FeatherEventStore


def local_root(data_dir: str | os.PathLike[str] | None = None) -> Path:
    env = os.environ.get("NOETL_LOCAL_DIR")
    if env:
        return Path(env)
    return Path(data_dir or os.environ.get("NOETL_DAGSTER_HOME", ".noetl")) / "local"


class LocalFirstStore(EventStore):
    """Local executions from their files, the rest from ``stored`` (made on first use)."""

    def __init__(self, local: FeatherEventStore, stored: Callable[[], EventStore],
                 stored_exists: Callable[[], bool] = lambda: True, *, write_local: bool = True):  # fmt: skip
        self.local = local
        self.write_local = write_local  # new executions: local (run's default), else the stored log
        self._make_stored = stored
        self._stored_exists = stored_exists  # False: no stored log yet, so nothing to look up or create
        self._stored: EventStore | None = None
        self._home: dict[str, EventStore] = {}

    @property
    def url(self) -> str:  # type: ignore[override]
        return self.local.url if self.write_local else self.stored.url

    @property
    def buffers_appends(self) -> bool:  # type: ignore[override]
        return self.write_local

    @property
    def stored(self) -> EventStore:
        if self._stored is None:
            self._stored = self._make_stored()
        return self._stored

    def _for(self, execution_id: str) -> EventStore:
        """Where the execution lives: its local folder, else the stored log; a new one is local."""
        home = self._home.get(execution_id)
        if home is None:
            if self.local.has(execution_id):
                home = self.local
            elif (self._stored is not None or self._stored_exists()) and self.stored.read_range(
                execution_id, 0, 1
            ):
                home = self.stored
            else:  # not known anywhere (yet): where new executions go
                return self.local if self.write_local else self.stored
            self._home[execution_id] = home
        return home

    def append(self, events: Sequence[Event]) -> list[Event]:
        by: dict[int, tuple[EventStore, list[Event]]] = {}
        for ev in events:
            store = self._for(ev.execution_id)
            by.setdefault(id(store), (store, []))[1].append(ev)
        for store, evs in by.values():
            store.append(evs)
        return list(events)

    def barrier(self, durable: bool = True) -> None:
        self.local.barrier(durable)
        if self._stored is not None:
            self._stored.barrier(durable)

    def read(self, execution_id: str, after_sequence: int = 0) -> list[Event]:
        return self._for(execution_id).read(execution_id, after_sequence)

    def read_range(self, execution_id: str, after_sequence: int, until_sequence: int) -> list[Event]:
        return self._for(execution_id).read_range(execution_id, after_sequence, until_sequence)

    def read_chained(self, execution_id: str) -> list[tuple[int, Event | None, bytes | None]]:
        return self._for(execution_id).read_chained(execution_id)

    def summary(self, execution_id: str) -> tuple[int, list[tuple[int, Any]]] | None:
        store = self._for(execution_id)
        return None if store is self.local else store.summary(execution_id)

    def put_summary(
        self, execution_id: str, after: int | None, last: int, rows: list[tuple[int, str]]
    ) -> bool:
        store = self._for(execution_id)
        return False if store is self.local else store.put_summary(execution_id, after, last, rows)

    def _has_stored(self) -> bool:
        """A reader opens (and so creates) no stored log that does not exist yet."""
        return self._stored is not None or self._stored_exists()

    def tail(self, after_gid: int = 0, limit: int = 1000) -> list[StoredEvent]:
        return self.stored.tail(after_gid, limit) if self._has_stored() else []

    def tail_last(self) -> int:
        return self.stored.tail_last() if self._has_stored() else 0

    def executions(self, limit: int = 100) -> list[ExecutionInfo]:
        out = {i.execution_id: i for i in self.stored.executions(limit)} if self._has_stored() else {}
        out.update({i.execution_id: i for i in self.local.executions(limit)})
        return sorted(out.values(), key=lambda i: i.started_at or "", reverse=True)[:limit]

    def acquire_lease(self, execution_id: str) -> None:
        self._for(execution_id).acquire_lease(execution_id)

    def release_lease(self, execution_id: str) -> None:
        self.local.release_lease(execution_id)
        if self._stored is not None:
            self._stored.release_lease(execution_id)

    def close(self) -> None:
        self.local.close()
        if self._stored is not None:
            self._stored.close()


def _home(data_dir: str | os.PathLike[str] | None) -> Path:
    return Path(data_dir or os.environ.get("NOETL_DAGSTER_HOME", ".noetl"))


def _sqlite_at(db: Path) -> Callable[[], EventStore]:
    """The SQLite store at ``db``, opened (and ``sqlite3`` and the SQLite store imported, ~5 ms of a
    one-step run's start-up) only when the local-first store needs it."""

    def open_sqlite() -> EventStore:
        from noetl_dagster.storage.events import SqliteEventStore  # noqa: PLC0415 - not for a local run

        return SqliteEventStore(db)

    return open_sqlite


def open_reader(data_dir: str | os.PathLike[str] | None = None) -> LocalFirstStore:
    """The default store once local executions exist: both kinds read, new executions stored in SQLite
    (the Dagster runner and the Python API keep committing per step)."""
    db = _home(data_dir) / "events.db"
    return LocalFirstStore(
        FeatherEventStore(local_root(data_dir)), _sqlite_at(db), db.exists, write_local=False
    )


def open_local_run(url: str | None, data_dir: str | os.PathLike[str] | None,
                   opener: Callable[[str], EventStore], *, durable: bool = False) -> LocalFirstStore:  # fmt: skip
    """``run``'s store: new executions local; ``url`` (opened by ``opener``; else SQLite at <data
    dir>/events.db) for one resumed from there, opened only when needed (a local run opens no SQLite)."""
    root = FeatherEventStore(local_root(data_dir), durable=durable)
    if url:
        return LocalFirstStore(root, lambda: opener(url))
    db = _home(data_dir) / "events.db"
    return LocalFirstStore(root, _sqlite_at(db), db.exists)


class PushRefused(RuntimeError):
    """The local execution cannot be pushed (altered, unknown, or the target holds something else)."""


def family(local: FeatherEventStore, execution_id: str) -> list[str]:
    """The execution and its local sub-playbook executions (children first found by metadata)."""
    out, todo = [], [execution_id]
    kids: dict[str, list[str]] = {}
    for eid in local.execution_ids():
        parent = local.metadata(eid).get("parent_execution_id")
        if parent:
            kids.setdefault(parent, []).append(eid)
    while todo:
        eid = todo.pop()
        out.append(eid)
        todo += kids.get(eid, [])
    return out


def push(local: FeatherEventStore, execution_ids: Sequence[str], target: EventStore) -> int:
    """Append local executions to ``target`` in one append (one transaction on SQLite and Postgres).
    Idempotent: events the target holds already keep their place (skipped by ``event_id``). Each
    local chain is checked first and the target's after (an altered copy is refused, never stored).
    Returns the number of events pushed or already there; records the push in metadata.json."""
    copies: list[Event] = []
    want: list[tuple[str, int | None]] = []
    for eid in execution_ids:
        entries = local.read_chained(eid)
        if not entries:
            raise PushRefused(f"no local execution {eid} under {local.root}")
        check_chain(eid, entries).raise_if_broken(f" (local folder {local.root / eid})")
        events = [e for _s, e, _h in entries if e is not None]
        held = target.read(eid)
        # the same events, not only the same ids: a copy of the folder resumed elsewhere numbers and
        # names its events as this one does (derived ids), so ids alone cannot tell two histories apart
        if [e.to_stored() for e in held] != [e.to_stored() for e in events[: len(held)]]:
            raise PushRefused(f"execution {eid}: {target.url} holds other events of it; nothing pushed")
        want += [(e.event_id, e.sequence) for e in events]
        for e in events:
            c = Event.from_dict(e.to_dict())
            c.sequence = None
            copies.append(c)
    target.append(copies)
    if [(c.event_id, c.sequence) for c in copies] != want:  # another writer appended meanwhile
        raise PushRefused(f"{target.url} numbered the pushed events differently (written to meanwhile)")
    for eid in execution_ids:
        check_chain(eid, target.read_chained(eid)).raise_if_broken(f" in {target.url}")
        local.mark_pushed(eid, target.url, local.metadata(eid).get("events") or 0)
    return len(copies)
