"""SQLite rows keep the envelope (event id, execution, sequence, name, timestamp) in their columns
only, not again in the JSON body (issue 19: a step's commit writes ~40 % fewer bytes); rows
written before that, with full bodies, read back the same."""

from __future__ import annotations

import sqlite3

from noetl_dagster.engine.events import ENVELOPE_COLUMNS, Event, uuid7
from noetl_dagster.storage.events import SqliteEventStore
from noetl_dagster.util.jsonutil import dumps, loads


def test_a_row_body_leaves_the_envelope_to_the_columns_and_reads_back_whole(tmp_path):
    store = SqliteEventStore(tmp_path / "e.db")
    try:
        x = uuid7()
        sent = [Event("task.done", x, {"result": {"k": "é\u2028", "n": 2**70}}, step="s", attempt=1, status="error"),
                Event("step.done", x, {}, step="s", parent_execution_id="p", tenant_id="t")]  # fmt: skip
        store.append(sent)
        for (body,) in store._conn.execute("SELECT body FROM noetl_event ORDER BY gid"):
            assert not set(loads(body)) & set(ENVELOPE_COLUMNS)
        assert [e.to_dict() for e in store.read(x)] == [e.to_dict() for e in sent]
        assert [s.event.to_dict() for s in store.tail(0, 10)] == [e.to_dict() for e in sent]
    finally:
        store.close()


def test_rows_with_full_bodies_from_before_read_back_the_same(tmp_path):
    store = SqliteEventStore(tmp_path / "e.db")
    try:
        x = uuid7()
        old = Event("task.done", x, {"v": 1}, step="s", sequence=1)
        raw = sqlite3.connect(tmp_path / "e.db", isolation_level=None)
        raw.execute(
            "INSERT INTO noetl_event (event_id, execution_id, sequence, name, ts, body) VALUES (?,?,?,?,?,?)",
            (old.event_id, x, 1, old.name, old.timestamp, dumps(old.to_stored())),
        )
        raw.close()
        new = Event("step.done", x, {"v": 2}, step="s")
        store.append([new])
        got = store.read(x)
        assert [e.to_dict() for e in got] == [old.to_dict(), new.to_dict()]
        assert [s.gid for s in store.tail(0, 10)] == [1, 2]
    finally:
        store.close()
