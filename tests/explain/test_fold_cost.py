"""The summary's fold skips work the summary does not need (issue 36 follow-up: the fold made the
cheapest steps ~1.15-1.5x slower). Counted, not timed, on a real run's log: an inline step result
is not put through the usage lines, a repeated short value is digested once, and the engine's
ISO times are parsed once per second - with the same figures as the plain parse."""

from __future__ import annotations

import dataclasses
from datetime import datetime

import pytest

from noetl_dagster.engine import explain as ex
from noetl_dagster.engine import usage_lines as ul
from noetl_dagster.engine.explain_summary import rebuild, state_rows
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.events import SqliteEventStore

STEPS = 60


@pytest.fixture(scope="module")
def cycle_log(tmp_path_factory):
    d = tmp_path_factory.mktemp("cycle")
    pb = d / "cycle.yaml"
    pb.write_text(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: cycle, path: tests/cycle}\n"
        f"workload: {{n: {STEPS}}}\n"
        "workflow:\n"
        "  - step: spin\n    tool: {kind: noop}\n    set: {ctx.i: '{{ (ctx.i or 0) + 1 }}'}\n"
        "    next: {arcs: [{step: spin, when: '{{ ctx.i < workload.n }}'}]}\n"
    )
    res = run_playbook(pb, event_store=f"sqlite:///{d / 'events.db'}", data_dir=d)
    assert res.status == "completed" and res.runs["spin"] == STEPS
    store = SqliteEventStore(str(d / "events.db"))
    try:
        return store.read(res.execution_id)
    finally:
        store.close()


def _counting(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)

    def wrapper(*a, **k):
        calls.append(a)
        return real(*a, **k)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def test_inline_results_are_not_put_through_the_usage_lines(cycle_log, monkeypatch):
    refs = _counting(monkeypatch, ul, "created_refs")
    rebuild(cycle_log)
    assert sum(e.name == "step.done" for e in cycle_log) == STEPS
    # was one per task.done, workflow.finished, playbook.processed and step.done: {"status": "noop"}
    # names no stored object, and a terminal event none at all
    assert len(refs) == 0


def test_repeated_short_values_are_digested_once(cycle_log, monkeypatch):
    monkeypatch.setattr(ex, "_DIGESTS", {}, raising=False)
    digests = _counting(monkeypatch, ex, "checksum")
    f = rebuild(cycle_log)
    assert len(f.order) == STEPS
    assert (
        len(digests) <= 4
    )  # {} (args), {"status": "noop"} (results), the request's workload: not 2 per step
    assert len(state_rows(f, everything=True)) == STEPS + 1


class _CountingDatetime(datetime):
    parses = 0

    @classmethod
    def fromisoformat(cls, s):  # type: ignore[override]
        _CountingDatetime.parses += 1
        return datetime.fromisoformat(s)


def test_engine_times_are_parsed_once_per_second_and_equal_the_plain_parse(cycle_log, monkeypatch):
    timed = [e.timestamp for e in cycle_log if e.name not in ex._UNTIMED]  # noqa: SLF001
    assert all(ex._ms(ts) == datetime.fromisoformat(ts).timestamp() * 1000.0 for ts in timed)  # noqa: SLF001
    monkeypatch.setattr(ex, "_SECONDS", {}, raising=False)
    monkeypatch.setattr(ex, "datetime", _CountingDatetime)
    _CountingDatetime.parses = 0
    rebuild(cycle_log)
    seconds = {ts[:19] for ts in timed}
    assert len(timed) > 4 * STEPS
    assert _CountingDatetime.parses <= len(seconds)  # was one per timed event
    # another form (no microseconds, another offset) still parses, the plain way
    assert (
        ex._ms("2026-01-02T03:04:05+02:00")
        == datetime.fromisoformat("2026-01-02T03:04:05+02:00").timestamp() * 1000
    )  # noqa: SLF001


def test_finished_runs_are_held_as_their_rows_and_thaw_for_a_late_event(cycle_log, monkeypatch):
    """A run past next.evaluated is kept as its summary row (a string: no garbage-collector work, made
    once); an event for it afterwards (a late attempt's task.done) thaws it. Rows and explanation equal
    those of a fold that never freezes."""
    first = next(e for e in cycle_log if e.name == "task.done")
    late = dataclasses.replace(first, sequence=cycle_log[-1].sequence + 1, event_id="late-task-done")
    events = [*cycle_log, late]
    frozen = rebuild(events)
    assert sum(type(r) is str for r in frozen.order) == STEPS - 1  # all but the one the late event thawed
    rows = state_rows(frozen, everything=True)
    data = frozen.result().data
    assert not frozen.frozen and all(type(r) is not str for r in frozen.order)  # result() thaws them all
    monkeypatch.setattr(ex.Explainer, "_freeze", lambda self, run: None)
    plain = rebuild(events)
    assert all(type(r) is not str for r in plain.order)
    assert rows == state_rows(plain, everything=True)
    assert data == plain.result().data
    assert len(data["runs"][0]["attempts"]) == 2  # the late attempt counted on its run
