"""A subset run (issue 31): ``StepGraph.needed_for`` is every step with a path to the targets (cycles
and joins on the way included); ``run_playbook(select=...)`` admits only those, records every other
step a token reaches as skipped "not selected", and still runs the final step."""

from __future__ import annotations

from noetl_dagster.dsl import load_playbook
from noetl_dagster.engine.graph import analyze

PB = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
executor:
  spec: {final_step: cleanup}
workflow:
  - step: start
    tool: {kind: noop}
    set: {ctx.n: 0}
    next:
      spec: {mode: inclusive}
      arcs: [{step: spin}, {step: side}]
  - step: spin
    tool: {kind: noop}
    set: {ctx.n: "{{ ctx.n + 1 }}"}
    next:
      arcs:
        - step: spin
          when: "{{ ctx.n < 3 }}"
        - step: store
  - step: store
    tool: {kind: noop}
    next:
      arcs: [{step: join}]
  - step: side
    tool: {kind: noop}
    next:
      arcs: [{step: join}]
  - step: join
    tool: {kind: noop}
  - step: cleanup
    tool: {kind: noop}
"""


def test_needed_for_is_every_step_with_a_path_to_the_targets(write_pb):
    g = analyze(load_playbook(write_pb(PB, "t.yaml")))
    assert g.needed_for(["store"]) == {"start", "spin", "store"}  # the cycle on the way
    assert g.needed_for(["join"]) == {"start", "spin", "store", "side", "join"}
    assert g.needed_for(["side", "nope"]) == {"start", "side"}


def test_a_subset_run_skips_what_is_not_selected_and_runs_the_final_step(run_pb):
    r = run_pb(PB, select=["start", "spin", "store"])
    assert r.status == "completed"
    assert r.runs == {"start": 1, "spin": 3, "store": 1, "cleanup": 1}
    skipped = {e.step: e.data["reason"] for e in r.events if e.name == "step.skipped"}
    assert skipped == {"side": "not selected", "join": "not selected"}
    assert run_pb(PB).runs == {"start": 1, "spin": 3, "store": 1, "side": 1, "join": 1, "cleanup": 1}


REUSE = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/reuse}
workflow:
  - step: start
    tool:
      - make: {kind: python, code: "raise RuntimeError('ran again')"}
    next:
      arcs: [{step: use, when: "{{ start.n == 7 }}"}]
  - step: use
    tool:
      - total: {kind: python, input: {n: "{{ start.n }}"}, code: "def main(n):\\n    return n + 1"}
"""


def test_a_reused_step_does_not_run_and_its_recorded_result_routes_on(run_pb):
    """issue 42: a subset's upstream step stands on the result an earlier execution recorded."""
    r = run_pb(REUSE, select=["start", "use"], reuse={"start": {"execution_id": "e0", "result": {"n": 7}}})
    assert r.status == "completed", r.events[-1].data
    assert r.runs == {"start": 1, "use": 1}
    assert not [e for e in r.events if e.name.startswith("task.") and e.step == "start"]  # no task ran
    done = {e.step: e.data["result"] for e in r.events if e.name == "step.done"}
    assert done == {"start": {"n": 7}, "use": 8}
    req = next(e for e in r.events if e.name == "playbook.execution.requested")
    assert req.data["reuse"] == {"start": {"execution_id": "e0", "result": {"n": 7}}}
