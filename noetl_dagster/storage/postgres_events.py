"""EventStore on PostgreSQL (psycopg 3) — the same contract as SqliteEventStore.

* Schema by migration: ``MIGRATIONS`` are applied in order inside a transaction
  holding an advisory lock, and recorded in ``noetl_schema_version``; opening
  the store twice, or from two processes at once, is safe.
* Append-only: triggers refuse UPDATE, DELETE and TRUNCATE on ``noetl_event``.
* Idempotent on ``event_id``: a re-sent event is skipped and keeps its stored sequence.
* Gap-free ``sequence`` per execution: it is taken from the execution's counter
  row (``noetl_execution.last_sequence``) inside the append transaction.
* ``gid`` order is commit order: appends take one transaction-scoped advisory
  lock, so a reader tailing ``gid > cursor`` can never step over an event that
  commits later with a smaller ``gid``. Appends are batched by the recorder, so
  the lock is held for one short transaction per batch.
* Group commit (on by default; ``NOETL_PG_GROUP_COMMIT=0`` or ``group_commit=False`` turns it
  off): flushes from threads of one process that arrive while a statement is in flight go
  together in the next one, one transaction and one WAL flush for all of them
  (``postgres_group_commit``). Each ``append`` still returns only once its own events are
  committed, so kill -9 safety is unchanged; ``synchronous_commit`` stays the server's unless
  the URL opts out (``options=-c%20synchronous_commit%3Doff``, docs/capacity.md).

The URL is a libpq URL; an extra ``schema=`` query parameter selects the schema
(default ``noetl``), e.g. ``postgresql://postgres@127.0.0.1:5432/postgres?schema=noetl``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from noetl_dagster.engine.chain import GENESIS, link
from noetl_dagster.engine.events import Event
from noetl_dagster.engine.explain_summary import SummaryCache
from noetl_dagster.engine.ports import EventStore, ExecutionInfo, StoredEvent
from noetl_dagster.engine.recorder import MAX_EVENT_BYTES, check_event_size
from noetl_dagster.storage.event_codec import (
    _EXECUTION_EVENTS,
    _execution_update,
    chain_rows,
    decode_body,
    refuse_newer_schema,
    sequence_batch,
)
from noetl_dagster.storage.pg_leases import AdvisoryLeases, lock_key
from noetl_dagster.storage.postgres_group_commit import GroupCommit
from noetl_dagster.util.jsonutil import dumps

DEFAULT_SCHEMA = "noetl"
GROUP_MAX_EVENTS = 5000  # events per group-commit statement at most

# One list of statements per schema version; ``{schema}`` is the quoted schema name.
MIGRATIONS: list[list[str]] = [
    [
        """CREATE TABLE IF NOT EXISTS {schema}.noetl_event (
            gid BIGSERIAL PRIMARY KEY,
            event_id TEXT NOT NULL UNIQUE,
            execution_id TEXT NOT NULL,
            sequence BIGINT NOT NULL,
            name TEXT NOT NULL,
            ts TEXT NOT NULL,
            body JSON NOT NULL,
            UNIQUE (execution_id, sequence))""",
        """CREATE TABLE IF NOT EXISTS {schema}.noetl_execution (
            execution_id TEXT PRIMARY KEY,
            playbook TEXT,
            status TEXT NOT NULL,
            parent_execution_id TEXT,
            started_at TEXT,
            finished_at TEXT,
            last_sequence BIGINT NOT NULL DEFAULT 0)""",
        "CREATE INDEX IF NOT EXISTS noetl_execution_started ON {schema}.noetl_execution (started_at DESC)",
        """CREATE OR REPLACE FUNCTION {schema}.noetl_event_append_only() RETURNS trigger
            LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'noetl_event is append-only'; END $$""",
        """CREATE TRIGGER noetl_event_no_update BEFORE UPDATE OR DELETE ON {schema}.noetl_event
            FOR EACH ROW EXECUTE FUNCTION {schema}.noetl_event_append_only()""",
        """CREATE TRIGGER noetl_event_no_truncate BEFORE TRUNCATE ON {schema}.noetl_event
            FOR EACH STATEMENT EXECUTE FUNCTION {schema}.noetl_event_append_only()""",
    ],
    [  # 2: the execution summary (issue 36, engine/explain_summary.py): derived from the log, written with it
        """CREATE TABLE IF NOT EXISTS {schema}.noetl_explain (
            execution_id TEXT NOT NULL,
            ord INTEGER NOT NULL,
            last_sequence BIGINT NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (execution_id, ord))""",
    ],
    [  # 3: the hash chain (issue 41, engine/chain.py): each event's hash and each execution's head.
        # An append computes its events' hashes from the head it expects; the statement refuses
        # (NOETL_CHAIN_MOVED) when another writer moved the head meanwhile, and the append runs again
        # under the lock. Older rows stay NULL (unchained).
        "ALTER TABLE {schema}.noetl_event ADD COLUMN IF NOT EXISTS hash BYTEA",
        "ALTER TABLE {schema}.noetl_execution ADD COLUMN IF NOT EXISTS head BYTEA",
        """CREATE OR REPLACE FUNCTION {schema}.noetl_chain_moved(eid TEXT) RETURNS BYTEA
            LANGUAGE plpgsql AS $$ BEGIN
              RAISE EXCEPTION USING ERRCODE = 'NT409', MESSAGE = 'the chain head of ' || eid || ' moved';
            END $$""",
    ],
]
CHAIN_MOVED = "NT409"  # the SQLSTATE noetl_chain_moved raises


_SEQ_PAD = len('"sequence":null,')  # what the event's size check counts for the sequence the server adds

# One statement per batch (autocommit: its commit is the only other wait). The columns go as
# array literals built here (``_array``: two str.replace per value; psycopg's own array dumpers
# cost ~1 ms per flush in Python). The advisory lock is taken before any gid is drawn, so gid order
# stays commit order; the counter rows are upserted with the batch's count per execution
# (``excluded.last_sequence``) and return the new last sequence, from which each event's number
# follows by its rank in the batch: the statement returns one row per execution, not one per event
# (the client numbers its events the same way; ``ins`` runs to completion though nothing reads it).
# A batch may hold the flushes of many executions (group commit).
# The chain (``pv``): each execution's events were hashed here from the head this process expects
# (``base``, ``prev``); the counter row takes the new head only if it still holds that one, else the
# statement fails (CHAIN_MOVED) and the append runs again in ``_append``, under the lock.
# The summary rows (``sm``) were folded here with the sequences the events will get if nobody else
# appended meanwhile; they are written only where the counter confirms it (else the summary stays
# behind, and readers fold the events after it).
APPEND_SQL = """WITH lk AS MATERIALIZED (SELECT pg_advisory_xact_lock(%s::bigint) AS locked),
pv AS MATERIALIZED (
  SELECT p.execution_id, p.base, decode(p.prev, 'hex') AS prev, decode(p.head, 'hex') AS head
  FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[]) AS p(execution_id, base, prev, head)),
ctr AS (
  INSERT INTO {schema}.noetl_execution AS x
    (execution_id, playbook, status, finished_at, parent_execution_id, started_at, last_sequence, head)
  SELECT u.*, CASE WHEN pv.base = 0 THEN pv.head END
  FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::bigint[])
    AS u(execution_id, playbook, status, finished_at, parent_execution_id, started_at, last_sequence)
    JOIN pv USING (execution_id), lk
  ON CONFLICT (execution_id) DO UPDATE SET
    head = (SELECT CASE WHEN x.last_sequence = pv.base AND x.head IS NOT DISTINCT FROM pv.prev THEN pv.head
                   ELSE {schema}.noetl_chain_moved(x.execution_id) END FROM pv WHERE pv.execution_id = x.execution_id),
    playbook = COALESCE(excluded.playbook, x.playbook),
    status = CASE WHEN excluded.status = '' THEN x.status ELSE excluded.status END,
    parent_execution_id = COALESCE(x.parent_execution_id, excluded.parent_execution_id),
    started_at = COALESCE(x.started_at, excluded.started_at),
    finished_at = COALESCE(excluded.finished_at, x.finished_at),
    last_sequence = x.last_sequence + excluded.last_sequence
  RETURNING x.execution_id, x.last_sequence),
sm AS (
  INSERT INTO {schema}.noetl_explain AS s (execution_id, ord, last_sequence, body)
  SELECT u.execution_id, u.ord, u.last_sequence, u.body
  FROM unnest(%s::text[], %s::int[], %s::bigint[], %s::text[]) AS u(execution_id, ord, last_sequence, body)
  JOIN ctr ON ctr.execution_id = u.execution_id AND ctr.last_sequence = u.last_sequence
  ON CONFLICT (execution_id, ord) DO UPDATE SET last_sequence = excluded.last_sequence, body = excluded.body),
ev AS (
  SELECT e.*, row_number() OVER (PARTITION BY e.execution_id ORDER BY e.ord) AS k,
    count(*) OVER (PARTITION BY e.execution_id) AS n
  FROM unnest(string_to_array(%s, E'\\x1e'), string_to_array(%s, E'\\x1e'), string_to_array(%s, E'\\x1e'),
              string_to_array(%s, E'\\x1e'), string_to_array(%s, E'\\x1e'), string_to_array(%s, E'\\x1e'))
    WITH ORDINALITY AS e(event_id, execution_id, name, ts, tail, hash, ord)),
ins AS (
  INSERT INTO {schema}.noetl_event (event_id, execution_id, sequence, name, ts, body, hash)
  SELECT ev.event_id, ev.execution_id, ctr.last_sequence - ev.n + ev.k, ev.name, ev.ts,
         ('{{"sequence":' || (ctr.last_sequence - ev.n + ev.k) || ',' || ev.tail)::json, decode(ev.hash, 'hex')
  FROM ev JOIN ctr USING (execution_id) ORDER BY ev.ord)
SELECT execution_id, last_sequence FROM ctr"""


SEP = "\x1e"  # ASCII record separator: JSON text never holds it raw (orjson escapes control characters)


def _joined(values: Sequence[str]) -> str:
    """The values as one text parameter the server splits at ``SEP`` (``string_to_array``): one C-level
    join per column instead of escaping each value into an array literal (issue 35: the escaping was
    ~15 % of a flush's client CPU). A value holding ``SEP`` itself is refused: ids, names and
    timestamps never do, and body text cannot."""
    text = SEP.join(values)
    if text.count(SEP) != len(values) - 1 or not all(values):  # ('' would split into no value at all)
        raise ValueError(
            "an event id, execution id, name or timestamp is empty or holds the ASCII record separator (0x1e)"
        )
    return text


def _array(values: Sequence[str | None]) -> str:
    """A Postgres array literal of text values (NULL for None)."""
    return (
        "{"
        + ",".join(
            "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values
        )
        + "}"
    )


class _Batch:
    """One flush, encoded in the caller's thread: the event columns and the executions index rows
    ([playbook, status, finished_at, parent, started_at, count] per execution)."""

    __slots__ = ("events", "ids", "execs", "names", "ts", "tails", "idx", "cols")
    # ``tails[i]``: event i's canonical text (engine/chain.py) without its opening brace

    def __init__(self, events: Sequence[Event]):
        self.events = events
        ids: list[str] = []
        execs: list[str] = []
        names: list[str] = []
        ts: list[str] = []
        tails: list[str] = []
        idx: dict[str, list[Any]] = {}
        for ev in events:  # runs for every stored event: locals, and the index touched only where it changes
            d = ev.to_stored()
            del d["sequence"]  # the server writes it as the first key: '{"sequence":N,' || tail
            text = dumps(d)  # '{"event_id":...': never empty (event_id is always there)
            if len(text) + _SEQ_PAD > MAX_EVENT_BYTES:  # the size as stored with '{"sequence":null,'
                check_event_size(ev, len(text) + _SEQ_PAD)
            tails.append(text[1:])
            ids.append(ev.event_id)
            execs.append(eid := ev.execution_id)
            names.append(name := ev.name)
            ts.append(ev.timestamp)
            row = idx.get(eid)
            if row is None:  # parent and start: the first seen stay
                row = idx[eid] = [None, None, None, ev.parent_execution_id, ev.timestamp, 0]
            row[5] += 1
            if name in _EXECUTION_EVENTS:  # the latest playbook, status and finish win
                pb, status, fin = _execution_update(ev)
                row[0], row[1], row[2] = pb or row[0], status or row[1], fin or row[2]
        self.ids, self.execs, self.names, self.ts, self.tails, self.idx = ids, execs, names, ts, tails, idx
        # the event columns as the statement's five text parameters, checked here (the caller's thread)
        self.cols = [_joined(c) for c in (ids, execs, names, ts, tails)] if events else []

    def merge_index(self, execution_id: str, new: list[Any]) -> None:
        upd = self.idx.get(execution_id)
        if upd is None:
            self.idx[execution_id] = list(new)
            return
        upd[0] = new[0] or upd[0]  # the latest playbook, status and finish win
        upd[1] = new[1] or upd[1]
        upd[2] = new[2] or upd[2]
        upd[5] += new[5]  # parent and start: the first seen stay

    def params(self, lock: int) -> tuple[Any, ...]:
        rows = [(eid, u[0], u[1] or "", u[2], u[3], u[4], str(u[5])) for eid, u in self.idx.items()]
        cols = list(zip(*rows, strict=True))
        return (lock, *(_array(c) for c in cols[:6]), "{" + ",".join(cols[6]) + "}", *self.cols)

    @classmethod
    def combine(cls, batches: Sequence[_Batch]) -> _Batch:
        if len(batches) == 1:
            return batches[0]
        out = cls(())  # only what ``params`` reads: the index rows and the joined columns
        for b in batches:
            for eid, u in b.idx.items():
                out.merge_index(eid, u)
        out.cols = [SEP.join(b.cols[i] for b in batches if b.cols) for i in range(5)]
        return out


def _chain(
    batches: Sequence[_Batch], guess: dict[str, tuple[int, bytes | None]]
) -> tuple[list[str], str, dict[str, tuple[int, bytes]]]:
    """The ``pv`` arrays and the events' hashes (hex, joined) from the heads ``guess`` expects
    (the events' sequences were guessed by ``_summarize`` from the same base), and the new heads."""
    heads: dict[str, tuple[int, bytes]] = {}
    out: list[str] = []
    for b in batches:
        for ev, tail in zip(b.events, b.tails, strict=True):
            eid = ev.execution_id
            prev = heads[eid][1] if eid in heads else (guess[eid][1] or GENESIS)
            h = link(prev, ev.sequence or 0, "{" + tail)
            heads[eid] = (ev.sequence or 0, h)
            out.append(h.hex())
    eids = list(heads)
    pv = [_array(eids), "{" + ",".join(str(guess[e][0]) for e in eids) + "}",
          _array([p.hex() if (p := guess[e][1]) else None for e in eids]),
          _array([heads[e][1].hex() for e in eids])]  # fmt: skip
    return pv, SEP.join(out), heads


class _Connection(psycopg.Connection):  # type: ignore[type-arg]
    """The pool's connections. The first one the pool asks for is the connection the store opened
    to check the server and the schema (``noetl_first``): an open costs one connect, not two (each
    is a new server backend: a fork and the start-up exchange)."""

    @classmethod
    def connect(cls, conninfo: str = "", *, noetl_first: list[Any] | None = None, **kwargs: Any) -> Any:  # type: ignore[override]
        if noetl_first:
            return noetl_first.pop()
        return super().connect(conninfo, **kwargs)


class EventStoreUnavailable(RuntimeError):
    """The event store's database cannot be reached."""


def masked(conninfo: str) -> str:
    """A URL safe to print: the password replaced."""
    parts = urlsplit(conninfo)
    if parts.password:
        netloc = parts.netloc.replace(":" + parts.password + "@", ":***@")
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return conninfo


def split_schema(url: str) -> tuple[str, str]:
    """(libpq URL without our ``schema`` parameter, schema name)."""
    if url.startswith("postgresql+psycopg://"):
        url = "postgresql://" + url[len("postgresql+psycopg://") :]
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in query if k == "schema"), None) or DEFAULT_SCHEMA
    # quote, not quote_plus: libpq does not read '+' as a space (options=-c%20synchronous_commit%3Doff)
    rest = urlencode([(k, v) for k, v in query if k != "schema"], quote_via=quote)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, rest, parts.fragment)), schema


class PostgresEventStore(EventStore):
    def __init__(
        self, url: str, *, schema: str | None = None, pool_size: int = 4, group_commit: bool | None = None
    ):
        conninfo, url_schema = split_schema(url)
        self.schema = schema or url_schema
        self.url = url
        self._ident = sql.Identifier(self.schema)
        self._conninfo = conninfo
        self._leases = AdvisoryLeases(conninfo, self.schema)
        self.skipped: list[tuple[str, str]] = []  # bad rows the readers skipped: (where, why)
        try:  # a direct connect first: libpq's own error now, rather than a pool timeout later
            first = _Connection.connect(conninfo, autocommit=True, connect_timeout=10)
        except psycopg.Error as e:
            raise EventStoreUnavailable(
                f"cannot reach the Postgres event store at {masked(conninfo)}: {e}"
            ) from None
        try:  # the schema check and the statement's rendering on that connection, which the pool then keeps
            self._migrate(first)
            # rendered once: composing it per call cost 2 ms
            self._append_sql = self._q(APPEND_SQL).as_string(first)
        except BaseException:
            first.close()
            raise
        self._pool = ConnectionPool(
            conninfo,
            min_size=1,
            max_size=pool_size,
            kwargs={"autocommit": True, "noetl_first": [first]},  # one connect per open, not two
            connection_class=_Connection,
            open=False,
            name="noetl-events",
        )
        try:
            self._pool.open(wait=True, timeout=15)
        except BaseException:
            self._pool.close()
            first.close()
            raise
        self._append_lock = lock_key(self.schema, "append")
        self._summaries = SummaryCache()  # the executions' summaries, written with each append
        # (last sequence, chain head) of the executions this process appended to last (see APPEND_SQL)
        self._heads: dict[str, tuple[int, bytes]] = {}
        if group_commit is None:
            group_commit = os.environ.get("NOETL_PG_GROUP_COMMIT", "1").lower() not in (
                "0",
                "false",
                "no",
                "off",
            )
        # concurrent appends from this process's threads: one statement per round (postgres_group_commit)
        self._group: GroupCommit[_Batch, list[Event]] | None = None
        if group_commit:
            self._group = GroupCommit(
                lambda batches: self._append_one_statement(batches),
                self._append_batch,
                split_on=lambda e: (
                    isinstance(e, psycopg.DatabaseError) and not isinstance(e, psycopg.OperationalError)
                ),
                weight=lambda b: len(b.ids),
                max_weight=GROUP_MAX_EVENTS,
            )

    def _q(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(schema=self._ident)

    def _migrate(self, conn: psycopg.Connection) -> None:
        """Bring the schema to ``len(MIGRATIONS)``. An up-to-date schema (every open but the first)
        costs one round trip: its version is read without the lock, and only a missing or older one
        takes the migration lock and reads it again there (a version seen committed is final)."""
        try:
            row = conn.execute(
                self._q("SELECT COALESCE(MAX(version), 0) FROM {schema}.noetl_schema_version")
            ).fetchone()
            if row and row[0] >= len(MIGRATIONS):
                refuse_newer_schema(
                    row[0], len(MIGRATIONS), f"{masked(self._conninfo)} (schema {self.schema})"
                )
                return
        except psycopg.errors.UndefinedTable:  # a new schema (autocommit: nothing to roll back)
            pass
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(self.schema, "migrate"),))
            conn.execute(self._q("CREATE SCHEMA IF NOT EXISTS {schema}"))
            conn.execute(
                self._q(
                    "CREATE TABLE IF NOT EXISTS {schema}.noetl_schema_version"
                    " (version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
                )
            )
            row = conn.execute(
                self._q("SELECT COALESCE(MAX(version), 0) FROM {schema}.noetl_schema_version")
            ).fetchone()
            current = row[0] if row else 0
            refuse_newer_schema(current, len(MIGRATIONS), f"{masked(self._conninfo)} (schema {self.schema})")
            for version, statements in enumerate(MIGRATIONS, start=1):
                if version <= current:
                    continue
                for stmt in statements:
                    conn.execute(self._q(stmt))
                conn.execute(
                    self._q("INSERT INTO {schema}.noetl_schema_version (version) VALUES (%s)"), (version,)
                )

    def schema_version(self) -> int:
        with self._pool.connection() as conn:
            row = conn.execute(
                self._q("SELECT COALESCE(MAX(version), 0) FROM {schema}.noetl_schema_version")
            ).fetchone()
        return int(row[0])

    def append(self, events: Sequence[Event]) -> list[Event]:
        if not events:
            return []
        batch = _Batch(events)  # encoded here, in the caller's thread, not in the group's round
        if self._group is None:
            return self._append_batch(batch)
        return self._group.submit(batch)

    def _append_batch(self, batch: _Batch) -> list[Event]:
        try:  # the common case: nothing in the batch was stored before: one statement, one round trip
            return self._append_one_statement([batch])[0]
        except psycopg.errors.UniqueViolation:  # a re-sent event: keep its stored sequence, store the rest
            return self._append(batch.events, check_existing=True)
        except psycopg.DatabaseError as e:
            if e.sqlstate != CHAIN_MOVED:
                raise
            return self._append(batch.events, check_existing=False)  # another writer moved the head

    def _append_one_statement(self, batches: Sequence[_Batch]) -> list[list[Event]]:
        """Lock, number, insert and index one or more flushes in one autocommit statement (issue 19:
        a flush was nine round trips and a commit; on a busy server each round trip waits for CPU).

        The server numbers the events from the execution's counter row (so several processes may
        append to one execution) and writes the sequence into each body's head; the body's
        remainder was serialized by ``_Batch``."""
        combined = _Batch.combine(batches)
        params = combined.params(self._append_lock)
        with self._pool.connection() as conn:
            try:
                guess: dict[str, tuple[int, bytes | None]] = {}
                summary = self._summarize(conn, [ev for b in batches for ev in b.events], guess)
                pv, hashes, heads = _chain(batches, guess)
                rows = conn.execute(
                    self._append_sql,
                    (params[0], *pv, *params[1:8], *summary, *params[8:], hashes),
                    prepare=True,
                ).fetchall()
            except BaseException:
                self._summaries.forget(eids := {ev.execution_id for b in batches for ev in b.events})
                for eid in eids:
                    self._heads.pop(eid, None)
                raise
        # each execution's last sequence now; its events of this statement end there, in batch order
        at = {eid: int(last) - combined.idx[eid][5] for eid, last in rows}
        for b in batches:
            for ev in b.events:
                seq = at[ev.execution_id] = at[ev.execution_id] + 1
                if ev.sequence != seq:  # numbered otherwise than guessed: the summary was not written
                    self._summaries.forget([ev.execution_id])
                ev.sequence = seq
        if len(self._heads) > 50_000:  # a long-lived worker: forget (the next append asks the table)
            self._heads.clear()
        self._heads.update(heads)
        return [list(b.events) for b in batches]

    def _summarize(
        self,
        conn: psycopg.Connection,
        events: Sequence[Event],
        guess: dict[str, tuple[int, bytes | None]] | None = None,
    ) -> list[str]:
        """The ``sm`` arrays: the summary rows of a statement's events, folded with the sequences
        they will get if the counter is where this process left it (each event's ``sequence`` is
        set to that guess; the statement writes the rows only if the guess holds). ``guess`` gets
        each execution's expected (last sequence, chain head)."""
        guess = {} if guess is None else guess
        by: dict[str, list[Event]] = {}
        for ev in events:
            by.setdefault(ev.execution_id, []).append(ev)
        out: list[tuple[str, int, int, str]] = []
        for eid, evs in by.items():
            base = self._summaries.at(eid)
            if base is None and evs[0].name == "playbook.execution.requested":
                base = 0  # a new execution starts with its request (if not, the counter refuses the rows)
            known = self._heads.get(eid)
            if base is not None and base and (known is None or known[0] != base):
                base = None  # the head is not known here: ask (an execution this process did not write last)
            if base is None:  # first append of this execution by this process: where is it?
                row = conn.execute(self._q("SELECT last_sequence, head FROM {schema}.noetl_execution"
                                           " WHERE execution_id = %s"), (eid,)).fetchone()  # fmt: skip
                base = int(row[0]) if row else 0
                guess[eid] = (base, bytes(row[1]) if row and row[1] is not None else None)
            else:
                guess[eid] = (base, known[1] if base and known else None)
            for k, ev in enumerate(evs, start=1):
                ev.sequence = base + k
            last = base + len(evs)
            rows = self._summaries.fold(eid, base, evs, lambda x: self._summary(conn, x),
                                        lambda x, a, b: self._read_range(conn, x, a, b))  # fmt: skip
            out += [(eid, n, last, body) for n, body in rows or ()]
        cols = list(zip(*out, strict=True)) or [(), (), (), ()]
        return [_array(cols[0]), "{" + ",".join(map(str, cols[1])) + "}",
                           "{" + ",".join(map(str, cols[2])) + "}", _array(cols[3])]  # fmt: skip

    def _summary(
        self, conn: psycopg.Connection, execution_id: str
    ) -> tuple[int, list[tuple[int, Any]]] | None:
        rows = conn.execute(self._q("SELECT ord, last_sequence, body FROM {schema}.noetl_explain"
                                    " WHERE execution_id = %s ORDER BY ord"), (execution_id,)).fetchall()  # fmt: skip
        if not rows or rows[0][0] != 0:
            return None
        return int(rows[0][1]), [(int(r[0]), r[2]) for r in rows]

    def summary(self, execution_id: str) -> tuple[int, list[tuple[int, Any]]] | None:
        with self._pool.connection() as conn:
            return self._summary(conn, execution_id)

    def put_summary(
        self, execution_id: str, after: int | None, last: int, rows: list[tuple[int, str]]
    ) -> bool:
        with self._pool.connection() as conn, conn.transaction():
            got = conn.execute(self._q("SELECT last_sequence FROM {schema}.noetl_explain"
                                       " WHERE execution_id = %s AND ord = 0 FOR UPDATE"), (execution_id,)).fetchone()  # fmt: skip
            if (int(got[0]) if got else None) != after:  # written meanwhile: leave it
                return False
            conn.execute(
                self._q("DELETE FROM {schema}.noetl_explain WHERE execution_id = %s"), (execution_id,)
            )
            with conn.cursor() as cur:
                cur.executemany(self._q("INSERT INTO {schema}.noetl_explain (execution_id, ord, last_sequence, body)"
                                        " VALUES (%s, %s, %s, %s)"), [(execution_id, n, last, b) for n, b in rows])  # fmt: skip
        self._summaries.forget([execution_id])
        return True

    def read_range(self, execution_id: str, after_sequence: int, until_sequence: int) -> list[Event]:
        with self._pool.connection() as conn:
            return self._read_range(conn, execution_id, after_sequence, until_sequence)

    def _read_range(self, conn: psycopg.Connection, execution_id: str, after_sequence: int,
                    until_sequence: int) -> list[Event]:  # fmt: skip
        rows = conn.execute(
            self._q(
                "SELECT sequence, body::text FROM {schema}.noetl_event"
                " WHERE execution_id = %s AND sequence > %s AND sequence <= %s ORDER BY sequence"
            ),
            (execution_id, after_sequence, until_sequence),
        ).fetchall()
        out = [decode_body(b, f"{execution_id}#{seq}", self.skipped) for seq, b in rows]
        return [e for e in out if e is not None]

    def _append(self, events: Sequence[Event], *, check_existing: bool) -> list[Event]:
        self._summaries.forget({e.execution_id for e in events})  # not kept on this path: readers catch up
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (self._append_lock,))
            existing: dict[str, int] = {}
            if check_existing:
                ids = [e.event_id for e in events]
                cur.execute(
                    self._q("SELECT event_id, sequence FROM {schema}.noetl_event WHERE event_id = ANY(%s)"),
                    (ids,),
                )
                existing = dict(cur.fetchall())
            exec_ids = sorted({e.execution_id for e in events if e.event_id not in existing})
            next_seq: dict[str, int] = {}
            heads: dict[str, bytes | None] = {}
            if exec_ids:
                # the counter rows: created on first sight and locked for this transaction, in one statement
                cur.execute(
                    self._q(
                        "INSERT INTO {schema}.noetl_execution AS x (execution_id, status, last_sequence)"
                        " SELECT unnest(%s::text[]), '', 0"
                        " ON CONFLICT (execution_id) DO UPDATE SET last_sequence = x.last_sequence"
                        " RETURNING execution_id, last_sequence, head"
                    ),
                    (exec_ids,),
                )
                for eid, last, head in cur.fetchall():
                    next_seq[eid], heads[eid] = last, (bytes(head) if head is not None else None)
            rows, next_seq, exec_updates = sequence_batch(
                events, existing, next_seq.__getitem__, encode=False
            )
            hashes = chain_rows(rows, heads)  # under the lock: this transaction orders these events
            if rows:
                cur.executemany(
                    self._q(
                        "INSERT INTO {schema}.noetl_event (event_id, execution_id, sequence, name, ts, body, hash)"
                        " VALUES (%s, %s, %s, %s, %s, %s, %s)"
                    ),
                    [(*r[:5], dumps(r[5].to_stored()), h) for r, h in zip(rows, hashes, strict=True)],
                )
            for eid, (pb, status, fin, parent, ts) in exec_updates.items():
                cur.execute(
                    self._q(
                        "UPDATE {schema}.noetl_execution SET"
                        " playbook = COALESCE(%s, playbook),"
                        " status = CASE WHEN %s = '' THEN status ELSE %s END,"
                        " parent_execution_id = COALESCE(parent_execution_id, %s),"
                        " started_at = COALESCE(started_at, %s),"
                        " finished_at = COALESCE(%s, finished_at),"
                        " last_sequence = %s, head = %s"
                        " WHERE execution_id = %s"
                    ),
                    (pb, status or "", status or "", parent, ts, fin, next_seq[eid], heads[eid], eid),
                )
        for eid, seq in next_seq.items():
            if (head := heads[eid]) is not None:
                self._heads[eid] = (seq, head)
        return list(events)

    def read(self, execution_id: str, after_sequence: int = 0) -> list[Event]:
        with self._pool.connection() as conn:
            rows = conn.execute(
                self._q(
                    "SELECT sequence, body::text FROM {schema}.noetl_event"
                    " WHERE execution_id = %s AND sequence > %s ORDER BY sequence"
                ),
                (execution_id, after_sequence),
            ).fetchall()
        out = [decode_body(b, f"{execution_id}#{seq}", self.skipped) for seq, b in rows]
        return [e for e in out if e is not None]

    def read_chained(self, execution_id: str) -> list[tuple[int, Event | None, bytes | None]]:
        with self._pool.connection() as conn:
            rows = conn.execute(
                self._q(
                    "SELECT sequence, body::text, hash FROM {schema}.noetl_event"
                    " WHERE execution_id = %s ORDER BY sequence"
                ),
                (execution_id,),
            ).fetchall()
        return [(int(seq), decode_body(b, f"{execution_id}#{seq}", self.skipped),
                 bytes(h) if h is not None else None) for seq, b, h in rows]  # fmt: skip

    def tail(self, after_gid: int = 0, limit: int = 1000) -> list[StoredEvent]:
        while True:  # a batch made only of bad rows must not look like the end of the log
            with self._pool.connection() as conn:
                rows = conn.execute(
                    self._q(
                        "SELECT gid, body::text FROM {schema}.noetl_event WHERE gid > %s ORDER BY gid LIMIT %s"
                    ),
                    (after_gid, limit),
                ).fetchall()
            out = [StoredEvent(int(g), e) for g, b in rows if (e := decode_body(b, f"gid {g}", self.skipped))]
            if out or not rows:
                return out
            after_gid = int(rows[-1][0])

    def tail_last(self) -> int:
        with self._pool.connection() as conn:
            row = conn.execute(self._q("SELECT COALESCE(MAX(gid), 0) FROM {schema}.noetl_event")).fetchone()
        return int(row[0])

    def executions(self, limit: int = 100) -> list[ExecutionInfo]:
        with self._pool.connection() as conn:
            rows = conn.execute(
                self._q(
                    "SELECT execution_id, playbook, status, started_at, finished_at, parent_execution_id, last_sequence"
                    " FROM {schema}.noetl_execution ORDER BY started_at DESC NULLS LAST LIMIT %s"
                ),
                (limit,),
            ).fetchall()
        return [ExecutionInfo(r[0], r[1], r[2] or "unknown", r[3], r[4], r[5], int(r[6])) for r in rows]

    def acquire_lease(self, execution_id: str) -> None:
        self._leases.acquire(execution_id)

    def release_lease(self, execution_id: str) -> None:
        self._leases.release(execution_id)

    def close(self) -> None:
        self._leases.release_all()
        self._pool.close()

    def __repr__(self) -> str:
        return f"PostgresEventStore(schema={self.schema!r})"
