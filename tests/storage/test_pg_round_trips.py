"""Round trips to the real Postgres (127.0.0.1:5432), counted on the wire (issue 35).

A client's CPU per execution grows with every blocking wait for the server (docs/capacity.md:
~0.15-0.3 ms of client CPU per wait at load, against ~15 us for psycopg's own work), so these are
guards that fail when a change adds one: each five-step execution is one statement per flush (seven,
no prepare after the first), and opening a store whose schema is current is one connection and one
round trip (it was two connections and six: a probe connection, then the pool's, and the migration
check in a locked transaction). ``benchmarks/pgwire.WireCounter`` forwards the bytes unchanged and
counts the frontend messages.
"""

from __future__ import annotations

import os
import uuid

import psycopg
import pytest
import yaml

from benchmarks.bench_throughput import EFFECT_PLAYBOOK, PLAYBOOK
from benchmarks.pgwire import WireCounter
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.postgres_events import MIGRATIONS, PostgresEventStore

PG_URL = os.environ.get("NOETL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture
def wire():
    schema = "rt_" + uuid.uuid4().hex[:12]
    with WireCounter() as wc:
        yield wc, wc.url(f"{PG_URL}?schema={schema}")
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _delta(wc: WireCounter, before) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {k: v for k, v in (wc.snapshot() - before).items() if k != "X"}  # X: a closed store's goodbye


def test_opening_a_current_store_is_one_connection_and_one_round_trip(wire):
    wc, url = wire
    PostgresEventStore(url).close()  # creates the schema
    before = wc.snapshot()
    store = PostgresEventStore(url)
    try:
        assert _delta(wc, before) == {"connections": 1, "Q": 1, "round_trips": 1}
        assert store.schema_version() == len(MIGRATIONS)
    finally:
        store.close()


def test_a_new_schema_is_still_migrated_under_the_lock(wire):
    wc, url = wire
    store = PostgresEventStore(url)
    try:
        assert store.schema_version() == len(MIGRATIONS)
        assert wc.snapshot()["connections"] == 1  # the checked connection is the pool's first
    finally:
        store.close()


@pytest.mark.parametrize(
    ("playbook", "per_execution"),
    [
        (PLAYBOOK, 2),  # pure steps (issue 46): the request, then everything else at the end
        # python steps with effects: the request, a barrier before each effect (the one before b and c
        # also holds the previous step's end), one before `end` (c's end), the end
        (EFFECT_PLAYBOOK, 6),
    ],
    ids=["pure", "effects"],
)
def test_a_five_step_execution_is_one_round_trip_per_flush(wire, tmp_path, playbook, per_execution):
    wc, url = wire
    path = tmp_path / "five_steps.yaml"
    path.write_text(yaml.safe_dump(playbook, sort_keys=False))
    store = PostgresEventStore(url)
    flushes = 0
    append = store.append

    def counting(events):  # type: ignore[no-untyped-def]
        nonlocal flushes
        flushes += 1
        return append(events)

    store.append = counting  # type: ignore[method-assign]
    try:
        run_playbook(path, event_store=store, data_dir=tmp_path)  # the append statement is prepared here
        flushes = 0
        before = wc.snapshot()
        for _ in range(3):
            assert run_playbook(path, event_store=store, data_dir=tmp_path).status == "completed"
        sent = _delta(wc, before)
    finally:
        store.close()
    assert flushes == 3 * per_execution  # (it was 7: the request, five steps, the end)
    # one Bind/Execute/Sync per flush: no prepare again, no new connection, no other statement
    assert sent == {"B": flushes, "D": flushes, "E": flushes, "S": flushes, "round_trips": flushes}
