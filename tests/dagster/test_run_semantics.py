"""What a playbook run looks like in Dagster: run tags, NoETL events as Dagster
logs, the step result as op output metadata (inline or by reference), failed
tasks failing their op, handled failures routing, and re-execution from
failure resuming from the event log without re-running completed steps."""

from __future__ import annotations

import textwrap

import dagster as dg
import pytest
from dagster_helpers import EXAMPLES, events_of, run_dagster, run_local, summary

from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.translator import compile_playbooks


def _compile(path, data_dir, **kw):
    return compile_playbooks(path, resource=NoetlResource(data_dir=str(data_dir)), include_sensor=False, **kw)


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip())
    return p


def _output_metadata(result: dg.ExecuteInProcessResult, op: str, output: str = "result") -> dict:
    for ev in result.events_for_node(op):
        if ev.event_type_value == "STEP_OUTPUT" and ev.step_output_data.output_name == output:
            return dict(ev.step_output_data.metadata)
    raise AssertionError(f"no output {output} from {op}")


def test_launchpad_run_is_tagged_logs_noetl_events_and_takes_typed_workload(dagster_data, ephemeral_instance):
    loc = _compile(EXAMPLES / "hello_dagster.yaml", dagster_data)
    job = loc.definitions.resolve_job_def("hello_dagster")
    cfg = {"ops": {"noetl_start": {"config": {"workload": {"name": "Ada", "times": 2}}}}}
    result = job.execute_in_process(
        run_config=cfg, instance=ephemeral_instance
    )  # no noetl tags: as the launchpad
    assert result.success
    run = ephemeral_instance.get_run_by_id(result.run_id)
    eid = run.tags["noetl/execution_id"]
    assert run.tags["noetl/playbook"] == "examples/hello_dagster"
    assert run.tags["noetl/tenant"] == "default" and run.tags["noetl/project"] == "default"
    assert run.tags["noetl/status"] == "completed"
    events = events_of(dagster_data, eid)
    requested = events[0]
    assert requested.name == "playbook.execution.requested"
    assert requested.data["workload"] == {"name": "Ada", "times": 2}
    assert requested.data["requested_by"] == f"dagster:{result.run_id}"
    lines = [ln for e in ephemeral_instance.all_logs(result.run_id) for ln in e.user_message.splitlines()]
    for name in ("workflow.started", "step.started", "task.started", "task.done", "step.done", "next.evaluated",
                 "workflow.finished"):  # fmt: skip
        assert any(ln.startswith(name) for ln in lines), name
    assert any(ln.startswith("task.done done.count ok") for ln in lines)
    md = _output_metadata(result, "done")
    assert md["result"].data == {"said": 2, "last": "Hello, Ada!"}
    assert md["noetl/status"].value == "done" and md["execution_id"].value == eid


def test_big_result_shows_as_a_reference(tmp_path, dagster_data, ephemeral_instance):
    p = _write(
        tmp_path,
        "big.yaml",
        """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: big, path: t/big}
        workflow:
          - step: start
            tool:
              - make:
                  kind: python
                  code: |
                    result = [{"i": i, "pad": "x" * 100} for i in range(2000)]
        """,
    )
    loc = _compile(p, dagster_data)
    result = loc.definitions.resolve_job_def("big").execute_in_process(instance=ephemeral_instance)
    md = _output_metadata(result, "start")
    assert "result" not in md
    assert md["result_ref"].value.startswith("file://")
    assert md["result_ref_rows"].value == 2000
    assert md["result_ref_checksum"].value


FAILING = """
    apiVersion: noetl.io/v2
    kind: Playbook
    metadata: {name: fails, path: t/fails}
    workflow:
      - step: start
        tool: {kind: noop}
        next:
          spec: {mode: inclusive}
          arcs: [{step: boom}, {step: fine}]
      - step: boom
        tool:
          - divide:
              kind: python
              code: "result = 1 / 0"
        next: {arcs: [{step: join, when: "{{ outcome.status == 'ok' }}"}]}
      - step: fine
        tool: {kind: noop, result: {ok: true}}
        next: {arcs: [{step: join}]}
      - step: join
        tool: {kind: noop, result: "{{ args | length }}"}
    """


def test_failed_task_fails_its_op_with_the_outcome_error(tmp_path, dagster_data, ephemeral_instance):
    p = _write(tmp_path, "fails.yaml", FAILING)
    loc = _compile(p, dagster_data)
    result = loc.definitions.resolve_job_def("fails").execute_in_process(instance=ephemeral_instance,
                                                                        raise_on_error=False)  # fmt: skip
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    assert failure.step_key == "boom"
    desc = failure.step_failure_data.user_failure_data.description
    assert "step 'boom' failed" in desc and "ZeroDivisionError" in desc
    # the join downstream of the failed op is not run in this run; the execution is not lost
    eid = ephemeral_instance.get_run_by_id(result.run_id).tags["noetl/execution_id"]
    names = [(e.name, e.step) for e in events_of(dagster_data, eid)]
    assert ("step.failed", "boom") in names and ("step.done", "fine") in names


def test_failure_next_to_a_join_finishes_like_the_local_runner(tmp_path, dagster_data, ephemeral_instance):
    p = _write(tmp_path, "fails.yaml", FAILING)
    local = run_local(p, tmp_path / "local")
    dag = run_dagster(p, dagster_data, ephemeral_instance)
    assert local.status == dag.status == "failed"
    assert local.runs["join"] == dag.runs["join"] == 1  # the join still fires with the branch that arrived
    assert summary(dag) == summary(local)
    assert dag.extra["dagster"]["statuses"] == ["FAILURE", "SUCCESS"]  # the failed run, then the resume


def test_handled_failure_routes_and_the_op_succeeds(dagster_data, ephemeral_instance):
    loc = _compile(EXAMPLES / "failure_recovery.yaml", dagster_data)
    result = loc.definitions.resolve_job_def("failure_recovery").execute_in_process(
        instance=ephemeral_instance
    )
    assert result.success
    md = _output_metadata(result, "start")
    assert md["noetl/status"].value == "failed"  # the step failed; its arc handled it
    outputs = {ev.step_output_data.output_name for ev in result.events_for_node("start")
               if ev.event_type_value == "STEP_OUTPUT"}  # fmt: skip
    assert outputs == {"result", "to_repair"}


def test_running_a_finished_execution_again_changes_nothing(dagster_data, ephemeral_instance):
    loc = _compile(EXAMPLES / "hello_dagster.yaml", dagster_data)
    job = loc.definitions.resolve_job_def("hello_dagster")
    first = job.execute_in_process(instance=ephemeral_instance)
    eid = ephemeral_instance.get_run_by_id(first.run_id).tags["noetl/execution_id"]
    before = events_of(dagster_data, eid)
    again = job.execute_in_process(instance=ephemeral_instance, tags={"noetl/execution_id": eid})
    assert again.success
    assert len(events_of(dagster_data, eid)) == len(before)
    skipped = [e.step_key for e in again.all_events if e.event_type_value == "STEP_SKIPPED"]
    assert len(skipped) == 3  # every step op: the log holds no work for them


@pytest.mark.parametrize("crash_at", ["running", "after_routing"])
def test_reexecution_from_failure_resumes_from_the_event_log(monkeypatch, recovery_env, crash_at):
    """The op of `repeat` dies (its worker is lost) while running the step, or after the step ran and
    was routed; Dagster's re-execution from failure continues from the log: nothing durable runs twice."""
    from noetl_dagster.engine.control import Engine
    from noetl_dagster.resources import runtime

    dagster_data = recovery_env
    crashes: list[str] = []
    if crash_at == "running":
        real_run = Engine.run

        def crash_once(self, act):
            if act.step == "repeat" and not crashes:
                crashes.append(act.step_run_id)
                raise RuntimeError("worker lost")  # nothing of this activation became durable
            return real_run(self, act)

        monkeypatch.setattr(Engine, "run", crash_once)
    else:
        real_sync = runtime.sync

        def crash_after_routing(eng, mine):
            if "repeat" in eng.state.results and not crashes:
                crashes.append("repeat")
                raise RuntimeError("worker lost")  # `repeat` ran and was routed; the op died after
            return real_sync(eng, mine)

        monkeypatch.setattr(runtime, "sync", crash_after_routing)
    import recovery_jobs

    job = dg.reconstructable(recovery_jobs.hello_job)
    with dg.instance_for_test() as instance:
        first = dg.execute_job(job, instance)
        assert not first.success and crashes
        eid = instance.get_run_by_id(first.run_id).tags["noetl/execution_id"]
        assert not any(e.name == "workflow.finished" for e in events_of(dagster_data, eid))
        second = dg.execute_job(
            job, instance, reexecution_options=dg.ReexecutionOptions.from_failure(first.run_id, instance)
        )
        assert second.success
        assert instance.get_run_by_id(second.run_id).tags["noetl/execution_id"] == eid
        executed = {e.step_key for e in instance.all_logs(second.run_id) if e.is_dagster_event
                    and e.dagster_event.event_type_value == "STEP_START"}  # fmt: skip
        assert executed == {"repeat", "done"}
    events = events_of(dagster_data, eid)
    assert [e.step for e in events if e.name == "step.scheduled"] == ["start", "repeat", "done"]
    assert [e.step for e in events if e.name == "step.done"] == ["start", "repeat", "done"]  # none ran twice
    if crash_at == "running":
        assert crashes[0] not in {e.step_run_id for e in events}  # the lost activation left no trace
    assert [e.data["status"] for e in events if e.name == "workflow.finished"] == ["completed"]
    done = [e.data["result"] for e in events if e.name == "step.done" and e.step == "done"]
    assert done == [{"said": 3, "last": "Hello, Dagster!"}]


@pytest.mark.parametrize("mode", ["default", "per_step"])
def test_detached_request_is_recorded_for_the_router(dagster_data, mode):
    from noetl_dagster.translator.runner import run_playbook_dagster

    r = run_playbook_dagster(
        EXAMPLES / "hello_dagster.yaml", {"times": 1}, data_dir=dagster_data, mode=mode, detach=True
    )
    assert r.status == "requested"
    events = events_of(dagster_data, r.execution_id)
    assert [e.name for e in events] == ["playbook.execution.requested", "workflow.started", "token.enqueued"]
    assert events[0].data["requested_by"] == "detached:cli"


def test_stored_tables_materialize_their_assets(dagster_data, ephemeral_instance):
    loc = compile_playbooks(EXAMPLES / "sales_tables.yaml", include_sensor=False,
                            resource=NoetlResource(data_dir=str(dagster_data), tenant="demo", project="examples"))  # fmt: skip
    assert (
        loc.definitions.resolve_job_def("sales_tables")
        .execute_in_process(instance=ephemeral_instance)
        .success
    )
    daily = ephemeral_instance.get_latest_materialization_event(dg.AssetKey(["sales", "daily_sales"]))
    md = daily.asset_materialization.metadata
    assert md["dagster/row_count"].value == 15 and md["noetl/checksum"].value.startswith("sha256:")
    assert [c.name for c in md["dagster/column_schema"].schema.columns] == ["day", "region", "amount"]
    assert md["noetl/uri"].value.startswith("noetl://demo/examples/sales/dataset/daily_sales@v")
    totals = ephemeral_instance.get_latest_materialization_event(
        dg.AssetKey(["sales", "region_totals"])
    ).asset_materialization.metadata
    assert any("daily_sales@v" in u for u in totals["noetl/inputs"].value)  # the version it was made from
    # a read is an input, not a materialization: daily_sales was materialized once (by store_daily)
    assert daily.asset_materialization.metadata["noetl/step"].value == "store_daily"
