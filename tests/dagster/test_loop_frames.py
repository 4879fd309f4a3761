"""Loop steps as Dagster frames (plan -> mapped frames -> collect): the events
equal the local runner's, parallel iterations spread over frames (and processes),
the one-writer rule of parallel loops holds across frames, and a frame that died
is re-run without repeating the iterations the log already holds."""

from __future__ import annotations

import textwrap

import dagster as dg
import pytest
from dagster_helpers import EXAMPLES, events_of, names_per_step, run_dagster, run_local, summary

from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.translator import compile_playbooks

LOOP = """
    apiVersion: noetl.io/v2
    kind: Playbook
    metadata: {{name: frames, path: t/frames}}
    workload: {{n: {n}}}
    workflow:
      - step: start
        loop:
          in: "{{{{ range(workload.n) | list }}}}"
          iterator: x
          spec: {{mode: {mode}{extra}}}
        tool:
          - square:
              kind: python
              input: {{x: "{{{{ iter.x }}}}"}}
              code: |
                result = {{"x": x, "sq": x * x}}
{task_extra}
        next: {{arcs: [{{step: total}}]}}
      - step: total
        tool:
          - sum:
              kind: python
              input: {{rows: "{{{{ start.results }}}}"}}
              code: |
                result = sum(r["sq"] for r in rows)
"""


def _pb(tmp_path, n=20, mode="parallel", extra=", max_in_flight: 4", task_extra=""):
    p = tmp_path / "frames.yaml"
    p.write_text(textwrap.dedent(LOOP.format(n=n, mode=mode, extra=extra, task_extra=task_extra)).lstrip())
    return p


def _steps_run(result: dg.ExecuteInProcessResult) -> list[str]:
    return [e.step_key for e in result.all_events if e.event_type_value == "STEP_SUCCESS"]


def test_loop_step_compiles_to_plan_frame_collect(tmp_path):
    loc = compile_playbooks(_pb(tmp_path), include_sensor=False)
    names = {n.name for n in loc.definitions.resolve_job_def("frames").nodes}
    assert {"start", "start__frame", "start__collect", "total"} <= names
    local = compile_playbooks(_pb(tmp_path, extra=", policy: {exec: local}"), include_sensor=False)
    assert "start__frame" not in {n.name for n in local.definitions.resolve_job_def("frames").nodes}


@pytest.mark.parametrize(("n", "mode", "extra", "frames"), [
    (20, "parallel", ", max_in_flight: 4", 10),             # ceil(20 / 16) = 2 iterations per frame
    (5, "parallel", ", dagster: {frame_size: 2}", 3),
    (6, "sequential", "", 1),                                  # a sequential loop is one frame
    (0, "parallel", "", 1),                                    # an empty loop still collects
])  # fmt: skip
def test_frames_match_the_local_runner(tmp_path, dagster_data, ephemeral_instance, n, mode, extra, frames):
    p = _pb(tmp_path, n=n, mode=mode, extra=extra)
    local = run_local(p, tmp_path / "local")
    loc = compile_playbooks(p, resource=NoetlResource(data_dir=str(dagster_data)), include_sensor=False)
    result = loc.definitions.resolve_job_def("frames").execute_in_process(instance=ephemeral_instance)
    assert result.success
    assert sum(1 for k in _steps_run(result) if k.startswith("start__frame[")) == frames
    eid = ephemeral_instance.get_run_by_id(result.run_id).tags["noetl/execution_id"]
    assert names_per_step(events_of(dagster_data, eid)) == names_per_step(
        events_of(tmp_path / "local", local.execution_id)
    )
    done = [e for e in events_of(dagster_data, eid) if e.name == "step.done" and e.step == "total"]
    assert done[0].data["result"] == sum(i * i for i in range(n))


def test_parallel_one_writer_rule_spans_frames(tmp_path, dagster_data, ephemeral_instance):
    p = _pb(tmp_path, n=4, extra=", dagster: {frame_size: 1}",
            task_extra="              set: {ctx.last: \"{{ iter.x }}\"}")  # fmt: skip
    local = run_local(p, tmp_path / "local")
    dag = run_dagster(p, dagster_data, ephemeral_instance)
    assert local.status == dag.status == "failed"  # two iterations wrote ctx.last, in different frames
    assert summary(dag) == summary(local)
    errors = [
        e.data["error"]["kind"]
        for e in events_of(dagster_data, dag.execution_id)
        if e.name == "loop.iteration.failed"
    ]
    assert errors == ["ctx_conflict"] * 3


def test_reexecuting_a_frame_that_died_skips_logged_iterations(monkeypatch, recovery_env):
    """Dagster's re-execution from failure runs the dead frame again (its input is in the IO
    manager's storage) and only the iterations the log does not hold."""
    from noetl_dagster.engine.worker import Worker

    real = Worker.loop_iteration
    calls: list[int] = []

    def die_at_4(self, lr, i, body=None):
        calls.append(i)
        if i == 4 and calls.count(4) == 1:
            self.engine.recorder.flush()  # iteration 3 is durable; 4 dies with its worker
            raise RuntimeError("frame worker lost")
        return real(self, lr, i, body)

    monkeypatch.setattr(Worker, "loop_iteration", die_at_4)
    import recovery_jobs

    job = dg.reconstructable(recovery_jobs.frames_job)
    with dg.instance_for_test() as instance:
        first = dg.execute_job(job, instance)
        assert not first.success
        eid = instance.get_run_by_id(first.run_id).tags["noetl/execution_id"]
        again = dg.execute_job(
            job, instance, reexecution_options=dg.ReexecutionOptions.from_failure(first.run_id, instance)
        )
        assert again.success
        rerun = {e.step_key for e in instance.all_logs(again.run_id)
                 if e.is_dagster_event and e.dagster_event.event_type_value == "STEP_START"}  # fmt: skip
        assert rerun == {"start__frame[f1]", "start__collect", "total"}
    events = events_of(recovery_env, eid)
    done = sorted(e.iteration for e in events if e.name == "loop.iteration.done")
    assert done == [0, 1, 2, 3, 4, 5]  # each iteration once: 3 was not repeated
    assert [e.data["status"] for e in events if e.name == "workflow.finished"] == ["completed"]
    assert [e.data["result"] for e in events if e.name == "step.done" and e.step == "total"] == [55]


def test_example_http_loop_runs_as_frames(dagster_data, ephemeral_instance):
    loc = compile_playbooks(EXAMPLES / "customers_http.yaml", include_sensor=False,
                            resource=NoetlResource(data_dir=str(dagster_data), tenant="demo", project="examples"))  # fmt: skip
    result = loc.definitions.resolve_job_def("customers_http").execute_in_process(instance=ephemeral_instance)
    assert result.success
    frames = [k for k in _steps_run(result) if k.startswith("customer_stats__frame[")]
    assert len(frames) == 6  # one per customer (6 iterations, at most 16 frames)


@pytest.mark.slow
def test_frames_run_in_separate_processes(recovery_env):
    """The multiprocess executor runs each frame in its own process; they append to one execution."""
    from pathlib import Path

    # step subprocesses import recovery_jobs from this directory
    job = dg.build_reconstructable_job("recovery_jobs", "frames_job_multiprocess",
                                       reconstructor_working_directory=str(Path(__file__).resolve().parent))  # fmt: skip
    with dg.instance_for_test() as instance:
        result = dg.execute_job(job, instance, run_config={"execution": {"config": {"max_concurrent": 2}}})
        assert result.success
        eid = instance.get_run_by_id(result.run_id).tags["noetl/execution_id"]
        pids = {e.dagster_event.pid for e in instance.all_logs(result.run_id)
                if e.is_dagster_event and e.dagster_event.event_type_value == "STEP_START"
                and "__frame[" in (e.step_key or "")}  # fmt: skip
        assert len(pids) == 2  # two frames, two processes
    events = events_of(recovery_env, eid)
    assert sorted(e.iteration for e in events if e.name == "loop.iteration.done") == [0, 1, 2, 3, 4, 5]
    assert [e.data["result"] for e in events if e.name == "step.done" and e.step == "total"] == [55]
    assert [e.data["status"] for e in events if e.name == "workflow.finished"] == ["completed"]
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))  # one gap-free log
