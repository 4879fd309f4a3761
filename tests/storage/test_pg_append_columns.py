"""The Postgres append sends the event columns as five text parameters split by the server
(``string_to_array`` at the ASCII record separator), not as array literals escaped value by value
in Python (issue 35: that escaping was ~15 % of a flush's client CPU). Every value still
round-trips; a value that cannot be split is refused in the caller's thread, before group commit,
so it never fails another caller's flush."""

from __future__ import annotations

import os
import uuid

import psycopg
import pytest

from noetl_dagster.engine.events import Event
from noetl_dagster.storage.postgres_events import SEP, PostgresEventStore, _Batch

PG_ADMIN_URL = os.environ.get("NOETL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
ODD = [
    'q"uote',
    "back\\slash",
    "{brace},comma",
    "NULL",
    "",
    "ünï €",
    "line\nbreak",
    "\u2028",
    '\\"{}',
    "rs\x1ehere",
]


@pytest.fixture
def store():
    schema = "cols_" + uuid.uuid4().hex[:12]
    s = PostgresEventStore(f"{PG_ADMIN_URL}?schema={schema}")
    yield s
    s.close()
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_event_columns_are_five_joined_text_parameters():
    events = [Event("step.started", "exec-1", {"a": 1}), Event("step.done", "exec-2", {"b": ODD})]
    params = _Batch(events).params(7)
    cols = params[-5:]
    assert all(isinstance(c, str) and not c.startswith("{") for c in cols[:4])  # not array literals
    assert cols[0].split(SEP) == [e.event_id for e in events] and cols[1].split(SEP) == ["exec-1", "exec-2"]
    assert cols[2].split(SEP) == ["step.started", "step.done"] and len(cols[4].split(SEP)) == 2


def test_odd_values_round_trip(store):
    execs = [f"exec {c}" for c in ODD if c and SEP not in c]  # quotes, backslashes, braces, unicode in ids
    for eid in execs:
        store.append([Event("step.started", eid, {"odd": ODD}), Event("step.done", eid, {"k": "\x1e" + eid})])
    store.append(
        [Event("step.started", eid, {"n": i}) for i, eid in enumerate(execs)]
    )  # many executions, one flush
    for i, eid in enumerate(execs):
        got = store.read(eid)
        assert [e.sequence for e in got] == [1, 2, 3]
        assert got[0].data == {"odd": ODD} and got[1].data == {"k": "\x1e" + eid} and got[2].data == {"n": i}


@pytest.mark.parametrize("bad", ["exec\x1eid", ""])
def test_an_unsplittable_id_is_refused_before_the_round(store, bad):
    with pytest.raises(ValueError, match="record separator"):
        store.append([Event("step.started", bad, {"n": 1})])
    store.append([Event("step.started", "fine", {"n": 1})])  # the store goes on
    assert [e.sequence for e in store.read("fine")] == [1]


def test_the_stored_body_is_the_event_with_its_sequence_first(store):
    """The body is encoded without its sequence and the server writes ``{"sequence":N,`` in front:
    the stored text is the event's compact form with the sequence as its first key."""
    from noetl_dagster.util.jsonutil import dumps

    ev = Event("step.done", "exec-body", {"result": {"x": ODD}})
    store.append([Event("step.started", "exec-body", {}), ev])
    with store._pool.connection() as conn:
        body = conn.execute(
            store._q("SELECT body::text FROM {schema}.noetl_event WHERE event_id = %s"), (ev.event_id,)
        ).fetchone()[0]
    assert ev.sequence == 2
    assert body == dumps({"sequence": 2, **ev.to_stored()})


def test_the_size_limit_counts_the_stored_sequence(store, monkeypatch):
    """An event is refused at the size the store keeps, sequence included, as before the body was
    encoded without it (``check_event_size``)."""
    from noetl_dagster.engine import recorder
    from noetl_dagster.storage import postgres_events
    from noetl_dagster.util.jsonutil import dumps

    ev = Event("step.done", "exec-size", {"pad": "x" * 100})
    size = len(dumps({"sequence": None, **ev.to_stored()}))
    for module in (recorder, postgres_events):
        monkeypatch.setattr(module, "MAX_EVENT_BYTES", size)
    store.append([ev])  # exactly at the limit: kept
    over = Event("step.done", "exec-size", {"pad": "x" * 101})
    with pytest.raises(Exception, match="too large|bytes"):
        store.append([over])
    assert [e.event_id for e in store.read("exec-size")] == [ev.event_id]


def test_the_executions_index_rows_of_a_flush():
    """Per execution: the latest playbook, status and finish of the flush win, the first parent and
    timestamp seen stay, and the count is its events (the counter adds it to the last sequence)."""
    a = [
        Event("playbook.execution.requested", "exec-a", {"playbook": "pb/a"}, parent_execution_id="p",
              timestamp="t1"),
        Event("workflow.started", "exec-a", {}, timestamp="t2"),
        Event("step.started", "exec-b", {}, timestamp="t3"),
        Event("step.done", "exec-a", {}, timestamp="t4"),
        Event("workflow.finished", "exec-a", {"status": "failed"}, timestamp="t5"),
    ]  # fmt: skip
    params = _Batch(a).params(7)
    assert params[0] == 7
    assert params[1:8] == (
        '{"exec-a","exec-b"}',
        '{"pb/a",NULL}',  # playbook
        '{"failed",""}',  # status ('' keeps the stored one)
        '{"t5",NULL}',  # finished_at
        '{"p",NULL}',  # parent
        '{"t1","t3"}',  # started_at: the first event's
        "{4,1}",  # events per execution
    )
