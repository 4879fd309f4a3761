"""Durability at side effects (issue 46, docs/events.md): pure steps between two barriers are one
commit; before a task with an effect outside the execution everything recorded so far is durable.

The effect here is a python task that reads the SQLite event log through its own connection (another
reader, as after a kill): what it sees is what a killed process would have left."""

from __future__ import annotations

import sqlite3

import pytest

from noetl_dagster.dsl.kinds import PURE_KINDS, PURE_WHEN_MARKED, is_pure
from noetl_dagster.dsl.parse import PlaybookInvalid, load_playbook_dict
from noetl_dagster.dsl.serialize import playbook_to_raw
from noetl_dagster.engine import events as E
from noetl_dagster.engine.control import Engine, Services
from noetl_dagster.runners.local import build_services, run_playbook
from noetl_dagster.storage.events import SqliteEventStore
from tests.engine.engine_helpers import dedent, read_events

PROBE = dedent(
    """
    apiVersion: noetl.io/v2
    kind: Playbook
    metadata: {name: probe, path: tests/probe}
    workflow:
      - step: start
        tool: {kind: rhai, code: "40 + 2"}
        next: {arcs: [{step: look}]}
      - step: look
        tool:
          kind: python
          PURE
          input: {db: "{{ workload.db }}", eid: "{{ execution_id }}"}
          code: |
            import sqlite3
            c = sqlite3.connect(db)
            result = [r[0] for r in c.execute(
                "SELECT name FROM noetl_event WHERE execution_id = ? ORDER BY sequence", (eid,))]
            c.close()
        next: {arcs: [{step: end}]}
      - step: end
        tool: {kind: noop}
    """
)


def _probe(tmp_path, pure: bool) -> tuple[list[str], list[str]]:
    path = tmp_path / "probe.yaml"
    path.write_text(PROBE.replace("PURE", "pure: true" if pure else "pure: false"))
    data = tmp_path / "data"
    res = run_playbook(path, {"db": str(data / "events.db")}, data_dir=data)
    assert res.status == "completed", res
    return res.results["look"], [e.name for e in read_events(res)]


def test_before_a_task_with_an_effect_everything_recorded_is_durable(tmp_path):
    seen, events = _probe(tmp_path, pure=False)
    # the pure step before it and the task's own start are in the log when the effect runs
    upto = events.index(E.TASK_STARTED, events.index(E.STEP_STARTED, events.index(E.STEP_DONE)))
    assert seen == events[: upto + 1]
    assert E.STEP_DONE in seen and seen[-1] == E.TASK_STARTED


def test_pure_steps_between_barriers_are_not_committed_one_by_one(tmp_path):
    seen, events = _probe(tmp_path, pure=True)
    # marked pure: no barrier, so the rhai step's events wait with the rest for the end
    assert seen == [E.EXECUTION_REQUESTED, E.WORKFLOW_STARTED, E.TOKEN_ENQUEUED]
    assert E.STEP_DONE in events


class CountingStore(SqliteEventStore):
    """The real SQLite store, counting its appends (each one transaction) and barriers."""

    def __init__(self, path):  # type: ignore[no-untyped-def]
        super().__init__(path)
        self.appends: list[list[str]] = []
        self.barriers: list[bool] = []

    def append(self, events):  # type: ignore[no-untyped-def]
        self.appends.append([e.name for e in events])
        return super().append(events)

    def barrier(self, durable: bool = True) -> None:
        self.barriers.append(durable)


FIVE = dedent(
    """
    apiVersion: noetl.io/v2
    kind: Playbook
    metadata: {name: five, path: tests/five}
    workflow:
      - {step: start, tool: {kind: noop}, next: {arcs: [{step: a}]}}
      - {step: a, tool: {kind: rhai, code: "1"}, next: {arcs: [{step: b}]}}
      - {step: b, tool: {kind: python, KIND_B code: "result = 2"}, next: {arcs: [{step: c}]}}
      - {step: c, tool: {kind: flow_input, literal: 3}, next: {arcs: [{step: end}]}}
      - {step: end, tool: {kind: noop}}
    """
)


@pytest.mark.parametrize("durable", [False, True])
def test_a_pure_five_step_execution_is_two_appends(tmp_path, durable):
    path = tmp_path / "five.yaml"
    path.write_text(FIVE.replace("KIND_B", "pure: true,"))
    store = CountingStore(tmp_path / "e.db")
    svc = build_services(event_store=store, data_dir=tmp_path)
    svc.durable = durable
    try:
        res = run_playbook(path, services=svc)
        assert res.status == "completed"
        if durable:  # --durable: today's commit per step boundary, and every barrier asks for fsync
            assert len(store.appends) == 7 and set(store.barriers) == {True}
        else:  # the request, then the five steps and the end in one batch
            assert len(store.appends) == 2 and set(store.barriers) == {False}
            assert store.appends[0] == [E.EXECUTION_REQUESTED, E.WORKFLOW_STARTED, E.TOKEN_ENQUEUED]
            assert store.appends[1][-1] == E.PLAYBOOK_PROCESSED
        assert len(store.barriers) == len(store.appends)
    finally:
        store.close()


def test_an_effect_is_a_boundary_and_its_end_is_durable_before_the_next_step_runs(tmp_path):
    path = tmp_path / "five.yaml"
    path.write_text(FIVE.replace("KIND_B", ""))
    store = CountingStore(tmp_path / "e.db")
    try:
        res = run_playbook(path, services=build_services(event_store=store, data_dir=tmp_path))
        assert res.status == "completed"
        # the request; before b's task (start and a grouped, b's start); before c runs (b's end);
        # the end
        assert len(store.appends) == 4
        before_b, after_b = store.appends[1], store.appends[2]
        assert before_b[-1] == E.TASK_STARTED and before_b.count(E.STEP_DONE) == 2
        assert after_b[0] == E.TASK_DONE and E.STEP_DONE in after_b and after_b[-1] == E.STEP_SCHEDULED
    finally:
        store.close()


def test_the_kind_catalogue_says_which_kinds_are_pure():
    assert PURE_KINDS == {"noop", "rhai", "flow_input", "flow_guard"}
    assert PURE_WHEN_MARKED == {"python", "duckdb"}
    assert is_pure("rhai") and is_pure("python", True) and is_pure("duckdb", True)
    assert not is_pure("python") and not is_pure("http", True) and not is_pure("shell")


def _task(body: str) -> dict:
    return {
        "apiVersion": "noetl.io/v2",
        "kind": "Playbook",
        "metadata": {"name": "p", "path": "t/p"},
        "workflow": [{"step": "start", "tool": body}],
    }


@pytest.mark.parametrize(
    ("tool", "message"),
    [
        ({"kind": "python", "code": "result = 1", "pure": "yes"}, "`pure` must be true or false"),
        ({"kind": "http", "url": "http://x", "pure": True}, "kind 'http' has effects"),
        ({"kind": "shell", "command": "true", "pure": True}, "`pure: true` is for duckdb, python tasks"),
    ],
)
def test_pure_is_validated_with_its_rule_and_path(tool, message):
    with pytest.raises(PlaybookInvalid) as ei:
        load_playbook_dict(_task(tool))
    text = str(ei.value)
    assert "task-pure" in text and message in text and "pure" in text


def test_pure_round_trips_and_goes_to_no_tool_config():
    pb = load_playbook_dict(_task({"kind": "python", "code": "result = 1", "pure": True}))
    task = pb.step("start").tool[0]
    assert task.pure and "pure" not in task.config
    again = load_playbook_dict(playbook_to_raw(pb))
    assert again.step("start").tool[0].pure


def test_a_store_that_refuses_the_barrier_fails_the_execution_not_the_task(tmp_path):
    """The barrier before an effect is the engine's: a store that refuses it ends the execution
    through the durability gate (recorded as failed), and the effect never runs."""
    marker = tmp_path / "effect-ran"
    path = tmp_path / "p.yaml"
    path.write_text(
        dedent(
            f"""
            apiVersion: noetl.io/v2
            kind: Playbook
            metadata: {{name: refuse, path: tests/refuse}}
            workflow:
              - step: start
                tool: {{kind: python, code: "open({str(marker)!r}, 'w').write('x'); result = 1"}}
            """
        )
    )

    class Refusing(SqliteEventStore):
        calls = 0

        def barrier(self, durable: bool = True) -> None:
            Refusing.calls += 1
            if Refusing.calls == 2:  # the request's barrier passes; the one before the effect fails
                raise OSError(28, "No space left on device")

    store = Refusing(tmp_path / "e.db")
    try:
        svc: Services = build_services(event_store=store, data_dir=tmp_path)
        pb = load_playbook_dict(__import__("yaml").safe_load(path.read_text()))
        eng = Engine(pb, svc)
        eng.start({})
        status = eng.drive()
        assert status == "failed" and not marker.exists()
        names = [e.name for e in store.read(eng.execution_id)]
        assert names[-1] == E.PLAYBOOK_PROCESSED
        failed = [e for e in store.read(eng.execution_id) if e.name == E.STEP_FAILED]
        assert failed and failed[0].data["error"]["kind"] == "storage_full"
    finally:
        store.close()
    assert sqlite3.connect(tmp_path / "e.db").execute("SELECT COUNT(*) FROM noetl_event").fetchone()[0] > 0


@pytest.mark.parametrize("pure", [True, False])
def test_an_event_the_store_refuses_fails_its_own_step_run_when_a_later_barrier_finds_it(tmp_path, pure):
    """Grouped steps are appended at a later barrier (the end, or before the next step's code after an
    effect): the step run whose event the store refuses still ends failed with the error, not the step
    that happened to run the barrier, and the execution ends failed."""
    path = tmp_path / "p.yaml"
    path.write_text(
        dedent(
            f"""
            apiVersion: noetl.io/v2
            kind: Playbook
            metadata: {{name: refused, path: tests/refused}}
            workflow:
              - step: start
                tool: {{kind: python, pure: {str(pure).lower()}, code: "result = 2 ** 30000"}}
                next: {{arcs: [{{step: after}}]}}
              - step: after
                tool: {{kind: rhai, code: "1"}}
            """
        )
    )
    res = run_playbook(path, data_dir=tmp_path / "d")
    assert res.status == "failed"
    assert res.results["start"]["error"]["kind"] == "internal_error"
    names = [e.name for e in read_events(res)]
    assert names[-2:] == [E.WORKFLOW_FINISHED, E.PLAYBOOK_PROCESSED] and E.STEP_FAILED in names


def test_an_effect_s_end_is_durable_before_the_next_pure_step_runs(tmp_path):
    """A step run with an effect is routed behind a barrier: a pure step after it (which would run
    without one) already finds its end in the log, so a kill there cannot make the effect run again."""
    path = tmp_path / "p.yaml"
    path.write_text(
        dedent(
            """
            apiVersion: noetl.io/v2
            kind: Playbook
            metadata: {name: after_effect, path: tests/after_effect}
            workflow:
              - step: start
                tool: {kind: python, code: "result = {'effect': True}"}
                next: {arcs: [{step: look}]}
              - step: look
                tool:
                  kind: python
                  pure: true
                  input: {db: "{{ workload.db }}", eid: "{{ execution_id }}"}
                  code: |
                    import sqlite3
                    c = sqlite3.connect(db)
                    result = [r for r in c.execute(
                        "SELECT name, body FROM noetl_event WHERE execution_id = ? ORDER BY sequence", (eid,))]
                    result = [n for n, _ in result]
                    c.close()
            """
        )
    )
    db = tmp_path / "events.db"
    res = run_playbook(path, {"db": str(db)}, event_store=f"sqlite:///{db}", data_dir=tmp_path)
    assert res.status == "completed"
    seen = res.results["look"]
    assert seen.count(E.STEP_DONE) == 1 and E.NEXT_EVALUATED in seen  # start's end and routing
    assert E.STEP_STARTED not in seen[seen.index(E.NEXT_EVALUATED) :]  # look's own start is not yet
