"""The token-routing sensor: detached requests, per-step tokens, joins, runs
that died, run keys, and bad input reported without stopping the others."""

from __future__ import annotations

import json
import logging

import dagster as dg
import pytest
from dagster_helpers import EXAMPLES, events_of

from noetl_dagster.engine import events as E
from noetl_dagster.engine.control import Engine
from noetl_dagster.engine.events import Event
from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.resources.runtime import forget_engines
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.sensors.router import RouterCursor, instance_run_lookup, router_tick
from noetl_dagster.translator import compile_playbooks
from noetl_dagster.translator.runner import run_playbook_dagster


@pytest.fixture
def location(dagster_data):
    paths = [EXAMPLES / n for n in ("hello_dagster.yaml", "per_step_pipeline.yaml", "fanout_join.yaml")]
    return compile_playbooks(paths, resource=NoetlResource(data_dir=str(dagster_data)))


def _tick(location, instance, cursor=None, **kw):
    svc = location.index.resource.services()
    return router_tick(location.index, svc, instance_run_lookup(instance), cursor or RouterCursor(), **kw)


def _detach(path, data_dir, **kw):
    return run_playbook_dagster(path, data_dir=data_dir, detach=True, **kw).execution_id


def _run(location, launch, instance):
    job = location.definitions.resolve_job_def(launch.job_name)
    return job.execute_in_process(instance=instance, tags={**launch.tags, "dagster/run_key": launch.run_key},
                                  raise_on_error=False)  # fmt: skip


def test_detached_request_launches_the_playbook_job_once(location, dagster_data, ephemeral_instance):
    eid = _detach(EXAMPLES / "hello_dagster.yaml", dagster_data)
    tick = _tick(location, ephemeral_instance)
    (launch,) = tick.launches
    assert launch.job_name == "hello_dagster" and launch.execution_id == eid
    assert launch.run_key.startswith(eid)
    assert launch.tags["noetl/execution_id"] == eid and launch.reason == "detached request"
    assert tick.cursor.watch == {eid: "detached"} and tick.cursor.gid > 0
    again = _tick(location, ephemeral_instance, tick.cursor)
    assert [la.run_key for la in again.launches] == [launch.run_key]  # same work, same key: Dagster dedups it
    assert _run(location, launch, ephemeral_instance).success
    done = _tick(location, ephemeral_instance, again.cursor)
    assert done.launches == [] and done.cursor.watch == {}


def test_per_step_tokens_become_step_runs_and_the_join_waits(location, dagster_data, ephemeral_instance):
    eid = _detach(EXAMPLES / "per_step_pipeline.yaml", dagster_data)
    cursor = RouterCursor()
    seen: list[tuple[str, str]] = []
    for _ in range(10):
        tick = _tick(location, ephemeral_instance, cursor)
        cursor = tick.cursor
        if not tick.launches:
            break
        for launch in tick.launches:
            seen.append((launch.job_name.split("__step__")[-1], launch.run_key))
            if launch.tags["noetl/step"] == "combine":  # the join is launched only when both branches ended
                state_steps = [e.step for e in events_of(dagster_data, eid) if e.name == "step.done"]
                assert {"total", "maximum"} <= set(state_steps)
            assert _run(location, launch, ephemeral_instance).success
    steps = [s for s, _ in seen]
    assert sorted(steps) == ["combine", "maximum", "start", "total"]
    tokens = {e.data["token_id"] for e in events_of(dagster_data, eid) if e.name == "token.enqueued"}
    for _step, key in seen:
        assert key.removeprefix("join:") in tokens  # run_key = token id
    assert [e.data["status"] for e in events_of(dagster_data, eid) if e.name == "workflow.finished"] == [
        "completed"
    ]


def test_a_run_that_died_is_resumed(location, dagster_data, ephemeral_instance, monkeypatch):
    real = Engine.run

    def die(self, act):
        if act.step == "repeat":
            raise RuntimeError("run worker lost")
        return real(self, act)

    monkeypatch.setattr(Engine, "run", die)
    job = location.definitions.resolve_job_def("hello_dagster")
    failed = job.execute_in_process(instance=ephemeral_instance, raise_on_error=False)
    assert not failed.success
    eid = ephemeral_instance.get_run_by_id(failed.run_id).tags["noetl/execution_id"]
    monkeypatch.setattr(Engine, "run", real)
    # a run started by Dagster is resumed only after the grace period (its runner may still continue it)
    assert _tick(location, ephemeral_instance, grace_seconds=3600).launches == []
    tick = _tick(location, ephemeral_instance, grace_seconds=0)
    (launch,) = tick.launches
    assert launch.reason == "resume" and launch.job_name == "hello_dagster"
    assert _run(location, launch, ephemeral_instance).success
    events = events_of(dagster_data, eid)
    assert [e.step for e in events if e.name == "step.scheduled"] == ["start", "repeat", "done"]
    assert events[-1].name == "playbook.processed"


def test_live_run_blocks_a_resume(location, dagster_data, ephemeral_instance):
    eid = _detach(EXAMPLES / "hello_dagster.yaml", dagster_data)
    job = location.definitions.resolve_job_def("hello_dagster")
    ephemeral_instance.create_run_for_job(
        job, tags={"noetl/execution_id": eid}, status=dg.DagsterRunStatus.STARTED
    )
    assert _tick(location, ephemeral_instance, grace_seconds=0).launches == []


def test_bad_events_and_unknown_playbooks_are_reported_and_skipped(
    location, dagster_data, ephemeral_instance
):
    svc = location.index.resource.services()
    svc.event_store.append([
        Event(E.EXECUTION_REQUESTED, "ghost-exec", {"playbook": "nowhere/ghost", "requested_by": "detached:cli"}),
        Event(E.EXECUTION_REQUESTED, "odd-exec", {"playbook": 123, "requested_by": "detached:cli"}),
        Event(E.EXECUTION_REQUESTED, "corrupt-exec", {"playbook": "examples/hello_dagster", "requested_by": "detached:x"}),
        Event(E.TOKEN_ENQUEUED, "corrupt-exec", {"step": "start"}),  # no token_id: the log cannot be folded
    ])  # fmt: skip
    good = _detach(EXAMPLES / "hello_dagster.yaml", dagster_data)
    tick = _tick(location, ephemeral_instance)
    assert [la.execution_id for la in tick.launches] == [good]
    assert any("ghost" in n and "not in this code location" in n for n in tick.notes)
    assert any("123" in n for n in tick.notes)
    assert any(n.startswith("execution corrupt-exec: KeyError") for n in tick.notes)
    assert "ghost-exec" not in tick.cursor.watch and "corrupt-exec" in tick.cursor.watch


def test_local_runner_executions_are_not_touched(location, dagster_data, ephemeral_instance):
    r = run_playbook(EXAMPLES / "hello_dagster.yaml", data_dir=dagster_data)
    tick = _tick(location, ephemeral_instance, grace_seconds=0)
    assert tick.launches == [] and r.execution_id not in tick.cursor.watch


def test_sensor_definition_evaluates_with_a_cursor(location, dagster_data):
    eid = _detach(EXAMPLES / "hello_dagster.yaml", dagster_data)
    sensor = location.definitions.resolve_sensor_def("noetl_router")
    resources = {"noetl": location.index.resource}
    with dg.instance_for_test() as instance:
        ctx = dg.build_sensor_context(instance=instance, resources=resources)
        result = sensor(ctx)
        (req,) = result.run_requests
        assert req.job_name == "hello_dagster" and req.tags["noetl/execution_id"] == eid
        assert json.loads(result.cursor)["watch"] == {eid: "detached"}
        ctx2 = dg.build_sensor_context(instance=instance, resources=resources, cursor="not json")
        assert (
            len(sensor(ctx2).run_requests) == 1
        )  # an unreadable cursor re-tails; run keys keep it idempotent


def test_cursor_round_trip():
    c = RouterCursor(42, {"a": "detached"})
    assert RouterCursor.parse(c.dumps()) == c
    assert RouterCursor.parse(None) == RouterCursor()


def test_a_waiting_tick_launches_a_request_recorded_during_it(dagster_data):
    """Issue 35: with ``wait_seconds`` a tick that found nothing keeps watching the event store and
    launches a request recorded meanwhile in the same evaluation (without it: a skip, and the
    request waits for the next tick)."""
    import threading

    paths = [EXAMPLES / "hello_dagster.yaml"]
    resource = NoetlResource(data_dir=str(dagster_data))
    resources = {"noetl": resource}
    recorded: list[str] = []
    for wait, expect_launch in ((0.0, False), (30.0, True)):
        location = compile_playbooks(paths, resource=resource, sensor_wait_seconds=wait)
        sensor = location.definitions.resolve_sensor_def("noetl_router")
        with dg.instance_for_test() as instance:
            cursor = json.dumps({"gid": resource.services().event_store.tail_last(), "watch": {}})
            ctx = dg.build_sensor_context(instance=instance, resources=resources, cursor=cursor)
            timer = threading.Timer(0.3, lambda: recorded.append(_detach(paths[0], dagster_data)))
            timer.start()  # 0.3 s into the evaluation (a 30 s wait ends at the first event, not at 30 s)
            result = sensor(ctx)
            timer.join()
            if expect_launch:
                (req,) = result.run_requests
                assert req.tags["noetl/execution_id"] == recorded[-1]
            else:
                assert isinstance(result, dg.SkipReason) or not result.run_requests


def test_an_altered_log_is_not_resumed(location, dagster_data, ephemeral_instance):
    """The sensor folds an execution's whole log to plan it (resources.runtime.attach): an edited log
    (issue 41, SQLite triggers dropped) is refused there, naming the first bad event; nothing launches."""
    import sqlite3

    eid = _detach(EXAMPLES / "hello_dagster.yaml", dagster_data)
    with sqlite3.connect(dagster_data / "events.db") as c:
        c.execute("DROP TRIGGER noetl_event_no_update")
        c.execute("UPDATE noetl_event SET body = json_set(body, '$.data.injected', 1)"
                  " WHERE execution_id = ? AND sequence = 1", (eid,))  # fmt: skip
    forget_engines()  # the sensor runs in the daemon, not in the process that recorded the request
    tick = _tick(location, ephemeral_instance)
    assert tick.launches == []
    assert any(f"execution {eid}: ChainBroken:" in n and "altered at sequence 1 " in n for n in tick.notes), (
        tick.notes
    )


def test_an_idle_router_tick_logs_nothing_at_info(location):
    """Issue 42: the router ticks every few seconds; with nothing to route it says so at DEBUG only
    (what its tick logs: the sensor context's logger, captured here at every level)."""
    sensor = location.definitions.resolve_sensor_def("noetl_router")
    resources = {"noetl": location.index.resource}
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    with dg.instance_for_test() as instance:
        cursor = None
        for _ in range(3):
            ctx = dg.build_sensor_context(instance=instance, resources=resources, cursor=cursor)
            ctx.log.addHandler(handler)
            result = sensor(ctx)
            assert isinstance(result, dg.SkipReason) and "no work to route" in (result.skip_message or "")
            cursor = ctx.cursor
    assert len(records) == 3 and {r.levelno for r in records} == {logging.DEBUG}
    assert all("no work to route" in r.getMessage() for r in records)
