"""The SQLite store keeps each execution's last sequence between its own appends (issue 19: one
SELECT of three subqueries less per engine step) and trusts it only while PRAGMA data_version
says no other connection committed since."""

from __future__ import annotations

import sqlite3

from noetl_dagster.engine.events import Event, uuid7
from noetl_dagster.storage.events import SQLITE_MIGRATIONS, SqliteEventStore


def _ev(eid: str, i: int) -> Event:
    return Event("task.done", eid, {"i": i}, step="s")


def _lookups(store: SqliteEventStore) -> list[str]:
    seen: list[str] = []
    store._conn.set_trace_callback(lambda sql: seen.append(sql) if "MAX(sequence)" in sql else None)
    return seen


def test_steady_appends_of_one_connection_do_not_re_read_the_last_sequence(tmp_path):
    store = SqliteEventStore(tmp_path / "e.db")
    try:
        x = uuid7()
        lookups = _lookups(store)
        for i in range(50):
            store.append([_ev(x, 2 * i), _ev(x, 2 * i + 1)])
        assert len(lookups) == 1  # the first append asks the log; the other 49 know
        assert [e.sequence for e in store.read(x)] == list(range(1, 101))
    finally:
        store.close()


def test_another_connections_commit_invalidates_the_cache(tmp_path):
    a, b = SqliteEventStore(tmp_path / "e.db"), SqliteEventStore(tmp_path / "e.db")
    a.segment_min = b.segment_min = 5  # segments and rows interleaved, from both connections
    try:
        x = uuid7()
        lookups = _lookups(a)
        i = 0
        for rnd in range(12):
            for store in (a, b) if rnd % 2 else (b, a):
                n = 6 if (rnd + i) % 3 == 0 else 2  # 6 events: one segment row
                store.append([_ev(x, i + k) for k in range(n)])
                i += n
        assert (
            len(lookups) == 6
        )  # a asks again exactly when b committed since its last append (b a | a b | ...)
        assert [e.sequence for e in a.read(x)] == list(range(1, i + 1))
        assert [e.data["i"] for e in b.read(x)] == list(range(i))
        # rows and segments of both connections share one gap-free global cursor, in commit order
        assert [(s.gid, s.event.data["i"]) for s in b.tail(0, 10_000)] == [(g + 1, g) for g in range(i)]
        # a raw write by a third connection (another process) is seen too
        raw = sqlite3.connect(tmp_path / "e.db", isolation_level=None)
        raw.execute(
            "INSERT INTO noetl_event (event_id, execution_id, sequence, name, ts, body) VALUES (?,?,?,?,?,?)",
            (uuid7(), x, i + 1, "task.done", "2026-11-27T00:00:00+00:00",
             f'{{"event_id":"r","execution_id":"{x}","timestamp":"t","name":"task.done"}}'),
        )  # fmt: skip
        raw.close()
        a.append([_ev(x, 999)])
        assert a.read(x)[-1].sequence == i + 2
    finally:
        a.close()
        b.close()


def test_a_resent_batch_and_a_failed_append_leave_the_cache_right(tmp_path):
    store = SqliteEventStore(tmp_path / "e.db")
    try:
        x = uuid7()
        first = [_ev(x, 0), _ev(x, 1)]
        store.append(first)
        store.append([first[1], _ev(x, 2)])  # one re-sent: the IntegrityError path
        bad = _ev(x, 3)
        bad.data = {"cycle": None}
        bad.data["cycle"] = bad.data  # cannot be encoded: the append fails and rolls back
        try:
            store.append([_ev(x, 3), bad])
        except (ValueError, TypeError):
            pass
        store.append([_ev(x, 4)])
        assert [e.sequence for e in store.read(x)] == [1, 2, 3, 4]
        assert [e.data["i"] for e in store.read(x)] == [0, 1, 2, 4]
    finally:
        store.close()


def test_a_new_file_assigns_gids_without_autoincrement_and_without_a_lookup_per_append(tmp_path):
    store = SqliteEventStore(tmp_path / "e.db")
    try:
        ddl = store._conn.execute("SELECT sql FROM sqlite_master WHERE name = 'noetl_event'").fetchone()[0]
        assert "AUTOINCREMENT" not in ddl  # no sqlite_sequence page written per append (issue 19)
        x = uuid7()
        gid_lookups: list[str] = []
        store._conn.set_trace_callback(lambda sql: gid_lookups.append(sql) if "MAX(gid)" in sql else None)
        for i in range(30):
            store.append([_ev(x, i)])
        assert len(gid_lookups) == 1
        assert [s.gid for s in store.tail(0, 100)] == list(range(1, 31))
    finally:
        store.close()


def test_a_file_from_before_keeps_autoincrement_and_one_ordered_cursor(tmp_path):
    """A store file created with the AUTOINCREMENT table: rows and segments from two connections
    still number after each other, and sqlite_sequence (which an older writer reads) keeps up."""
    path = tmp_path / "old.db"
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("CREATE TABLE noetl_schema_version (version INTEGER NOT NULL)")
    for stmt in SQLITE_MIGRATIONS[0]:
        raw.execute(stmt.replace("gid INTEGER PRIMARY KEY,", "gid INTEGER PRIMARY KEY AUTOINCREMENT,"))
    raw.execute("INSERT INTO noetl_schema_version VALUES (1)")
    raw.close()
    a, b = SqliteEventStore(path), SqliteEventStore(path)
    a.segment_min = b.segment_min = 4
    try:
        assert a._autoincrement and b._autoincrement
        x, i = uuid7(), 0
        for n, store in [(2, a), (5, b), (1, a), (4, a), (3, b), (6, a), (1, b)]:
            store.append([_ev(x, i + k) for k in range(n)])
            i += n
        assert [(s.gid, s.event.data["i"]) for s in a.tail(0, 100)] == [(g + 1, g) for g in range(i)]
        seq = a._conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'noetl_event'").fetchone()[0]
        assert seq == i
        # an older writer (AUTOINCREMENT numbering) appends after the segments
        raw = sqlite3.connect(path, isolation_level=None)
        raw.execute(
            "INSERT INTO noetl_event (event_id, execution_id, sequence, name, ts, body) VALUES (?,?,?,?,?,?)",
            (
                uuid7(),
                x,
                i + 1,
                "task.done",
                "t",
                '{"event_id":"o","execution_id":"x","timestamp":"t","name":"task.done"}',
            ),
        )
        raw.close()
        assert a.tail(0, 100)[-1].gid == i + 1
        a.append([_ev(x, 99)])
        assert [s.gid for s in a.tail(i, 100)] == [i + 1, i + 2]
    finally:
        a.close()
        b.close()
