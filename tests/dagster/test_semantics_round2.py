"""Issue 16 (engine semantics, round 2) on the Dagster runner: the same summary
and per-step event trace as the local runner (loop frames included)."""

from __future__ import annotations

import textwrap

import pytest
from dagster_helpers import events_of, names_per_step, run_dagster, run_local, summary

LOOP_WITH_FAILURE = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: loop_fail, path: t/loop_fail}
workflow:
  - step: start
    loop:
      in: "{{ [1, 0, 2, 0] }}"
      iterator: x
      spec: {mode: MODE}
    tool:
      - div:
          kind: python
          input: {x: "{{ iter.x }}"}
          code: "result = 10 // x"
    next:
      arcs:
        - step: report
          when: "{{ start.stats.failed > 0 }}"
          args: {failed: "{{ start.stats.failed }}"}
  - step: report
    tool:
      kind: python
      input: {failed: "{{ args.failed }}", ok: "{{ start.stats.ok }}"}
      code: "result = {'failed': failed, 'ok': ok}"
"""


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
def test_loop_with_failed_iterations_same_on_both_runners(mode, tmp_path, ephemeral_instance, dagster_data):
    path = tmp_path / "loop_fail.yaml"
    path.write_text(textwrap.dedent(LOOP_WITH_FAILURE).lstrip().replace("MODE", mode))
    local_dir = tmp_path / "local"
    local = run_local(path, local_dir)
    dag = run_dagster(path, dagster_data, ephemeral_instance)
    assert local.status == "completed"
    assert local.results["start"]["stats"] == {"total": 4, "ok": 2, "failed": 2}
    assert local.results["report"] == {"failed": 2, "ok": 2}
    assert dag.status == local.status
    assert summary(dag) == summary(local)
    assert names_per_step(events_of(dagster_data, dag.execution_id)) == names_per_step(
        events_of(local_dir, local.execution_id)
    )


@pytest.mark.parametrize("name", ["IRREDUCIBLE", "DIAMOND_CYCLE"])
def test_joins_in_cycles_same_on_both_runners(name, tmp_path, ephemeral_instance, dagster_data):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
    import test_join_order as tj

    path = tmp_path / f"{name.lower()}.yaml"
    path.write_text(tj._text(getattr(tj, name)))
    local_dir = tmp_path / "local"
    local = run_local(path, local_dir)
    dag = run_dagster(path, dagster_data, ephemeral_instance)
    assert local.status == dag.status == "completed"
    assert summary(dag) == summary(local)
    got = names_per_step(events_of(dagster_data, dag.execution_id))
    want = names_per_step(events_of(local_dir, local.execution_id))
    if name == "IRREDUCIBLE":
        # the two activations of `end` interleave differently (Dagster schedules both before
        # running either); same events per step, same runs and results
        got, want = ({k: sorted(v) for k, v in d.items()} for d in (got, want))
    assert got == want


def _engine_case(name: str) -> str:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
    import test_executor_spec as tx

    return {"FINAL": tx.FINAL, "NO_NEXT": tx._nne("true")}[name]


@pytest.mark.slow
@pytest.mark.parametrize("name,workload,mode", [("FINAL", None, "default"), ("FINAL", {"fail": True}, "default"),
                                               ("FINAL", {"fail": True}, "per_step"), ("NO_NEXT", None, "default")])  # fmt: skip
def test_executor_spec_same_on_both_runners(name, workload, mode, tmp_path, ephemeral_instance, dagster_data):
    """executor.spec.final_step (after success and after a failure) and no_next_is_error."""
    path = tmp_path / f"{name.lower()}.yaml"
    path.write_text(textwrap.dedent(_engine_case(name)).lstrip())
    local_dir = tmp_path / "local"
    local = run_local(path, local_dir, workload)
    dag = run_dagster(path, dagster_data, ephemeral_instance, mode=mode, workload=workload)
    want = "failed" if (workload or name == "NO_NEXT") else "completed"
    assert local.status == dag.status == want
    if name == "FINAL":
        assert local.runs["cleanup"] == dag.runs["cleanup"] == 1
    assert summary(dag) == summary(local)
    assert names_per_step(events_of(dagster_data, dag.execution_id)) == names_per_step(
        events_of(local_dir, local.execution_id)
    )
