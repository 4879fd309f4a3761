"""Acceptance: the Dagster runner (one run per execution, and per-step jobs
routed by the sensor's logic) gives the same ``--json`` summary and the same
event-name sequence per step as the local runner, for every example playbook
and every runnable conformance fixture."""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster_helpers import EXAMPLES, FIXTURES, events_of, names_per_step, run_dagster, run_local, summary

from noetl_dagster.engine.replay import replay
from noetl_dagster.storage.event_stores import open_event_store

# playbooks that choose per-step jobs or a separate step themselves
SENSOR_ROUTED = {"examples/per_step_pipeline", "examples/failure_recovery"}
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))
CASES = [(p, None) for p in EXAMPLE_FILES] + [
    (FIXTURES / "hello_world" / "hello_world.yaml", None),
    (FIXTURES / "control_flow_workbook" / "control_flow_workbook.yaml", {"temperature_c": 30}),
    (FIXTURES / "control_flow_workbook" / "control_flow_workbook.yaml", {"temperature_c": 10}),
    (FIXTURES / "fanout_reduce" / "fanout_reduce_phase6.yaml", None),
    (FIXTURES / "test_loop_instance_isolation" / "playbook.yaml", None),
    (FIXTURES / "vars_test" / "test_vars_block.yaml", None),
    (FIXTURES / "playbook_composition" / "user_profile_scorer.yaml", None),
]


def _id(case: tuple[Path, dict | None]) -> str:
    path, workload = case
    return (
        path.parent.name
        + "/"
        + path.stem
        + ("" if not workload else "-" + "-".join(f"{k}{v}" for k, v in workload.items()))
    )


def test_every_example_playbook_is_covered():
    assert len(EXAMPLE_FILES) >= 8


@pytest.mark.parametrize("mode", ["default", "per_step"])
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_dagster_runner_matches_local_runner(case, mode, tmp_path, ephemeral_instance, dagster_data):
    path, workload = case
    local_dir = tmp_path / "local"
    local = run_local(path, local_dir, workload)
    dag = run_dagster(path, dagster_data, ephemeral_instance, mode, workload)

    assert dag.status == local.status
    assert summary(dag) == summary(local)
    expected = names_per_step(events_of(local_dir, local.execution_id))
    actual = names_per_step(events_of(dagster_data, dag.execution_id))
    assert actual == expected
    # the state a Dagster-driven execution ends in is what its log replays to
    store = open_event_store(None, data_dir=dagster_data)
    try:
        assert replay(store, dag.execution_id).status == dag.status
    finally:
        store.close()
    runs = dag.extra["dagster"]["run_ids"]
    if mode == "default" and dag.playbook not in SENSOR_ROUTED:
        assert len(runs) == 1  # one execution, one run (cycles included)
    if mode == "per_step":
        assert len(runs) >= len(dag.runs)  # every step activation ran in its own job


def test_join_runs_once_on_each_branch(tmp_path, ephemeral_instance, dagster_data):
    path = FIXTURES / "control_flow_workbook" / "control_flow_workbook.yaml"
    for temp, branch in ((30, "hot_task_a"), (10, "cold_task")):
        r = run_dagster(path, dagster_data, ephemeral_instance, "default", {"temperature_c": temp})
        assert r.runs["end"] == 1 and branch in r.runs
        events = events_of(dagster_data, r.execution_id)
        assert [e.name for e in events if e.step == "end"].count("step.scheduled") == 1


def test_reduce_runs_once_after_both_branches(ephemeral_instance, dagster_data):
    r = run_dagster(
        FIXTURES / "fanout_reduce" / "fanout_reduce_phase6.yaml", dagster_data, ephemeral_instance
    )
    events = events_of(dagster_data, r.execution_id)
    seq = {(e.name, e.step): e.sequence for e in events}
    assert r.runs["reduce_customer"] == 1
    assert seq[("step.scheduled", "reduce_customer")] > seq[("step.done", "normalize_customer")]
    assert seq[("step.scheduled", "reduce_customer")] > seq[("step.done", "enrich_customer")]
