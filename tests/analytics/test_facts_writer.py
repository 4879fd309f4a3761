"""The fact writer and the exporter on synthetic event streams shaped like the
engine's: totals equal what the events say, re-sending changes nothing, a crash
between insert and cursor update is harmless, odd values never stop an export."""

from __future__ import annotations

from collections import Counter

import pytest
from facts_helpers import fact_totals

from noetl_analytics.exporter import FactExporter
from noetl_analytics.facts import FactWriter
from noetl_analytics.synthetic import SyntheticSpec, generate
from noetl_dagster.engine import events as E
from noetl_dagster.engine.events import Event
from noetl_dagster.storage.events import SqliteEventStore


def log_totals(events: list[Event]) -> dict[str, int]:
    """The same totals counted straight from the events."""
    names = Counter(e.name for e in events)
    refs = {}
    for e in events:
        for value in (e.data.get("result"), (e.data.get("outcome") or {}).get("result")):
            if isinstance(value, dict) and "$ref" in value:
                refs[value["$ref"]["uri"]] = value["$ref"]["size"]
    return {
        "executions": names[E.EXECUTION_REQUESTED],
        "failed_executions": sum(
            e.name == E.WORKFLOW_FINISHED and e.data.get("status") == "failed" for e in events
        ),
        "step_runs": names[E.STEP_DONE] + names[E.STEP_FAILED],
        "failed_steps": names[E.STEP_FAILED],
        "task_attempts": names[E.TASK_DONE],
        "failed_attempts": sum(
            e.name == E.TASK_DONE and e.data["outcome"]["status"] == "error" for e in events
        ),
        "iterations": names[E.LOOP_ITERATION_DONE] + names[E.LOOP_ITERATION_FAILED],
        "bytes": sum(refs.values()),
    }


SPEC = SyntheticSpec(executions=40, steps=5, retry_rate=0.3, fail_rate=0.1, ref_rate=0.5)


def test_fact_totals_equal_the_event_totals(facts_store):
    events = list(generate(SPEC))
    expected = log_totals(events)
    assert expected["failed_executions"] > 0 and expected["bytes"] > 0  # the fixture exercises both
    counts = FactWriter(facts_store, batch_events=97).write(events)  # odd batch size: many Arrow batches
    assert counts["task_fact"] == expected["task_attempts"]
    assert fact_totals(facts_store) == expected


def test_rewriting_the_same_events_changes_no_total(facts_store):
    events = list(generate(SPEC))
    writer = FactWriter(facts_store)
    writer.write(events)
    first = fact_totals(facts_store)
    writer.write(events)  # a full re-export
    writer.write(events[100:300])  # and a partial one
    assert fact_totals(facts_store) == first
    # without FINAL the copies are there until ClickHouse merges the parts; a merge removes them
    raw = f"SELECT count() FROM {facts_store.table('task_fact')}"
    assert facts_store.client.query(raw, settings={"final": 0}).result_rows[0][0] > first["task_attempts"]
    facts_store.command("OPTIMIZE TABLE $db.task_fact FINAL")
    assert facts_store.client.query(raw, settings={"final": 0}).result_rows[0][0] == first["task_attempts"]


def test_rows_keep_what_the_events_carry(facts_store):
    events = list(generate(SyntheticSpec(executions=3, steps=3, retry_rate=1.0, fail_rate=0.0)))
    FactWriter(facts_store).write(events)
    attempts = facts_store.query_dicts(
        "SELECT attempt, status, directive, retryable FROM $db.task_fact WHERE step = 's0' ORDER BY ts"
    )
    # retry_rate=1: every task fails once (retryable, directive retry) then succeeds
    assert [(a["attempt"], a["status"], a["directive"]) for a in attempts[:2]] == [
        (1, "error", "retry"),
        (2, "ok", "continue"),
    ]
    assert attempts[0]["retryable"] == 1
    cpu = facts_store.query_dicts("SELECT runtime_ms, cpu_seconds, units FROM $db.compute_fact LIMIT 5")
    for row in cpu:  # no cpu_ms reported: CPU-seconds = runtime x units
        assert row["cpu_seconds"] == pytest.approx(row["runtime_ms"] / 1000)
        assert row["units"] == 1.0


def test_malformed_values_are_coerced_not_fatal(facts_store):
    eid = "exe-odd"
    odd = [
        Event(E.EXECUTION_REQUESTED, eid, data={"playbook": 42, "name": None}),
        Event(
            E.TASK_DONE,
            eid,
            step="s",
            attempt=None,
            data={
                "task": "t",
                "kind": "python",
                "directive": {"do": "jump", "to": "x"},
                "outcome": {"status": "ok", "meta": {"duration_ms": "12.5", "attempt": "2", "units": "two"}},
            },
        ),
        Event(E.TASK_DONE, eid, step="s", data={"outcome": "not a mapping"}),
        Event(
            E.STEP_DONE,
            eid,
            step="s",
            data={"duration_ms": None, "result": {"$ref": {"uri": "file:///x", "size": "9"}}},
        ),
        Event(E.LOOP_DONE, eid, step="s", loop_id="L", data={"result": {"stats": {"total": -1, "ok": True}}}),
        Event(E.WORKFLOW_FINISHED, eid, data=["not", "a", "dict"]),  # type: ignore[arg-type]
    ]
    counts = FactWriter(facts_store).write(odd)
    assert counts["execution_fact"] == 2 and counts["task_fact"] == 2 and counts["resource_fact"] == 1
    rows = facts_store.query_dicts(
        "SELECT attempt, duration_ms, directive FROM $db.task_fact ORDER BY attempt DESC"
    )
    assert rows[0] == {"attempt": 2, "duration_ms": 12.5, "directive": "jump"}
    assert (
        facts_store.scalar("SELECT playbook FROM $db.execution_fact WHERE transition = 'requested'") == "42"
    )
    assert facts_store.scalar("SELECT size_bytes FROM $db.resource_fact") == 9
    assert (
        facts_store.scalar("SELECT units FROM $db.compute_fact WHERE task = 't'") == 1.0
    )  # unparseable -> default


@pytest.fixture
def event_log(tmp_path):
    log = SqliteEventStore(tmp_path / "events.db")
    yield log
    log.close()


def test_exporter_tails_from_the_stored_cursor(facts_store, event_log):
    events = list(generate(SPEC))
    half = len(events) // 2
    event_log.append(events[:half])
    exporter = FactExporter(facts_store, event_log, batch_events=250)
    first = exporter.export()
    assert (first.cursor_before, first.cursor_after, first.events, first.lag_events) == (0, half, half, 0)
    event_log.append(events[half:])
    behind, age = exporter.lag()
    assert behind == len(events) - half and age > 0
    second = FactExporter(facts_store, event_log).export()  # a new exporter finds the stored cursor
    assert second.cursor_before == half and second.events == len(events) - half
    assert fact_totals(facts_store) == log_totals(events)
    assert FactExporter(facts_store, event_log).export().events == 0


def test_max_events_bounds_one_export_and_reports_lag(facts_store, event_log):
    events = list(generate(SPEC))
    event_log.append(events)
    report = FactExporter(facts_store, event_log, batch_events=100).export(max_events=250)
    assert report.events == 250 and report.cursor_after == 250
    assert report.lag_events == len(events) - 250 and report.lag_seconds > 0


class _CrashAfterInsert(FactExporter):
    """Dies the first time it would store the cursor: facts inserted, cursor not."""

    crashed = False

    def save_cursor(self, value: int) -> None:
        if not self.crashed:
            self.crashed = True
            raise SystemExit("crash between insert and cursor update")
        super().save_cursor(value)


def test_crash_between_insert_and_cursor_update_resends_without_double_counting(facts_store, event_log):
    events = list(generate(SPEC))
    event_log.append(events)
    crashing = _CrashAfterInsert(facts_store, event_log, batch_events=300)
    with pytest.raises(SystemExit):
        crashing.export()
    assert crashing.cursor() == 0  # the batch is in ClickHouse, the cursor is not
    assert fact_totals(facts_store)["task_attempts"] > 0
    report = FactExporter(facts_store, event_log, batch_events=300).export()
    assert report.cursor_before == 0 and report.events == len(events)  # the first batch is sent again
    assert fact_totals(facts_store) == log_totals(events)
