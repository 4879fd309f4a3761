"""Issue 19.3: group commit in the Postgres EventStore, on the machine's real PostgreSQL.

Flushes from many threads of one process that arrive while a statement is in flight go in
the next statement (one transaction, one commit); each caller returns only after its own
events are committed, gets the sequences it would have had alone, and a flush the server
refuses fails only its own caller. The server shows the coalescing: rows written by one
statement share one transaction id (``xmin``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import psycopg
import pytest

from noetl_dagster.engine.events import Event, uuid7
from noetl_dagster.storage.postgres_events import PostgresEventStore, split_schema

PG_ADMIN_URL = os.environ.get("NOETL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
ODD = ['q"uote', "back\\slash", "{brace},comma", "NULL", "", "ünï €", "line\nbreak", "\u2028", '\\"{}']


@pytest.fixture
def url():
    schema = "gc_" + uuid.uuid4().hex[:12]
    yield f"{PG_ADMIN_URL}?schema={schema}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _ev(x: str, name: str = "step.started", data: dict | None = None) -> Event:
    return Event(name, x, data or {"n": 1})


class _Held:
    """The store's append lock held from another session: the first round blocks on it, so the
    threads arriving meanwhile all queue for the next round."""

    def __init__(self, store: PostgresEventStore):
        self.conn = psycopg.connect(split_schema(store.url)[0], autocommit=True)
        self.schema = store.schema
        self.conn.execute("SELECT pg_advisory_lock(%s)", (store._append_lock,))

    def waiters(self) -> int:
        return self.conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'"
            " AND query LIKE %s",
            (f"%pg_advisory_xact_lock%{self.schema}%",),
        ).fetchone()[0]

    def release(self) -> None:
        self.conn.execute("SELECT pg_advisory_unlock_all()")
        self.conn.close()


def _wait(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _run_queued(store: PostgresEventStore, work: list) -> list:
    """Run each ``work`` item (a callable) on its own thread while the append lock is held; release
    once all of them are in the store (one leader blocked on the lock, the others queued)."""
    held = _Held(store)
    out: list = [None] * len(work)

    def run(i: int) -> None:
        try:
            out[i] = work[i]()
        except Exception as e:  # noqa: BLE001 - returned to the test
            out[i] = e

    ts = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(work))]
    for t in ts:
        t.start()
    try:  # one leader's statement waiting on the lock in the server, every other caller queued behind it
        _wait(
            lambda: (
                held.waiters() == 1 and store._group is not None and len(store._group._queue) == len(work) - 1
            )
        )
    finally:
        held.release()
    for t in ts:
        t.join(30)
    return out


def _xmins(store: PostgresEventStore, execs: list[str]) -> dict[str, set[int]]:
    with psycopg.connect(split_schema(store.url)[0], autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT execution_id, xmin::text FROM {store.schema}.noetl_event WHERE execution_id = ANY(%s)",
            (execs,),
        ).fetchall()
    out: dict[str, set[int]] = {}
    for x, xmin in rows:
        out.setdefault(x, set()).add(int(xmin))
    return out


def test_concurrent_flushes_share_one_commit_and_return_committed(url):
    store = PostgresEventStore(url)
    try:
        shared = uuid7()
        execs = [uuid7() for _ in range(10)]
        check = psycopg.connect(split_schema(url)[0], autocommit=True)
        lock = threading.Lock()

        def flush(x: str, i: int):
            def go():
                events = [
                    _ev(x, data={"i": i, "odd": ODD}),
                    _ev(x, "step.finished", data={"k": ODD[i % len(ODD)]}),
                ]
                store.append(events)
                with lock:  # committed before append returned: another session sees it at once
                    seen = check.execute(
                        f"SELECT count(*) FROM {store.schema}.noetl_event WHERE event_id = ANY(%s)",
                        ([e.event_id for e in events],),
                    ).fetchone()[0]
                return [e.sequence for e in events], seen

            return go

        work = [flush(x, i) for i, x in enumerate(execs)] + [flush(shared, 100 + i) for i in range(4)]
        results = _run_queued(store, work)
        check.close()
        assert all(not isinstance(r, Exception) for r in results), results
        assert all(seen == 2 for _, seen in results)
        assert all(seqs == [1, 2] for seqs, _ in results[:10])
        # the shared execution: four flushes of two, numbered gap-free in some order of the flushes
        assert sorted(s for seqs, _ in results[10:] for s in seqs) == list(range(1, 9))
        assert all(seqs[1] == seqs[0] + 1 for seqs, _ in results[10:])
        got = store.read(shared)
        assert [e.sequence for e in got] == list(range(1, 9))
        assert [e.data["odd"] for e in store.read(execs[3]) if "odd" in e.data] == [
            ODD
        ]  # array literals round-trip
        assert store.read(execs[4])[1].data == {"k": ODD[4]}
        # 14 callers, 2 statements: the leader's (blocked on the lock) and one for the 13 queued meanwhile
        xmins = _xmins(store, [*execs, shared])
        assert len(set().union(*xmins.values())) == 2
        assert store._group.rounds == 2 and store._group.largest == 13
        info = {i.execution_id: i for i in store.executions(limit=100)}
        assert info[shared].events == 8 and info[execs[0]].events == 2
    finally:
        store.close()


def test_a_resent_flush_in_a_round_keeps_its_sequences_and_the_others_commit(url):
    store = PostgresEventStore(url)
    try:
        x, y = uuid7(), uuid7()
        first = [_ev(x, data={"i": i}) for i in range(3)]
        store.append(first)
        again = [Event.from_dict({**e.to_dict(), "sequence": None}) for e in first[:2]]
        fresh = _ev(x, data={"i": 3})
        others = [[_ev(y, data={"j": j})] for j in range(5)]
        work = [lambda: store.append([again[1], fresh, again[0]])] + [
            lambda b=b: store.append(b) for b in others
        ]
        results = _run_queued(store, work)
        assert all(not isinstance(r, Exception) for r in results), results
        assert [again[1].sequence, fresh.sequence, again[0].sequence] == [2, 4, 1]
        assert [e.data["i"] for e in store.read(x)] == [0, 1, 2, 3]
        assert sorted(b[0].sequence for b in others) == [1, 2, 3, 4, 5]
        assert len(store.read(y)) == 5
    finally:
        store.close()


def test_a_flush_the_server_refuses_fails_only_its_own_caller(url):
    store = PostgresEventStore(url)
    try:
        good = [uuid7() for _ in range(4)]
        bad = _ev(uuid7(), "bad\x00name")  # text cannot hold NUL: refused for this flush only
        work = [lambda x=x: store.append([_ev(x)]) for x in good[:2]]
        work += [lambda: store.append([bad])] + [lambda x=x: store.append([_ev(x)]) for x in good[2:]]
        results = _run_queued(store, work)
        assert isinstance(results[2], psycopg.DataError), results[2]
        assert [r[0].sequence for i, r in enumerate(results) if i != 2] == [1, 1, 1, 1]
        assert all(len(store.read(x)) == 1 for x in good)
        assert store.read(bad.execution_id) == []
    finally:
        store.close()


class _Interrupted(Exception):
    pass


def _interrupt(*_):
    raise _Interrupted


def test_a_caller_interrupted_while_queued_does_not_strand_the_others(url):
    """Ctrl-C (here: SIGALRM raising) in a thread waiting for its round: it leaves the queue, so the
    round that ends next promotes a caller that is really waiting (not the one that gave up)."""
    store = PostgresEventStore(url)
    held = _Held(store)
    done: dict[str, list] = {}
    mine = _ev(uuid7())
    a = threading.Thread(target=lambda: done.setdefault("a", store.append([_ev(uuid7())])), daemon=True)
    a.start()
    _wait(lambda: held.waiters() == 1)  # a leads its round, blocked on the server lock

    def b_after_main():
        _wait(lambda: len(store._group._queue) == 1)  # queued behind the main thread's request
        done["b"] = store.append([_ev(uuid7())])

    b = threading.Thread(target=b_after_main, daemon=True)
    b.start()
    previous = signal.signal(signal.SIGALRM, _interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(_Interrupted):
            store.append([mine])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        held.release()
    a.join(10)
    b.join(10)
    try:
        assert set(done) == {"a", "b"}, "a caller was stranded"
        assert store.read(mine.execution_id) == []  # never sent: it left before any round took it
    finally:
        store.close()


def test_group_commit_can_be_turned_off(url, monkeypatch):
    monkeypatch.setenv("NOETL_PG_GROUP_COMMIT", "0")
    store = PostgresEventStore(url)
    try:
        assert store._group is None
        x = uuid7()
        store.append([_ev(x), _ev(x)])
        assert [e.sequence for e in store.read(x)] == [1, 2]
    finally:
        store.close()


WRITER = textwrap.dedent(
    """
    import sys, threading
    from noetl_dagster.engine.events import Event, uuid7
    from noetl_dagster.storage.postgres_events import PostgresEventStore
    store = PostgresEventStore(sys.argv[1])
    out = threading.Lock()
    def loop():
        x = uuid7()
        while True:
            events = [Event("step.started", x, {"pad": "p" * 2000}) for _ in range(3)]
            store.append(events)
            with out:
                sys.stdout.write(" ".join(e.event_id for e in events) + "\\n")
                sys.stdout.flush()
    for _ in range(8):
        threading.Thread(target=loop, daemon=True).start()
    threading.Event().wait()
    """
)


def test_kill_9_loses_nothing_an_append_returned_for(url, tmp_path):
    """Eight threads append in groups; every event whose append returned (printed) before the
    process was killed with SIGKILL is in the store."""
    PostgresEventStore(url).close()  # schema created outside the measured part
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    proc = subprocess.Popen([sys.executable, str(script), url], stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    _wait(lambda: len(lines) >= 60, timeout=20)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    reader.join(5)
    ids = [
        i for line in lines if line.endswith("\n") for i in line.split()
    ]  # a torn last line is not a claim
    assert len(ids) >= 180
    conninfo, schema = split_schema(url)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        found = conn.execute(
            f"SELECT count(*) FROM {schema}.noetl_event WHERE event_id = ANY(%s)", (ids,)
        ).fetchone()[0]
        rounds = conn.execute(
            f"SELECT count(DISTINCT xmin::text), count(*) FROM {schema}.noetl_event"
        ).fetchone()
    assert found == len(ids)
    assert rounds[0] < rounds[1] // 3  # flushes of 3 events were grouped: fewer commits than flushes


def test_one_execution_in_two_flushes_of_a_round_is_numbered_in_round_order(url):
    """The statement returns each execution's last sequence, and the client numbers its events back
    from it in the order the round sent them: two threads' flushes of one execution in one round,
    between other executions' flushes, get the numbers the server stored, in that order."""
    from noetl_dagster.storage.postgres_events import _Batch

    store = PostgresEventStore(url)
    try:
        store.append([_ev("x"), _ev("x")])  # x is at 2 before the round
        first = [_ev("x", data={"k": i}) for i in range(3)]
        other = [_ev("y"), _ev("y")]
        second = [_ev("x", data={"k": 3 + i}) for i in range(2)]
        got = store._append_one_statement([_Batch(first), _Batch(other), _Batch(second)])
        assert [[e.sequence for e in b] for b in got] == [[3, 4, 5], [1, 2], [6, 7]]
        stored = store.read("x")
        assert [e.sequence for e in stored] == [1, 2, 3, 4, 5, 6, 7]
        assert [e.event_id for e in stored[2:]] == [e.event_id for e in first + second]
        assert [e.sequence for e in store.read("y")] == [1, 2]
    finally:
        store.close()
