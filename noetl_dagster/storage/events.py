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
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from noetl_dagster.engine.events import Event
from noetl_dagster.engine.explain_summary import SummaryCache
from noetl_dagster.engine.ports import EventStore, ExecutionInfo, StoredEvent
from noetl_dagster.engine.recorder import MAX_EVENT_BYTES, check_event_size
from noetl_dagster.storage.event_codec import (
    EventStoreTooNew as EventStoreTooNew,  # callers catch it from here
)
from noetl_dagster.storage.event_codec import (
    chain_rows,
    decode_body,
    decode_segment,
    encode_segment,
    event_key,
    refuse_newer_schema,
    segment_chain,
    sequence_batch,
)
from noetl_dagster.storage.sqlite_leases import SqliteLeases
from noetl_dagster.util.jsonutil import dumps
from noetl_dagster.util.lazylog import LazyLogger

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
    [  # 5: the hash chain (issue 41, engine/chain.py): each row's hash; a segment's last hash in full
        # and an 8-byte mark per event, enough to name the first altered one. Older rows stay NULL.
        "ALTER TABLE noetl_event ADD COLUMN hash BLOB",
        "ALTER TABLE noetl_event_segment ADD COLUMN marks BLOB",
        "ALTER TABLE noetl_event_segment ADD COLUMN head BLOB",
    ],
]

log = LazyLogger("noetl_dagster.storage")

# noetl_event's columns holding an event's ENVELOPE_COLUMNS (in that order): readers select them
# beside the body, which since issue 19 leaves them out
_ROW_ENVELOPE = "event_id, execution_id, sequence, name, ts"
# A batch of at least this many new events of one execution is stored as one segment row (issue 19).
SEGMENT_MIN = int(os.environ.get("NOETL_EVENT_SEGMENT_MIN", "256") or 0)
MARK_BYTES = 8  # a segment's per-event chain mark: the first bytes of the event's hash


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

    def put_summary(
        self, execution_id: str, after: int | None, last: int, rows: list[tuple[int, str]]
    ) -> bool:
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
        out = [
            e
            for r in rows
            if (e := decode_body(r[0], f"{execution_id}#{r[3]}", self.skipped, r[1:])) is not None
        ]
        for gl, gf, sf, body in segs:
            out += [e for _g, e in self._segment(gl, gf, execution_id, sf, body)
                    if after_sequence < (e.sequence or 0) <= until_sequence]  # fmt: skip
        out.sort(key=lambda e: e.sequence or 0)
        return out


class SqliteEventStore(_SqliteSummaries, SqliteLeases, EventStore):
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
        self._zstd: Any = None  # the segment compressor, made at the first segment (_compressor)
        self._summaries = SummaryCache()  # the executions' summaries, kept with each append
        self.skipped: list[tuple[str, str]] = []  # bad rows the readers skipped: (where, why)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA busy_timeout=60000")
        self._migrate()
        # the last sequence, whether it has segments and the chain head, per execution this connection
        # appended to (so noetl_execution holds it); valid while PRAGMA data_version says no other
        # connection committed since our last append (saves a 3-subquery SELECT per flush)
        self._seq_cache: dict[str, tuple[int, bool, bytes | None]] = {}
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
                    if (
                        self._conn.execute("SELECT MAX(version) FROM noetl_schema_version").fetchone()[0] or 0
                    ) >= version:
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
        heads: dict[str, bytes | None] = {}  # the chain head before this batch (None: unchained)
        cache = self._seq_cache

        def last(eid: str) -> int:
            hit = cache.get(eid)
            if hit is not None:  # appended to before, so noetl_execution has it
                known.add(eid)
                if hit[1]:
                    with_segments.add(eid)
                heads[eid] = hit[2]
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
            top = max(rows_max or 0, seg_max or 0)
            heads[eid] = self._head(c, eid, top, seg_max == top) if top else None
            return top

        resent = bool(existing)
        rows, next_seq, exec_updates = sequence_batch(events, existing, last, encode=False)
        hashes = chain_rows(rows, heads)
        if rows and self.segment_min and len(rows) >= self.segment_min and len(next_seq) == 1 and not resent:
            if self._stored_as_rows(c, [r[0] for r in rows]):
                raise sqlite3.IntegrityError("a re-sent event (stored as a row)")
            top = self._insert_segment(c, rows, hashes, self._top_gid(c))
            with_segments.add(rows[0][1])
            c.executemany(
                "INSERT INTO noetl_event_key (k, sequence) VALUES (?,?)",
                [(event_key(r[0]), r[2]) for r in rows],
            )
        elif rows:
            if (
                not resent
                and with_segments
                and self._stored_in_segments(c, [r[0] for r in rows if r[1] in with_segments])
            ):
                raise sqlite3.IntegrityError("a re-sent event (stored in a segment)")
            top = self._top_gid(c)
            bodies = [dumps(r[5].to_stored(envelope=False)) for r in rows]
            if max(map(len, bodies)) > MAX_EVENT_BYTES:  # before anything is written
                for r, body in zip(rows, bodies, strict=True):
                    check_event_size(r[5], len(body))
            c.executemany(
                "INSERT INTO noetl_event (gid, event_id, execution_id, sequence, name, ts, body, hash)"
                " VALUES (?,?,?,?,?,?,?,?)",
                [
                    (top + i, *r[:5], body, h)
                    for i, (r, body, h) in enumerate(zip(rows, bodies, hashes, strict=True), start=1)
                ],
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
        return {eid: (seq, eid in with_segments, heads[eid]) for eid, seq in next_seq.items()}, top

    @staticmethod
    def _head(c: sqlite3.Connection, eid: str, sequence: int, in_segment: bool) -> bytes | None:
        """The stored chain hash of the execution's event ``sequence`` (None: written unchained)."""
        if in_segment:
            row = c.execute("SELECT head FROM noetl_event_segment WHERE execution_id = ? AND seq_last = ?",
                            (eid, sequence)).fetchone()  # fmt: skip
        else:
            row = c.execute("SELECT hash FROM noetl_event WHERE execution_id = ? AND sequence = ?",
                            (eid, sequence)).fetchone()  # fmt: skip
        return row[0] if row else None

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

    def _insert_segment(
        self, c: sqlite3.Connection, rows: list[tuple[Any, ...]], hashes: list[bytes], base: int
    ) -> int:
        """One execution's new events (consecutive sequences) as one row with gids ``base+1..base+n``
        (``base``: the highest gid stored); returns the new highest gid."""
        n = len(rows)
        if self._autoincrement:  # an older writer numbers its rows from sqlite_sequence: advance it too
            if c.execute("SELECT 1 FROM sqlite_sequence WHERE name = 'noetl_event'").fetchone() is None:
                c.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('noetl_event', ?)", (base + n,))
            else:
                c.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'noetl_event'", (base + n,))
        c.execute(
            "INSERT INTO noetl_event_segment (gid_last, gid_first, execution_id, seq_first, seq_last, body,"
            " marks, head) VALUES (?,?,?,?,?,?,?,?)",
            (
                base + n,
                base + 1,
                rows[0][1],
                rows[0][2],
                rows[-1][2],
                encode_segment([r[5] for r in rows], self._compressor()),
                b"".join(h[:MARK_BYTES] for h in hashes),
                hashes[-1],
            ),
        )
        return base + n

    def _compressor(self) -> Any:
        """zstd, imported at the first segment: a run of few events writes none (issue 35)."""
        if self._zstd is None:
            import zstandard  # noqa: PLC0415 - start-up

            self._zstd = zstandard.ZstdCompressor(level=1)
        return self._zstd

    def _segment(
        self, gid_last: int, gid_first: int, eid: str, seq_first: int, body: bytes
    ) -> list[tuple[int, Event]]:
        return decode_segment(
            body, eid, seq_first, gid_first, f"segment gid {gid_first}-{gid_last}", self.skipped
        )

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
        out = [
            e
            for r in rows
            if (e := decode_body(r[0], f"{execution_id}#{r[3]}", self.skipped, r[1:])) is not None
        ]
        if not segs:
            return out
        for gl, gf, sf, body in segs:
            out += [
                e for _g, e in self._segment(gl, gf, execution_id, sf, body) if e.sequence > after_sequence
            ]
        out.sort(key=lambda e: e.sequence or 0)
        return out

    def read_chained(self, execution_id: str) -> list[tuple[int, Event | None, bytes | None]]:
        with self._lock, self._snapshot():
            rows = self._conn.execute(
                f"SELECT body, {_ROW_ENVELOPE}, hash FROM noetl_event WHERE execution_id = ? ORDER BY sequence",
                (execution_id,),
            ).fetchall()
            segs = self._conn.execute(
                "SELECT gid_last, gid_first, seq_first, seq_last, body, marks, head FROM noetl_event_segment"
                " WHERE execution_id = ? ORDER BY seq_last",
                (execution_id,),
            ).fetchall()
        out = [(r[3], decode_body(r[0], f"{execution_id}#{r[3]}", self.skipped, r[1:6]), r[6]) for r in rows]
        for gl, gf, sf, sl, body, marks, head in segs:
            evs = self._segment(gl, gf, execution_id, sf, body)
            out += segment_chain(evs, execution_id, sf, sl, marks, head, MARK_BYTES)
        if segs:
            out.sort(key=lambda x: x[0])
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
            out = [
                StoredEvent(r[0], e)
                for r in rows
                if (e := decode_body(r[1], f"gid {r[0]}", self.skipped, r[2:]))
            ]
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

    def close(self) -> None:
        for eid in list(self._leases):
            self.release_lease(eid)
        with self._lock:
            self._conn.close()
