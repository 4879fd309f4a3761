"""SEMANTICS §7: the event envelope, the taxonomy, the SQLite EventStore
(gap-free sequence, idempotent append, append-only), big bodies as references,
and replay of the events alone — for a failing execution too."""

from __future__ import annotations

import sqlite3
import uuid
from datetime import datetime

import pytest

from noetl_dagster.engine import events as E
from noetl_dagster.engine.events import Event
from noetl_dagster.engine.replay import diff_snapshots, replay
from noetl_dagster.runners.local import FINISHED_HOOKS
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.storage.events import SqliteEventStore

HEAD = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: ev, path: tests/ev}
"""

MIXED = (
    HEAD
    + """
workflow:
  - step: start
    loop: {in: "{{ [1, 2] }}", iterator: n}
    tool:
      - t:
          kind: noop
          result: "{{ iter.n }}"
          set: {iter.seen: 1}
    set: {ctx.total: "{{ start.stats.total }}"}
    next:
      spec: {mode: inclusive}
      arcs: [{step: a}, {step: gated}]
  - step: a
    tool: {kind: noop}
  - step: gated
    spec:
      policy:
        admit:
          rules:
            - else:
                then: {allow: false}
    tool: {kind: noop}
"""
)

ENVELOPE = {
    "event_id", "sequence", "execution_id", "parent_execution_id", "timestamp", "source", "name", "entity",
    "entity_id", "status", "step", "step_run_id", "task_run_id", "loop_id", "iteration", "attempt",
    "tenant_id", "project_id", "schema_version", "data",
}  # fmt: skip


def test_every_event_has_the_full_envelope(run_pb):
    r = run_pb(MIXED)
    assert r.status == "completed"
    for ev in r.events:
        d = ev.to_dict()
        assert set(d) == ENVELOPE
        assert uuid.UUID(d["event_id"]).version == 7
        assert d["execution_id"] == r.result.execution_id
        assert d["schema_version"] == "noetl.event.v1"
        assert d["tenant_id"] == "default" and d["project_id"] == "default"
        assert d["status"] in ("in_progress", "success", "error")
        assert d["entity"] in ("playbook", "workflow", "step", "task", "loop", "next", "token")
        assert d["entity_id"]
        assert datetime.fromisoformat(d["timestamp"]).utcoffset().total_seconds() == 0
        assert isinstance(d["data"], dict)


def test_sequence_is_gap_free_and_timestamps_ordered(run_pb):
    r = run_pb(MIXED)
    assert [e.sequence for e in r.events] == list(range(1, len(r.events) + 1))
    stamps = [e.timestamp for e in r.events]
    assert stamps == sorted(stamps)


def test_sources_split_server_and_worker(run_pb):
    r = run_pb(MIXED)
    server = {E.EXECUTION_REQUESTED, E.WORKFLOW_STARTED, E.TOKEN_ENQUEUED, E.STEP_SCHEDULED, E.STEP_SKIPPED,
              E.NEXT_EVALUATED, E.WORKFLOW_FINISHED, E.PLAYBOOK_PROCESSED}  # fmt: skip
    for ev in r.events:
        assert ev.source == ("server" if ev.name in server else "worker"), ev.name
    assert {e.source for e in r.events} == {"server", "worker"}


def test_taxonomy_and_lifecycle_order(run_pb):
    r = run_pb(MIXED)
    names = [e.name for e in r.events]
    assert set(names) <= E.ALL_EVENT_NAMES
    for needed in ("playbook.execution.requested", "workflow.started", "token.enqueued", "step.scheduled",
                   "step.started", "task.started", "task.done", "loop.started", "loop.iteration.started",
                   "loop.iteration.done", "loop.done", "ctx.patched", "step.done", "next.evaluated",
                   "step.skipped", "workflow.finished", "playbook.processed"):  # fmt: skip
        assert needed in names, needed
    assert names[:3] == ["playbook.execution.requested", "workflow.started", "token.enqueued"]
    assert names[-2:] == ["workflow.finished", "playbook.processed"]
    # per step run: scheduled < started < done < next.evaluated
    for srid in {e.step_run_id for e in r.events if e.name == "step.scheduled"}:
        seq = [e.name for e in r.events if e.step_run_id == srid and e.name in
               ("step.scheduled", "step.started", "step.done", "next.evaluated")]  # fmt: skip
        assert seq == ["step.scheduled", "step.started", "step.done", "next.evaluated"]


def test_task_and_loop_events_carry_their_ids(run_pb):
    r = run_pb(MIXED)
    for ev in r.named("task.done", "start"):
        assert ev.task_run_id and ev.step_run_id and ev.attempt == 1
        assert ev.loop_id and ev.iteration in (0, 1)
        assert ev.entity == "task" and ev.entity_id == ev.task_run_id
    started = r.named("task.started")
    assert {e.task_run_id for e in started} == {e.task_run_id for e in r.named("task.done")}
    loop_ids = {e.loop_id for e in r.events if e.name.startswith("loop.")}
    assert len(loop_ids) == 1
    ctx = r.named("ctx.patched")[0]
    assert ctx.data["patch"] == {"total": 2} and ctx.step == "start"
    assert ctx.entity == "workflow" and ctx.entity_id == r.result.execution_id
    assert r.named("token.enqueued")[0].data.keys() >= {"token_id", "step", "args", "from_step"}


def test_execution_requested_data(run_pb):
    r = run_pb(MIXED, {"k": 1})
    d = r.named("playbook.execution.requested")[0].data
    assert d["playbook"] == "tests/ev" and d["name"] == "ev"
    assert d["workload"] == {"k": 1} and d["parent_execution_id"] is None
    assert r.named("workflow.started")[0].data["workload"] == {"k": 1}


def test_listeners_see_every_event_after_it_is_durable(run_pb):
    seen: list[Event] = []
    r = run_pb(MIXED, listeners=[seen.append])
    assert [e.event_id for e in seen] == [e.event_id for e in r.events]
    assert all(e.sequence for e in seen)


def test_tenant_and_project_are_recorded(run_pb):
    r = run_pb(MIXED, tenant="acme", project="p1")
    assert {(e.tenant_id, e.project_id) for e in r.events} == {("acme", "p1")}


# -- the store ------------------------------------------------------------------


def test_store_append_is_idempotent_on_event_id(run_pb):
    r = run_pb(MIXED)
    store = open_event_store(r.result.event_store_url)
    try:
        before = store.read(r.result.execution_id)
        resent = [Event.from_dict(e.to_dict()) for e in before[:5]]
        for e in resent:
            e.sequence = None
        store.append(resent)
        after = store.read(r.result.execution_id)
        assert len(after) == len(before)
        assert [e.sequence for e in resent] == [1, 2, 3, 4, 5]  # the stored sequence is kept
    finally:
        store.close()


def test_store_assigns_gap_free_sequences_per_execution(tmp_path):
    store = SqliteEventStore(tmp_path / "ev.db")
    a = [Event("workflow.started", "exec-a") for _ in range(3)]
    b = [Event("workflow.started", "exec-b") for _ in range(2)]
    store.append([a[0], b[0], a[1]])
    store.append([b[1], a[2], a[0]])  # a[0] again: dropped
    assert [e.sequence for e in store.read("exec-a")] == [1, 2, 3]
    assert [e.sequence for e in store.read("exec-b")] == [1, 2]
    assert [e.sequence for e in store.read("exec-a", after_sequence=1)] == [2, 3]
    assert [s.event.execution_id for s in store.tail()] == ["exec-a", "exec-b", "exec-a", "exec-b", "exec-a"]
    store.close()


def test_store_is_append_only(run_pb):
    r = run_pb(MIXED)
    conn = sqlite3.connect(r.result.event_store_url.removeprefix("sqlite:///"))
    try:
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            conn.execute("UPDATE noetl_event SET name = 'x'")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            conn.execute("DELETE FROM noetl_event")
        n = conn.execute(
            "SELECT COUNT(*) FROM noetl_event WHERE execution_id = ?", (r.result.execution_id,)
        ).fetchone()[0]
        assert n == len(r.events)
    finally:
        conn.close()


def test_executions_index(run_pb):
    r = run_pb(MIXED)
    with open_event_store(r.result.event_store_url) as store:
        (info,) = [i for i in store.executions() if i.execution_id == r.result.execution_id]
    assert info.status == "completed" and info.playbook == "tests/ev"
    assert info.events == len(r.events) and info.finished_at


# -- big bodies -------------------------------------------------------------------


def test_big_results_are_stored_as_references_and_resolved(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool:
      kind: python
      code: "result = {'blob': 'x' * 200000}"
    next: {arcs: [{step: use}]}
  - step: use
    tool: {kind: noop, result: "{{ start.blob | length }}"}
"""
    )
    assert r.status == "completed"
    done = r.named("step.done", "start")[0].data["result"]
    assert set(done) == {"$ref"}
    assert {"uri", "size", "checksum"} <= set(done["$ref"])
    assert r.results["use"] == 200000
    assert r.results["start"]["blob"] == "x" * 200000  # resolved for the caller
    assert max(len(str(e.data)) for e in r.events) < 70_000


# -- replay ----------------------------------------------------------------------


def _live_snapshot(run_pb, text, workload=None):
    captured = []
    FINISHED_HOOKS.append(lambda eng: captured.append(eng.state.snapshot()))
    try:
        r = run_pb(text, workload)
    finally:
        FINISHED_HOOKS.pop()
    return r, captured[-1]


def test_replay_rebuilds_state_of_a_completed_execution(run_pb):
    r, live = _live_snapshot(run_pb, MIXED)
    with open_event_store(r.result.event_store_url) as store:
        state = replay(store, r.result.execution_id)
    assert diff_snapshots(live, state.snapshot()) == []
    assert state.status == "completed" and state.ctx == {"total": 2}
    assert state.runs == {"start": 1, "a": 1}
    assert state.step_status["gated"] == "skipped"
    assert not state.tokens and not state.running


FAILING = (
    HEAD
    + """
workflow:
  - step: start
    tool:
      - ok: {kind: noop, set: {ctx.before: 1}}
      - bad:
          kind: python
          code: "raise RuntimeError('kaput')"
    next: {arcs: [{step: never, when: "{{ event.name == 'call.done' }}"}]}
  - step: never
    tool: {kind: noop}
"""
)


def test_failing_execution_has_a_complete_replayable_log(run_pb):
    r, live = _live_snapshot(run_pb, FAILING)
    assert r.status == "failed"
    names = [e.name for e in r.events]
    assert names[-2:] == ["workflow.finished", "playbook.processed"]
    assert "step.failed" in names
    assert [e.sequence for e in r.events] == list(range(1, len(r.events) + 1))
    with open_event_store(r.result.event_store_url) as store:
        state = replay(store, r.result.execution_id)
    assert diff_snapshots(live, state.snapshot()) == []
    assert state.status == "failed" and state.failed
    assert state.ctx == {"before": 1}
    assert state.results["start"]["status"] == "error"
    assert "kaput" in state.results["start"]["error"]["message"]


def test_replay_of_a_prefix_shows_pending_tokens_and_running_steps(run_pb):
    r = run_pb(MIXED)
    events = r.events
    from noetl_dagster.engine.state import fold

    cut = next(i for i, e in enumerate(events) if e.name == "step.scheduled")
    st = fold(events[:cut])  # token enqueued, not yet scheduled
    assert [t.step for t in st.tokens.values()] == ["start"]
    st = fold(events[: cut + 1])
    assert not st.tokens and list(st.running.values()) == ["start"]
    mid = next(i for i, e in enumerate(events) if e.name == "loop.iteration.done")
    st = fold(events[: mid + 1])
    (pos,) = st.loops.values()
    assert pos.done == {0} and not pos.finished


def test_replay_of_unknown_execution_is_an_error(data_dir):
    with open_event_store(None, data_dir=data_dir) as store, pytest.raises(KeyError):
        replay(store, "no-such-execution")


def test_replay_detects_a_tampered_state(run_pb):
    r, live = _live_snapshot(run_pb, MIXED)
    live = {**live, "ctx": {"total": 3}}
    with open_event_store(r.result.event_store_url) as store:
        assert diff_snapshots(live, replay(store, r.result.execution_id).snapshot()) == ["ctx"]
