"""One contract, two adapters: every test runs on SQLite and on the machine's real PostgreSQL."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import uuid

import psycopg
import pytest

from noetl_dagster.engine.events import Event, uuid7
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.storage.events import EventStoreTooNew, SqliteEventStore
from noetl_dagster.storage.postgres_events import (
    MIGRATIONS,
    EventStoreUnavailable,
    PostgresEventStore,
    split_schema,
)
from noetl_dagster.util.jsonutil import dumps

PG_ADMIN_URL = os.environ.get("NOETL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
STORE_DB = "noetl_dagster_store_test" + os.environ.get("PYTEST_XDIST_WORKER", "")  # one per xdist worker


@pytest.fixture(scope="session")
def pg_store_db() -> str:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (STORE_DB,)).fetchone():
            try:
                conn.execute(f'CREATE DATABASE "{STORE_DB}"')
            except psycopg.errors.DuplicateDatabase:
                pass
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + STORE_DB


class Backend:
    """Opens stores on one location (a SQLite file, or a fresh Postgres schema) and runs raw SQL there."""

    def __init__(self, kind: str, location: str):
        self.kind = kind
        self.location = location
        self.opened: list = []

    def open(self):
        store = (
            SqliteEventStore(self.location) if self.kind == "sqlite" else PostgresEventStore(self.location)
        )
        self.opened.append(store)
        return store

    def raw(self, statement: str) -> None:
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.location)
            try:
                conn.execute(statement)
                conn.commit()
            finally:
                conn.close()
        else:
            conninfo, schema = split_schema(self.location)
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute(f"SET search_path TO {schema}")
                conn.execute(statement)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request, tmp_path):
    if request.param == "sqlite":
        b = Backend("sqlite", str(tmp_path / "events.db"))
        yield b
        for s in b.opened:
            s.close()
        return
    url = request.getfixturevalue("pg_store_db")
    schema = "t_" + uuid.uuid4().hex[:12]
    b = Backend("postgres", f"{url}?schema={schema}")
    yield b
    for s in b.opened:
        s.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


def ev(execution_id: str, name: str = "step.started", **kw) -> Event:
    return Event(name, execution_id, kw.pop("data", {"n": 1}), **kw)


def test_append_assigns_gap_free_sequences_and_reads_in_order(backend):
    store = backend.open()
    x = uuid7()
    batch = [ev(x, data={"i": i}) for i in range(5)]
    store.append(batch)
    assert [e.sequence for e in batch] == [1, 2, 3, 4, 5]
    store.append([ev(x, data={"i": 5})])
    got = store.read(x)
    assert [e.sequence for e in got] == [1, 2, 3, 4, 5, 6]
    assert [e.data["i"] for e in got] == [0, 1, 2, 3, 4, 5]
    assert [e.sequence for e in store.read(x, after_sequence=4)] == [5, 6]
    assert got[0].to_dict() == {**batch[0].to_dict(), "sequence": 1}


def test_sequences_are_per_execution(backend):
    store = backend.open()
    a, b = uuid7(), uuid7()
    mixed = [ev(a), ev(b), ev(a), ev(b), ev(b)]
    store.append(mixed)
    assert [e.sequence for e in mixed] == [1, 1, 2, 2, 3]


def test_idempotent_on_event_id(backend):
    store = backend.open()
    x = uuid7()
    first = [ev(x, data={"i": i}) for i in range(3)]
    store.append(first)
    again = [Event.from_dict({**e.to_dict(), "sequence": None}) for e in first]
    fresh = ev(x, data={"i": 3})
    store.append([again[1], fresh, again[0]])
    assert [again[1].sequence, fresh.sequence, again[0].sequence] == [2, 4, 1]
    assert [e.data["i"] for e in store.read(x)] == [0, 1, 2, 3]
    store.append(first)  # a whole batch re-sent
    assert len(store.read(x)) == 4
    dup = ev(x)
    store.append([dup, dup])  # the same event twice in one batch
    assert [e.sequence for e in store.read(x)][-1] == 5 and len(store.read(x)) == 5


def test_data_round_trips_unicode_nesting_and_odd_values(backend):
    store = backend.open()
    x = uuid7()
    data = {
        "text": "naïve — 日本 \u0000 nul",
        "nested": {"l": [1, 2.5, None, True]},
        "z_last": 1,
        "a_first": 2,
    }
    store.append([ev(x, data=data)])
    back = store.read(x)[0].data
    assert back == data and list(back) == list(data)


@pytest.mark.parametrize("statement", ["UPDATE noetl_event SET name = 'x'", "DELETE FROM noetl_event"])
def test_append_only(backend, statement):
    store = backend.open()
    store.append([ev(uuid7())])
    with pytest.raises((sqlite3.DatabaseError, psycopg.Error), match="append-only"):
        backend.raw(statement)


def test_concurrent_writers_to_one_execution_leave_no_gaps(backend):
    x = uuid7()
    stores = [backend.open() for _ in range(4)]  # separate connections, as separate processes would have
    errors: list[BaseException] = []

    def write(store, k):
        try:
            for i in range(25):
                store.append([ev(x, data={"w": k, "i": i}), ev(x, data={"w": k, "i": i, "b": 1})])
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=write, args=(stores[k % 4], k)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    seqs = [e.sequence for e in stores[0].read(x)]
    assert seqs == list(range(1, 8 * 25 * 2 + 1))


def test_tail_cursor_sees_every_event_once_while_writers_run(backend):
    writer_a, writer_b, reader = backend.open(), backend.open(), backend.open()
    ids = [uuid7(), uuid7()]
    done = threading.Event()
    seen: list[str] = []

    def write(store, x):
        for i in range(40):
            store.append([ev(x, data={"i": i})])

    def tail():
        cursor = 0
        while True:
            finished = done.is_set()
            for row in reader.tail(cursor, 7):
                assert row.gid > cursor
                cursor = row.gid
                seen.append(row.event.event_id)
            if finished and reader.tail_last() == cursor:
                return

    t_reader = threading.Thread(target=tail)
    t_reader.start()
    writers = [
        threading.Thread(target=write, args=(s, x)) for s, x in zip((writer_a, writer_b), ids, strict=True)
    ]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    done.set()
    t_reader.join(timeout=30)
    assert len(seen) == 80 and len(set(seen)) == 80


def test_tail_iter_all_and_tail_last(backend):
    store = backend.open()
    assert store.tail_last() == 0 and store.tail() == []
    a, b = uuid7(), uuid7()
    store.append([ev(a), ev(b), ev(a)])
    rows = store.tail()
    assert [r.event.execution_id for r in rows] == [a, b, a]
    assert rows == sorted(rows, key=lambda r: r.gid)
    assert store.tail_last() == rows[-1].gid
    assert [r.gid for r in store.tail(rows[0].gid, limit=1)] == [rows[1].gid]
    assert [r.event.event_id for r in store.iter_all(batch=2)] == [r.event.event_id for r in rows]


def test_executions_index(backend):
    store = backend.open()
    parent, child = uuid7(), uuid7()
    store.append(
        [
            Event(
                "playbook.execution.requested",
                parent,
                {"playbook": "tests/p"},
                timestamp="2026-01-01T00:00:00+00:00",
            )
        ]
    )
    store.append(
        [
            Event(
                "playbook.execution.requested",
                child,
                {"playbook": "tests/c"},
                parent_execution_id=parent,
                timestamp="2026-01-01T00:00:01+00:00",
            ),
            Event("workflow.started", child, {}),
        ]
    )
    infos = {i.execution_id: i for i in store.executions()}
    assert (
        infos[parent].status == "requested"
        and infos[parent].playbook == "tests/p"
        and infos[parent].events == 1
    )
    assert (
        infos[child].status == "running"
        and infos[child].parent_execution_id == parent
        and infos[child].events == 2
    )
    store.append(
        [
            Event("workflow.started", parent, {}),
            Event("workflow.finished", parent, {"status": "failed"}, timestamp="2026-01-01T00:00:09+00:00"),
        ]
    )
    infos = store.executions()
    assert [i.execution_id for i in infos] == [child, parent]  # most recent start first
    p = infos[1]
    assert (p.status, p.finished_at, p.started_at, p.events) == (
        "failed",
        "2026-01-01T00:00:09+00:00",
        "2026-01-01T00:00:00+00:00",
        3,
    )
    assert len(store.executions(limit=1)) == 1


def test_reopening_keeps_events_and_does_not_rerun_migrations(backend):
    store = backend.open()
    x = uuid7()
    store.append([ev(x)])
    store.close()
    again = backend.open()
    assert len(again.read(x)) == 1
    again.append([ev(x)])
    assert [e.sequence for e in again.read(x)] == [1, 2]
    if isinstance(again, PostgresEventStore):
        assert again.schema_version() == len(MIGRATIONS)


def test_empty_append(backend):
    assert backend.open().append([]) == []


def test_open_event_store_dispatches_on_the_url(pg_store_db, tmp_path):
    schema = "t_" + uuid.uuid4().hex[:12]
    store = open_event_store(f"{pg_store_db}?schema={schema}")
    try:
        assert isinstance(store, PostgresEventStore) and store.schema == schema
    finally:
        store.close()
        with psycopg.connect(pg_store_db, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    assert isinstance(open_event_store(f"sqlite:///{tmp_path}/e.db"), SqliteEventStore)


def test_postgres_migrations_race_safely(pg_store_db):
    schema = "t_" + uuid.uuid4().hex[:12]
    url = f"{pg_store_db}?schema={schema}"
    opened, errors = [], []

    def open_one():
        try:
            opened.append(PostgresEventStore(url))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors and opened[0].schema_version() == len(MIGRATIONS)
    finally:
        for s in opened:
            s.close()
        with psycopg.connect(pg_store_db, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def test_postgres_unreachable_is_a_clear_error():
    with pytest.raises(
        EventStoreUnavailable,
        match=r"cannot reach the Postgres event store at postgresql://u:\*\*\*@127\.0\.0\.1:1/.*Connection refused",
    ) as info:
        PostgresEventStore("postgresql://u:hunter2@127.0.0.1:1/postgres?schema=x")
    assert "hunter2" not in str(info.value)


def test_split_schema():
    assert split_schema("postgresql+psycopg://u@h:5/db?schema=s1&sslmode=disable") == (
        "postgresql://u@h:5/db?sslmode=disable",
        "s1",
    )
    assert split_schema("postgresql://u@h/db") == ("postgresql://u@h/db", "noetl")
    # libpq reads %20, not '+', as a space: the fsync policy of docs/capacity.md goes through options
    assert split_schema("postgresql://u@h/db?options=-c%20synchronous_commit%3Doff&schema=s")[0] == (
        "postgresql://u@h/db?options=-c%20synchronous_commit%3Doff"
    )


def test_synchronous_commit_off_reaches_the_store_connections(pg_store_db):
    schema = "t_" + uuid.uuid4().hex[:12]
    store = PostgresEventStore(f"{pg_store_db}?schema={schema}&options=-c%20synchronous_commit%3Doff")
    try:
        with store._pool.connection() as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "off"
        x = uuid7()
        store.append([ev(x), ev(x)])
        assert [e.sequence for e in store.read(x)] == [1, 2]
    finally:
        store.close()
        with psycopg.connect(pg_store_db, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def test_engine_runs_and_replays_on_the_store(backend, tmp_path):
    """A real execution recorded in the store; the suite's conftest replays it from there."""
    from noetl_dagster.dsl import load_playbook_dict
    from noetl_dagster.runners.local import run_playbook

    pb = load_playbook_dict(
        {
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": {"name": "store_probe", "path": "tests/store_probe"},
            "workflow": [
                {
                    "step": "start",
                    "tool": {"kind": "python", "code": "result = {'n': 1}"},
                    "next": {"arcs": [{"step": "loop"}]},
                },
                {
                    "step": "loop",
                    "loop": {"in": "{{ [1, 2, 3] }}", "iterator": "x", "spec": {"mode": "parallel"}},
                    "tool": {"kind": "python", "input": {"x": "{{ iter.x }}"}, "code": "result = x * 2"},
                },
            ],
        }
    )
    store = backend.open()
    res = run_playbook(pb, event_store=store, data_dir=tmp_path / "home")
    assert res.status == "completed"
    events = store.read(res.execution_id)
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert events[0].name == "playbook.execution.requested" and events[-1].name == "playbook.processed"
    assert {i.execution_id: i.status for i in store.executions()}[res.execution_id] == "completed"


def test_stored_bodies_are_compact_and_read_back_whole(backend):
    """Issue 19: bodies leave out what ``from_dict`` restores (None, defaults, derived source/entity),
    a data value holding the literal '"sequence":null' does not confuse the Postgres numbering, and
    every field, defaults and non-defaults alike, reads back as it was emitted."""
    store = backend.open()
    x = uuid7()
    plain = ev(x, "loop.iteration.started", status="in_progress", step="s", loop_id="l", iteration=0, data={})
    odd = ev(x, "task.done", data={"sequence": None, "s": '{"sequence":null,'}, tenant_id="t", project_id="p",
             parent_execution_id="parent", attempt=2, source="server", entity="custom")  # fmt: skip
    store.append([plain, odd])
    got = store.read(x)
    assert [g.to_dict() for g in got] == [plain.to_dict(), odd.to_dict()]
    assert [g.sequence for g in got] == [1, 2]
    stored = plain.to_stored()
    assert set(stored) == {
        "event_id",
        "sequence",
        "execution_id",
        "timestamp",
        "name",
        "step",
        "loop_id",
        "iteration",
        "status",
    }
    assert len(dumps(stored)) < 0.7 * len(dumps(plain.to_dict()))


def test_a_store_written_by_a_newer_version_is_refused_not_appended_to(backend, tmp_path):
    """A schema version above what this build knows means a newer layout (e.g. store-numbered gids
    since issue 19): opening it is a clear error, and the CLI says so in one line (exit 2)."""
    backend.open().close()
    backend.raw("INSERT INTO noetl_schema_version (version) VALUES (99)")
    with pytest.raises(EventStoreTooNew, match="schema version 99"):
        backend.open()
    url = backend.location if backend.kind != "sqlite" else f"sqlite:///{backend.location}"
    r = subprocess.run(
        [sys.executable, "-m", "noetl_dagster.commands.main", "executions", "--event-store", url],
        capture_output=True, text=True, timeout=120, env={**os.environ, "NOETL_DAGSTER_HOME": str(tmp_path)},
    )  # fmt: skip
    assert r.returncode == 2 and "schema version 99" in r.stderr and "Traceback" not in r.stderr, r.stderr
