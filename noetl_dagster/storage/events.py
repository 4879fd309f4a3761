"""The SQLite EventStore adapter (the embedded default) and ``open_event_store``.

The store is append-only (triggers refuse UPDATE/DELETE), idempotent on
``event_id`` (a re-sent event is dropped, never duplicated) and assigns a
gap-free ``sequence`` per execution inside the write transaction, so several
processes may append to one execution. ``gid`` is a global, monotonically
increasing cursor used by sensors and exporters to tail the log.

Layout (issue 19): a small batch is one ``noetl_event`` row per event; a batch of at least
``SEGMENT_MIN`` (256, ``$NOETL_EVENT_SEGMENT_MIN``; 0 turns segments off) new events of one
execution - a loop's iterations between two flushes - is one ``noetl_event_segment`` row: a
zstd-compressed columnar body with consecutive sequences and gids (~30 bytes per event instead of
~720). Readers merge both tables; every event reads back exactly as appended.

Durability (the fsync policy): WAL journal with ``synchronous=NORMAL``. An append is one
transaction; once it returns, its events survive the death of the process (kill -9) - the
recorder appends at each step's routing and every 2,000 events inside a loop, so a killed run
loses at most the step (or loop iterations) in flight, which resume runs again. SQLite syncs
the WAL to disk at each checkpoint, not at each commit: an OS crash or power loss may lose the
transactions since the last checkpoint, never corrupt the file. A commit costs no fsync.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import zstandard

from noetl_dagster.engine.events import ENTITY_OF, ENVELOPE_COLUMNS, SCHEMA_VERSION, SERVER_EVENTS, Event
from noetl_dagster.engine.explain_summary import SummaryCache
from noetl_dagster.engine.ports import EventStore, ExecutionInfo, ExecutionLeased, StoredEvent
from noetl_dagster.engine.recorder import MAX_EVENT_BYTES, check_event_size
from noetl_dagster.util.jsonutil import dumps, loads, replace_lone_surrogates
from noetl_dagster.util.procs import pid_alive

# One list of statements per schema version; applied in order, recorded in noetl_schema_version.
SQLITE_MIGRATIONS: list[list[str]] = [
    [
        # gid: assigned by the store (see SqliteEventStore._top_gid); files created before issue 19
        # have AUTOINCREMENT here, which costs a sqlite_sequence write per append and changes nothing else
        """CREATE TABLE IF NOT EXISTS noetl_event (
            gid INTEGER PRIMARY KEY,
            event_id TEXT NOT NULL UNIQUE,
            execution_id TEXT NOT NULL,
            sequence INTEGER NOT NULL,
            name TEXT NOT NULL,
            ts TEXT NOT NULL,
            body TEXT NOT NULL,
            UNIQUE (execution_id, sequence))""",
        """CREATE TABLE IF NOT EXISTS noetl_execution (
            execution_id TEXT PRIMARY KEY,
            playbook TEXT,
            status TEXT NOT NULL,
            parent_execution_id TEXT,
            started_at TEXT,
            finished_at TEXT,
            last_sequence INTEGER NOT NULL DEFAULT 0)""",
        """CREATE TRIGGER IF NOT EXISTS noetl_event_no_update BEFORE UPDATE ON noetl_event
            BEGIN SELECT RAISE(ABORT, 'noetl_event is append-only'); END""",
        """CREATE TRIGGER IF NOT EXISTS noetl_event_no_delete BEFORE DELETE ON noetl_event
            BEGIN SELECT RAISE(ABORT, 'noetl_event is append-only'); END""",
    ],
    [  # 2: per-execution leases (a second ``resume`` of one execution is refused)
        """CREATE TABLE IF NOT EXISTS noetl_lease (
            execution_id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            host TEXT NOT NULL,
            pid INTEGER NOT NULL,
            expires_at REAL NOT NULL)""",
    ],
    [  # 3: event segments (issue 19): a big batch of one execution's events as one compressed row
        """CREATE TABLE IF NOT EXISTS noetl_event_segment (
            gid_last INTEGER PRIMARY KEY,
            gid_first INTEGER NOT NULL,
            execution_id TEXT NOT NULL,
            seq_first INTEGER NOT NULL,
            seq_last INTEGER NOT NULL,
            body BLOB NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS noetl_event_segment_exec ON noetl_event_segment (execution_id, seq_last)",
        # the id (16 bytes, see event_key) -> sequence of every event stored in a segment: appends stay
        # idempotent (rows have noetl_event's UNIQUE event_id)
        """CREATE TABLE IF NOT EXISTS noetl_event_key (
            k BLOB PRIMARY KEY,
            sequence INTEGER NOT NULL) WITHOUT ROWID""",
        """CREATE TRIGGER IF NOT EXISTS noetl_event_segment_no_update BEFORE UPDATE ON noetl_event_segment
            BEGIN SELECT RAISE(ABORT, 'noetl_event_segment is append-only'); END""",
        """CREATE TRIGGER IF NOT EXISTS noetl_event_segment_no_delete BEFORE DELETE ON noetl_event_segment
            BEGIN SELECT RAISE(ABORT, 'noetl_event_segment is append-only'); END""",
    ],
    [  # 4: the execution summary (issue 36, engine/explain_summary.py): derived from the log, written with it
        """CREATE TABLE IF NOT EXISTS noetl_explain (
            execution_id TEXT NOT NULL,
            ord INTEGER NOT NULL,
            last_sequence INTEGER NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (execution_id, ord)) WITHOUT ROWID""",
    ],
]

log = logging.getLogger("noetl_dagster.storage")

# noetl_event's columns holding an event's ENVELOPE_COLUMNS (in that order): readers select them
# beside the body, which since issue 19 leaves them out
_ROW_ENVELOPE = "event_id, execution_id, sequence, name, ts"


class EventStoreTooNew(RuntimeError):
    """The store's schema is newer than this version knows: it was written by a newer noetl-dagster,
    and appending with an older one could break what the newer layout relies on (e.g. gid order)."""


def refuse_newer_schema(current: int, known: int, where: str) -> None:
    if current > known:
        raise EventStoreTooNew(
            f"the event store {where} has schema version {current}; this noetl-dagster knows up to {known}"
            " (the store was written by a newer version): upgrade noetl-dagster to use it"
        )


def _clean(value: Any) -> Any:
    """Lone surrogates replaced by U+FFFD (the rule the recorder applies before an event exists, see
    util.jsonutil), so nothing read back from the store can fail to encode as UTF-8 later (output,
    archives, exporters), rows written before that rule included."""
    return replace_lone_surrogates(value)


def decode_body(
    body: Any, where: str, skipped: list[tuple[str, str]] | None = None, columns: Sequence[Any] | None = None
) -> Event | None:
    """One stored row → Event, or None (logged, and added to ``skipped``) when the row cannot be decoded.
    ``columns``: the row's ``ENVELOPE_COLUMNS`` values, for a body written without them (SQLite rows
    since issue 19; a body that has them, as older rows do, keeps its own).

    Readers skip and report a bad row rather than fail: one corrupt execution must not stop
    ``events``/``replay`` of the rest of its log, nor the facts or lineage exports of every other one."""
    try:
        try:
            raw = loads(body)
        except ValueError:  # orjson refuses lone-surrogate escapes the stdlib writer produces
            raw = _clean(json.loads(body))
        if columns is not None and type(raw) is dict and "event_id" not in raw:
            raw.update(zip(ENVELOPE_COLUMNS, columns, strict=True))
        return Event.from_dict(raw)
    except Exception as e:  # noqa: BLE001 - any undecodable row is skipped, never fatal
        msg = f"{type(e).__name__}: {str(e)[:200]}"
        log.warning("skipping undecodable event row %s: %s", where, msg)
        if skipped is not None:
            skipped.append((where, msg))
        return None


LEASE_TTL = float(os.environ.get("NOETL_LEASE_TTL", "60"))


def _execution_update(ev: Event) -> tuple[str | None, str | None, str | None]:
    """(playbook, status, finished_at) implied by an event, for the executions index."""
    if ev.name == "playbook.execution.requested":
        return ev.data.get("playbook"), "requested", None
    if ev.name == "workflow.started":
        return None, "running", None
    if ev.name == "workflow.finished":
        return None, ev.data.get("status", "completed"), ev.timestamp
    return None, None, None


_EXECUTION_EVENTS = frozenset({"playbook.execution.requested", "workflow.started", "workflow.finished"})


def sequence_batch(
    events: Sequence[Event], existing: dict[str, int], last_sequence: Callable[[str], int], *, encode: bool = True
) -> tuple[list[tuple[Any, ...]], dict[str, int], dict[str, list[Any]]]:
    """Number a batch inside the adapter's write transaction (shared by every adapter).

    Events already stored keep their sequence; the rest continue each execution's
    sequence (``last_sequence(execution_id)`` is asked once per execution). Returns
    the rows to insert, the last sequence per execution and the executions-index
    updates ``{id: [playbook, status, finished_at, parent, started_at]}``. Without ``encode`` a row
    ends with the Event itself instead of its JSON body (the caller encodes it its own way)."""
    next_seq: dict[str, int] = {}
    rows: list[tuple[Any, ...]] = []
    exec_updates: dict[str, list[Any]] = {}
    for ev in events:
        if ev.event_id in existing:
            ev.sequence = existing[ev.event_id]
            continue
        eid = ev.execution_id
        if eid not in next_seq:
            next_seq[eid] = last_sequence(eid)
        next_seq[eid] += 1
        ev.sequence = next_seq[eid]
        existing[ev.event_id] = ev.sequence
        rows.append((ev.event_id, eid, ev.sequence, ev.name, ev.timestamp, dumps(ev.to_stored()) if encode else ev))
        upd = exec_updates.get(eid)
        if upd is None:
            upd = exec_updates[eid] = [None, None, None, ev.parent_execution_id, ev.timestamp]
        if ev.name not in _EXECUTION_EVENTS:
            continue
        pb, status, fin = _execution_update(ev)
        if pb:
            upd[0] = pb
        if status:
            upd[1] = status
        if fin:
            upd[2] = fin
    return rows, next_seq, exec_updates


def event_key(event_id: str) -> bytes:
    """The 16 bytes ``noetl_event_key`` indexes an event id by (idempotent appends): a UUID's own
    bytes (uuid7 ids are time-ordered, so new keys land at the end of the B-tree and a commit
    dirties few pages), else a 16-byte digest of the id."""
    s = str(event_id)
    if len(s) == 36 and s[8] == s[13] == s[18] == s[23] == "-" and s == s.lower():  # one spelling per key
        try:
            return bytes.fromhex(s.replace("-", ""))
        except ValueError:
            pass
    return hashlib.blake2b(s.encode("utf-8", "surrogatepass"), digest_size=16).digest()


# A batch of at least this many new events of one execution is stored as one segment row (issue 19).
SEGMENT_MIN = int(os.environ.get("NOETL_EVENT_SEGMENT_MIN", "256") or 0)


# The columns of a segment body: every envelope field but the two the segment row holds
# (execution_id; sequence = seq_first + position). One list per field, in event order.
_SEGMENT_COLUMNS = ("event_id", "timestamp", "name", "data", "status", "entity_id", "step", "step_run_id",
                    "task_run_id", "loop_id", "iteration", "attempt", "parent_execution_id", "tenant_id",
                    "project_id", "source", "entity", "schema_version")  # fmt: skip
_SEGMENT_DEFAULTS = {"status": "success", "tenant_id": "default", "project_id": "default", "schema_version": SCHEMA_VERSION}
_DERIVED = ("source", "entity")  # derived from the name unless set otherwise


def encode_segment(events: Sequence[Event], compressor: Any) -> bytes:
    """zstd of a columnar JSON object ``{"n": count, "c": {field: [value per event]}}``: a column
    whose values are all None (or all the default) is left out; ``source``/``entity`` only when some
    event's differs from what its name implies. Columns compress far better than per-event objects
    and cost no dict per event to build."""
    cols: dict[str, list[Any]] = {}
    for f in _SEGMENT_COLUMNS:
        vals = [getattr(e, f) for e in events]
        if f in _DERIVED:
            implied = [_implied(f, e.name) for e in events]
            if vals == implied:
                continue
        elif f in _SEGMENT_DEFAULTS:
            if all(v == _SEGMENT_DEFAULTS[f] for v in vals):
                continue
        elif f == "data":
            if not any(vals):
                continue
        elif all(v is None for v in vals):
            continue
        cols[f] = vals
    text = dumps({"n": len(events), "c": cols})
    if len(text) > MAX_EVENT_BYTES:  # rare: find the event over the limit (each is checked before any write)
        for e in events:
            check_event_size(e, len(dumps(e.to_stored())))
    return compressor.compress(text.encode("utf-8", "surrogatepass"))


def _implied(field_name: str, name: str) -> str:
    if field_name == "source":
        return "server" if name in SERVER_EVENTS else "worker"
    return ENTITY_OF.get(name, "workflow")


def _segment_items(doc: Any) -> list[dict[str, Any]]:
    """A decoded segment body as one dict per event (columnar, or a list of stored forms)."""
    if isinstance(doc, list):
        return doc
    n, cols = int(doc["n"]), doc["c"]
    items: list[dict[str, Any]] = [{} for _ in range(n)]
    for f, vals in cols.items():
        if len(vals) != n:
            raise ValueError(f"segment column {f!r} has {len(vals)} values for {n} events")
        for d, v in zip(items, vals, strict=True):
            d[f] = v
    return items


def decode_segment(
    body: bytes, execution_id: str, seq_first: int, gid_first: int, where: str,
    skipped: list[tuple[str, str]] | None = None,
) -> list[tuple[int, Event]]:  # fmt: skip
    """One segment row -> [(gid, Event)], in order; an undecodable segment or item is skipped and reported."""
    try:
        raw = zstandard.ZstdDecompressor().decompress(body)
        try:
            doc = loads(raw)
        except ValueError:  # lone surrogates written by the stdlib fallback (see decode_body)
            doc = _clean(json.loads(raw.decode("utf-8", "surrogatepass")))
        items = _segment_items(doc)
    except Exception as e:  # noqa: BLE001 - a corrupt segment is skipped, never fatal
        msg = f"{type(e).__name__}: {str(e)[:200]}"
        log.warning("skipping undecodable event segment %s: %s", where, msg)
        if skipped is not None:
            skipped.append((where, msg))
        return []
    out: list[tuple[int, Event]] = []
    for i, d in enumerate(items):
        try:
            d["execution_id"], d["sequence"] = execution_id, seq_first + i
            out.append((gid_first + i, Event.from_dict(d)))
        except Exception as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {str(e)[:200]}"
            log.warning("skipping undecodable event row %s#%d: %s", where, i, msg)
            if skipped is not None:
                skipped.append((f"{where}#{i}", msg))
    return out


def summary_rows(c: sqlite3.Connection, execution_id: str) -> tuple[int, list[tuple[int, Any]]] | None:
    """(the summary's last sequence, its rows) as stored, or None."""
    rows = c.execute("SELECT ord, last_sequence, body FROM noetl_explain WHERE execution_id = ? ORDER BY ord",
                     (execution_id,)).fetchall()  # fmt: skip
    if not rows or rows[0][0] != 0:
        return None
    return int(rows[0][1]), [(r[0], r[2]) for r in rows]


class _SqliteSummaries:
    """SqliteEventStore's execution summaries (engine/explain_summary.py) and ranged reads."""

    _conn: sqlite3.Connection
    _lock: threading.RLock
    _summaries: SummaryCache
    skipped: list[tuple[str, str]]

    def _summarize(self, c: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
        """The summary rows the new events changed, in the append's transaction (explain_summary)."""
        by: dict[str, list[Event]] = {}
        for r in rows:
            by.setdefault(r[1], []).append(r[5])
        for eid, evs in by.items():
            base = (evs[0].sequence or 1) - 1
            out = self._summaries.fold(eid, base, evs, lambda x: summary_rows(c, x),
                                       lambda x, a, b: self._read_range(c, x, a, b))  # fmt: skip
            if out:
                last = base + len(evs)
                c.executemany("INSERT OR REPLACE INTO noetl_explain (execution_id, ord, last_sequence, body)"
                              " VALUES (?,?,?,?)", [(eid, n, last, body) for n, body in out])  # fmt: skip

    def summary(self, execution_id: str) -> tuple[int, list[tuple[int, Any]]] | None:
        with self._lock:
            return summary_rows(self._conn, execution_id)

    def put_summary(self, execution_id: str, after: int | None, last: int, rows: list[tuple[int, str]]) -> bool:
        with self._lock:
            c = self._conn
            c.execute("BEGIN IMMEDIATE")
            try:
                got = c.execute("SELECT last_sequence FROM noetl_explain WHERE execution_id = ? AND ord = 0",
                                (execution_id,)).fetchone()  # fmt: skip
                if (got[0] if got else None) != after:  # written meanwhile: leave it
                    c.execute("ROLLBACK")
                    return False
                c.execute("DELETE FROM noetl_explain WHERE execution_id = ?", (execution_id,))
                c.executemany("INSERT INTO noetl_explain (execution_id, ord, last_sequence, body) VALUES (?,?,?,?)",
                              [(execution_id, n, last, body) for n, body in rows])  # fmt: skip
                c.execute("COMMIT")
            except BaseException:
                if c.in_transaction:
                    c.execute("ROLLBACK")
                raise
        self._summaries.forget([execution_id])
        return True

    def read_range(self, execution_id: str, after_sequence: int, until_sequence: int) -> list[Event]:
        with self._lock, self._snapshot() as c:
            return self._read_range(c, execution_id, after_sequence, until_sequence)

    def _read_range(self, c: sqlite3.Connection, execution_id: str, after_sequence: int,
                    until_sequence: int) -> list[Event]:  # fmt: skip
        """read_range inside the caller's transaction."""
        rows = c.execute(
            f"SELECT body, {_ROW_ENVELOPE} FROM noetl_event WHERE execution_id = ? AND sequence > ?"
            " AND sequence <= ? ORDER BY sequence",
            (execution_id, after_sequence, until_sequence),
        ).fetchall()
        segs = c.execute(
            "SELECT gid_last, gid_first, seq_first, body FROM noetl_event_segment"
            " WHERE execution_id = ? AND seq_last > ? AND seq_first <= ? ORDER BY seq_last",
            (execution_id, after_sequence, until_sequence),
        ).fetchall()
        out = [e for r in rows if (e := decode_body(r[0], f"{execution_id}#{r[3]}", self.skipped, r[1:])) is not None]
        for gl, gf, sf, body in segs:
            out += [e for _g, e in self._segment(gl, gf, execution_id, sf, body)
                    if after_sequence < (e.sequence or 0) <= until_sequence]  # fmt: skip
        out.sort(key=lambda e: e.sequence or 0)
        return out



class SqliteEventStore(_SqliteSummaries, EventStore):
    """Small batches are one row per event (``noetl_event``); a batch of at least ``segment_min``
    new events of one execution (a loop's iterations between flushes) is one zstd-compressed row
    of ``noetl_event_segment`` holding consecutive sequences and gids. ``gid`` stays one global
    cursor: every append numbers its rows or segment after the highest gid of both tables, inside
    its write transaction (rows are never deleted, so a gid is never reused). Readers merge both
    tables, so they see the same events either way (``segment_min=None``: rows only)."""

    segment_min: int | None = SEGMENT_MIN or None

    def __init__(self, path: str | os.PathLike[str]):
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.url = f"sqlite:///{self.path}"
        self._lock = threading.RLock()
        self._leases: dict[str, tuple[str, threading.Event]] = {}
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=60)
        # a row holding invalid UTF-8 (written by anything but this store) must not fail the whole fetch
        self._conn.text_factory = lambda b: b.decode("utf-8", "replace")
        self._zstd = zstandard.ZstdCompressor(level=1)
        self._summaries = SummaryCache()  # the executions' summaries, kept with each append
        self.skipped: list[tuple[str, str]] = []  # bad rows the readers skipped: (where, why)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA busy_timeout=60000")
        self._migrate()
        # the last sequence and whether it has segments, per execution this connection appended to
        # (so noetl_execution holds it); valid while PRAGMA data_version says no other connection
        # committed since our last append (saves a 3-subquery SELECT per flush)
        self._seq_cache: dict[str, tuple[int, bool]] = {}
        self._top_gid_seen: int | None = None  # the highest gid after our last append (same validity)
        self._data_version: int | None = None
        # files created before issue 19 keep AUTOINCREMENT: their segments also advance sqlite_sequence,
        # so an older writer on the same file still numbers its rows after them
        self._autoincrement = bool(self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE name = 'noetl_event' AND sql LIKE '%AUTOINCREMENT%'").fetchone())  # fmt: skip

    def _migrate(self) -> None:
        with self._lock:
            self._conn.execute("CREATE TABLE IF NOT EXISTS noetl_schema_version (version INTEGER NOT NULL)")
            row = self._conn.execute("SELECT MAX(version) FROM noetl_schema_version").fetchone()
            current = row[0] or 0
            refuse_newer_schema(current, len(SQLITE_MIGRATIONS), self.path)
            for version, statements in enumerate(SQLITE_MIGRATIONS, start=1):
                if version <= current:
                    continue
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    if (self._conn.execute("SELECT MAX(version) FROM noetl_schema_version").fetchone()[0] or 0) >= version:
                        self._conn.execute("ROLLBACK")  # another process migrated meanwhile
                        continue
                    for stmt in statements:
                        self._conn.execute(stmt)
                    self._conn.execute("INSERT INTO noetl_schema_version VALUES (?)", (version,))
                    self._conn.execute("COMMIT")
                except Exception:
                    self._conn.execute("ROLLBACK")
                    raise

    def append(self, events: Sequence[Event]) -> list[Event]:
        if not events:
            return []
        with self._lock:
            c = self._conn
            c.execute("BEGIN IMMEDIATE")
            try:
                version = c.execute("PRAGMA data_version").fetchone()[0]
                if version != self._data_version:  # another connection committed: ask the log again
                    self._forget()
                try:  # the common case: nothing in the batch was stored before
                    seen, top = self._insert(c, events, {})
                except sqlite3.IntegrityError:  # a re-sent event: keep its stored sequence, store the rest
                    c.execute("ROLLBACK")
                    self._summaries.forget()
                    c.execute("BEGIN IMMEDIATE")
                    self._forget()
                    version = c.execute("PRAGMA data_version").fetchone()[0]
                    seen, top = self._insert(c, events, self._existing(c, events))
                c.execute("COMMIT")
            except BaseException:
                self._forget()
                self._summaries.forget()
                if c.in_transaction:
                    c.execute("ROLLBACK")
                raise
            self._seq_cache.update(seen)
            self._top_gid_seen = top
            self._data_version = version
        return list(events)

    def _forget(self) -> None:
        self._seq_cache.clear()
        self._top_gid_seen = None
        self._data_version = None

    def _top_gid(self, c: sqlite3.Connection) -> int:
        """The highest gid stored (rows or segments), read inside the write transaction unless known."""
        if self._top_gid_seen is not None:
            return self._top_gid_seen
        top = c.execute(
            "SELECT MAX(COALESCE((SELECT MAX(gid) FROM noetl_event), 0),"
            " COALESCE((SELECT MAX(gid_last) FROM noetl_event_segment), 0))"
        ).fetchone()[0]
        if self._autoincrement:
            row = c.execute("SELECT seq FROM sqlite_sequence WHERE name = 'noetl_event'").fetchone()
            top = max(top, row[0] if row else 0)
        return top

    @staticmethod
    def _existing(c: sqlite3.Connection, events: Sequence[Event]) -> dict[str, int]:
        ids = [e.event_id for e in events]
        existing: dict[str, int] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            q = f"SELECT event_id, sequence FROM noetl_event WHERE event_id IN ({','.join('?' * len(chunk))})"
            existing.update(c.execute(q, chunk).fetchall())
            by_key = {event_key(e): e for e in chunk}
            q = f"SELECT k, sequence FROM noetl_event_key WHERE k IN ({','.join('?' * len(chunk))})"
            for k, seq in c.execute(q, list(by_key)).fetchall():
                existing.setdefault(by_key[k], seq)
        return existing

    def _insert(
        self, c: sqlite3.Connection, events: Sequence[Event], existing: dict[str, int]
    ) -> tuple[dict[str, tuple[int, bool]], int]:
        """Rows or one segment. Idempotency: a re-sent event stored as a row hits noetl_event's UNIQUE
        event_id, one stored in a segment hits noetl_event_key; either raises IntegrityError and
        ``append`` runs again with the stored sequences (``existing``), storing the rest as rows.
        Returns the ``_seq_cache`` entries and the highest gid as of this transaction's commit."""
        with_segments: set[str] = set()  # executions that have segments
        known: set[str] = set()  # executions already in noetl_execution
        cache = self._seq_cache

        def last(eid: str) -> int:
            hit = cache.get(eid)
            if hit is not None:  # appended to before, so noetl_execution has it
                known.add(eid)
                if hit[1]:
                    with_segments.add(eid)
                return hit[0]
            rows_max, seg_max, row = c.execute(
                "SELECT (SELECT MAX(sequence) FROM noetl_event WHERE execution_id = ?),"
                " (SELECT MAX(seq_last) FROM noetl_event_segment WHERE execution_id = ?),"
                " (SELECT 1 FROM noetl_execution WHERE execution_id = ?)",
                (eid, eid, eid),
            ).fetchone()
            if seg_max:
                with_segments.add(eid)
            if row:
                known.add(eid)
            return max(rows_max or 0, seg_max or 0)

        resent = bool(existing)
        rows, next_seq, exec_updates = sequence_batch(events, existing, last, encode=False)
        if rows and self.segment_min and len(rows) >= self.segment_min and len(next_seq) == 1 and not resent:
            if self._stored_as_rows(c, [r[0] for r in rows]):
                raise sqlite3.IntegrityError("a re-sent event (stored as a row)")
            top = self._insert_segment(c, rows, self._top_gid(c))
            with_segments.add(rows[0][1])
            c.executemany("INSERT INTO noetl_event_key (k, sequence) VALUES (?,?)", [(event_key(r[0]), r[2]) for r in rows])
        elif rows:
            if not resent and with_segments and self._stored_in_segments(c, [r[0] for r in rows if r[1] in with_segments]):
                raise sqlite3.IntegrityError("a re-sent event (stored in a segment)")
            top = self._top_gid(c)
            bodies = [dumps(r[5].to_stored(envelope=False)) for r in rows]
            if max(map(len, bodies)) > MAX_EVENT_BYTES:  # before anything is written
                for r, body in zip(rows, bodies, strict=True):
                    check_event_size(r[5], len(body))
            c.executemany(
                "INSERT INTO noetl_event (gid, event_id, execution_id, sequence, name, ts, body) VALUES (?,?,?,?,?,?,?)",
                [(top + i, *r[:5], body) for i, (r, body) in enumerate(zip(rows, bodies, strict=True), start=1)],
            )
            top += len(rows)
        else:
            top = self._top_gid_seen  # nothing new (every event was stored before): unknown stays unknown
        for eid, (pb, status, fin, parent, ts) in exec_updates.items():
            if eid in known and not (pb or status or fin):
                continue  # nothing to change (last_sequence is read from the log, see executions)
            c.execute(
                "INSERT INTO noetl_execution (execution_id, playbook, status, parent_execution_id, started_at,"
                " finished_at, last_sequence) VALUES (?,?,?,?,?,?,?)"
                " ON CONFLICT(execution_id) DO UPDATE SET"
                " playbook = COALESCE(excluded.playbook, noetl_execution.playbook),"
                " status = CASE WHEN excluded.status = '' THEN noetl_execution.status ELSE excluded.status END,"
                " finished_at = COALESCE(excluded.finished_at, noetl_execution.finished_at),"
                " last_sequence = excluded.last_sequence",
                (eid, pb, status or "", parent, ts, fin, next_seq[eid]),
            )
        # every execution of the batch now has a noetl_execution row (inserted above unless known)
        self._summarize(c, rows)
        return {eid: (seq, eid in with_segments) for eid, seq in next_seq.items()}, top

    @staticmethod
    def _stored_as_rows(c: sqlite3.Connection, ids: list[str]) -> bool:
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            q = f"SELECT 1 FROM noetl_event WHERE event_id IN ({','.join('?' * len(chunk))}) LIMIT 1"
            if c.execute(q, chunk).fetchone():
                return True
        return False

    @staticmethod
    def _stored_in_segments(c: sqlite3.Connection, ids: list[str]) -> bool:
        for i in range(0, len(ids), 500):
            keys = [event_key(e) for e in ids[i : i + 500]]
            q = f"SELECT 1 FROM noetl_event_key WHERE k IN ({','.join('?' * len(keys))}) LIMIT 1"
            if c.execute(q, keys).fetchone():
                return True
        return False

    def _insert_segment(self, c: sqlite3.Connection, rows: list[tuple[Any, ...]], base: int) -> int:
        """One execution's new events (consecutive sequences) as one row with gids ``base+1..base+n``
        (``base``: the highest gid stored); returns the new highest gid."""
        n = len(rows)
        if self._autoincrement:  # an older writer numbers its rows from sqlite_sequence: advance it too
            if c.execute("SELECT 1 FROM sqlite_sequence WHERE name = 'noetl_event'").fetchone() is None:
                c.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('noetl_event', ?)", (base + n,))
            else:
                c.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'noetl_event'", (base + n,))
        c.execute(
            "INSERT INTO noetl_event_segment (gid_last, gid_first, execution_id, seq_first, seq_last, body)"
            " VALUES (?,?,?,?,?,?)",
            (base + n, base + 1, rows[0][1], rows[0][2], rows[-1][2], encode_segment([r[5] for r in rows], self._zstd)),
        )
        return base + n

    def _segment(self, gid_last: int, gid_first: int, eid: str, seq_first: int, body: bytes) -> list[tuple[int, Event]]:
        return decode_segment(body, eid, seq_first, gid_first, f"segment gid {gid_first}-{gid_last}", self.skipped)

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        """One read transaction (caller holds the lock): both tables seen as of one commit, so a
        reader never gets a later segment while missing an earlier row committed between two SELECTs."""
        c = self._conn
        c.execute("BEGIN")
        try:
            yield c
        finally:
            c.execute("COMMIT")

    def read(self, execution_id: str, after_sequence: int = 0) -> list[Event]:
        with self._lock, self._snapshot():
            rows = self._conn.execute(
                f"SELECT body, {_ROW_ENVELOPE} FROM noetl_event WHERE execution_id = ? AND sequence > ? ORDER BY sequence",
                (execution_id, after_sequence),
            ).fetchall()
            segs = self._conn.execute(
                "SELECT gid_last, gid_first, seq_first, body FROM noetl_event_segment"
                " WHERE execution_id = ? AND seq_last > ? ORDER BY seq_last",
                (execution_id, after_sequence),
            ).fetchall()
        out = [e for r in rows if (e := decode_body(r[0], f"{execution_id}#{r[3]}", self.skipped, r[1:])) is not None]
        if not segs:
            return out
        for gl, gf, sf, body in segs:
            out += [e for _g, e in self._segment(gl, gf, execution_id, sf, body) if e.sequence > after_sequence]
        out.sort(key=lambda e: e.sequence or 0)
        return out

    def tail(self, after_gid: int = 0, limit: int = 1000) -> list[StoredEvent]:
        while True:  # a batch made only of bad rows must not look like the end of the log
            with self._lock, self._snapshot():
                rows = self._conn.execute(
                    f"SELECT gid, body, {_ROW_ENVELOPE} FROM noetl_event WHERE gid > ? ORDER BY gid LIMIT ?",
                    (after_gid, limit),
                ).fetchall()
                cur = self._conn.execute(
                    "SELECT gid_last, gid_first, execution_id, seq_first, body FROM noetl_event_segment"
                    " WHERE gid_last > ? ORDER BY gid_last",
                    (after_gid,),
                )
                segs, in_segs = [], 0
                while in_segs < limit and (seg := cur.fetchone()) is not None:  # enough to fill the page
                    segs.append(seg)
                    in_segs += seg[0] - max(seg[1] - 1, after_gid)
                cur.close()
            out = [StoredEvent(r[0], e) for r in rows if (e := decode_body(r[1], f"gid {r[0]}", self.skipped, r[2:]))]
            for gl, gf, eid, sf, body in segs:
                out += [StoredEvent(g, e) for g, e in self._segment(gl, gf, eid, sf, body) if g > after_gid]
            if segs:
                out.sort(key=lambda s: s.gid)
                del out[limit:]
            # how far this page surely covers each table (None: to its end)
            bounds = [b for b in (rows[-1][0] if len(rows) >= limit else None,
                                  segs[-1][0] if in_segs >= limit else None) if b is not None]  # fmt: skip
            if out or not bounds:
                return out
            after_gid = min(bounds)  # a page made only of bad rows: go on after it

    def tail_last(self) -> int:
        with self._lock:
            r = self._conn.execute(
                "SELECT MAX(COALESCE((SELECT MAX(gid) FROM noetl_event), 0),"
                " COALESCE((SELECT MAX(gid_last) FROM noetl_event_segment), 0))"
            ).fetchone()
        return int(r[0])

    def executions(self, limit: int = 100) -> list[ExecutionInfo]:
        with self._lock:
            rows = self._conn.execute(  # last_sequence is kept only when the status changes: read the log's
                "SELECT x.execution_id, playbook, status, started_at, finished_at, parent_execution_id,"
                " MAX(x.last_sequence,"
                "     COALESCE((SELECT MAX(sequence) FROM noetl_event e WHERE e.execution_id = x.execution_id), 0),"
                "     COALESCE((SELECT MAX(seq_last) FROM noetl_event_segment s WHERE s.execution_id = x.execution_id), 0))"
                " FROM noetl_execution x ORDER BY started_at DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [ExecutionInfo(r[0], r[1], r[2] or "unknown", r[3], r[4], r[5], r[6]) for r in rows]

    def acquire_lease(self, execution_id: str) -> None:
        """A row in ``noetl_lease``: live while its holder renews it (every TTL/3) and, on this host,
        while its process exists; a holder killed with SIGKILL leaves a stale row that is taken over."""
        host, pid, now = socket.gethostname(), os.getpid(), time.time()
        owner = f"{host}:{pid}:{id(self)}"
        with self._lock:
            c = self._conn
            c.execute("BEGIN IMMEDIATE")
            try:
                row = c.execute(
                    "SELECT owner, host, pid, expires_at FROM noetl_lease WHERE execution_id = ?", (execution_id,)
                ).fetchone()
                if row and row[0] != owner:
                    same_host_dead = row[1] == host and not pid_alive(int(row[2]))
                    if not same_host_dead and row[3] > now:
                        raise ExecutionLeased(
                            f"execution {execution_id} is leased by another process (a run or resume of it is in progress)"
                            f" (pid {row[2]} on {row[1]}); its lease expires in {row[3] - now:.0f}s"
                        )
                c.execute(
                    "INSERT INTO noetl_lease (execution_id, owner, host, pid, expires_at) VALUES (?,?,?,?,?)"
                    " ON CONFLICT(execution_id) DO UPDATE SET owner = excluded.owner, host = excluded.host,"
                    " pid = excluded.pid, expires_at = excluded.expires_at",
                    (execution_id, owner, host, pid, now + LEASE_TTL),
                )
                c.execute("COMMIT")
            except BaseException:
                if c.in_transaction:
                    c.execute("ROLLBACK")
                raise
        stop = threading.Event()
        self._leases[execution_id] = (owner, stop)

        def renew() -> None:
            while not stop.wait(LEASE_TTL / 3):
                try:
                    with self._lock:
                        self._conn.execute(
                            "UPDATE noetl_lease SET expires_at = ? WHERE execution_id = ? AND owner = ?",
                            (time.time() + LEASE_TTL, execution_id, owner),
                        )
                except sqlite3.Error:
                    return

        threading.Thread(target=renew, name=f"noetl-lease-{execution_id}", daemon=True).start()

    def release_lease(self, execution_id: str) -> None:
        held = self._leases.pop(execution_id, None)
        if not held:
            return
        owner, stop = held
        stop.set()
        with self._lock:
            try:
                self._conn.execute("DELETE FROM noetl_lease WHERE execution_id = ? AND owner = ?", (execution_id, owner))
            except sqlite3.OperationalError:  # a full disk: the row stays, and is taken over once this process is gone
                log.info("could not release the lease of execution %s", execution_id)

    def close(self) -> None:
        for eid in list(self._leases):
            self.release_lease(eid)
        with self._lock:
            self._conn.close()
