"""executor.spec.final_step and executor.spec.no_next_is_error (issue 16.4; docs/dsl.md §5)."""

from __future__ import annotations

import pytest

from noetl_dagster.dsl.files import check_file_with_warnings

FINAL = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: final, path: t/final}
executor:
  spec: {final_step: cleanup}
workload: {fail: false}
workflow:
  - step: start
    tool: {kind: python, code: "result = 1"}
    next:
      arcs:
        - step: work
  - step: work
    tool: {kind: python, input: {fail: "{{ workload.fail }}"}, code: "assert not fail, 'boom'; result = 2"}
  - step: cleanup
    tool:
      kind: python
      input: {status: "{{ args.status }}", last: "{{ args.last_step }}", bare: "{{ status }}"}
      code: "result = {'status': status, 'last': last, 'bare': bare}"
"""


def test_final_step_runs_once_after_success(run_pb):
    r = run_pb(FINAL)
    assert r.status == "completed"
    assert r.runs == {"start": 1, "work": 1, "cleanup": 1}
    assert r.results["cleanup"] == {"status": "completed", "last": "work", "bare": "completed"}
    names = [e.name for e in r.events]
    # it runs after everything else and before the terminal pair
    assert r.started_steps()[-1] == "cleanup"
    assert names.index("workflow.finished") > max(r.index("step.done", "cleanup"))


def test_final_step_runs_after_a_failure_and_sees_it(run_pb):
    r = run_pb(FINAL, {"fail": True})
    assert r.status == "failed"
    assert r.runs == {"start": 1, "work": 1, "cleanup": 1}
    assert r.results["cleanup"] == {"status": "failed", "last": "work", "bare": "failed"}
    # a successful finaliser does not turn a failed execution into a completed one
    assert r.named("playbook.processed")[0].data["status"] == "failed"


def test_a_failing_final_step_fails_the_execution(run_pb):
    text = FINAL.replace("code: \"result = {'status'", "code: \"raise RuntimeError('x'); result = {'status'")
    r = run_pb(text)
    assert r.runs["cleanup"] == 1
    assert r.status == "failed"


def test_final_step_admission_can_skip_it(run_pb):
    text = FINAL.replace(
        "  - step: cleanup\n",
        "  - step: cleanup\n    spec: {policy: {admit: {rules: [{when: \"{{ args.status == 'failed' }}\", then: {allow: true}},"
        " {else: {then: {allow: false}}}]}}}\n",
    )
    ok = run_pb(text)
    assert ok.status == "completed" and "cleanup" not in ok.runs
    assert len(ok.named("step.skipped", "cleanup")) == 1
    bad = run_pb(text, {"fail": True})
    assert bad.runs.get("cleanup") == 1


NO_NEXT = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: nne, path: t/nne}
executor:
  spec: {no_next_is_error: NNE}
workload: {go: false}
workflow:
  - step: start
    tool: {kind: python, code: "result = 1"}
    next:
      spec: {mode: exclusive ONM}
      arcs:
        - step: b
          when: "{{ workload.go }}"
  - step: b
    tool: {kind: python, code: "result = 2"}
"""


def _nne(flag: str, on_no_match: str = "") -> str:
    return NO_NEXT.replace("NNE", flag).replace(
        " ONM", f", on_no_match: {on_no_match}" if on_no_match else ""
    )


def test_no_next_is_error_fails_a_dead_end(run_pb):
    r = run_pb(_nne("true"))
    assert r.status == "failed"
    (ev,) = r.named("next.evaluated", "start")
    assert ev.data["unhandled_failure"] is True and ev.data["no_match_error"] is True


@pytest.mark.parametrize("flag,onm", [("false", ""), ("true", "quiet")])
def test_dead_end_is_a_quiet_end_without_it_or_with_quiet(run_pb, flag, onm):
    r = run_pb(_nne(flag, onm))
    assert r.status == "completed"
    assert "no_match_error" not in r.named("next.evaluated", "start")[0].data


def test_no_next_is_error_leaves_matched_arcs_and_terminal_steps_alone(run_pb):
    r = run_pb(_nne("true"), {"go": True})  # b has no `next`: a terminal step, not a dead end
    assert r.status == "completed" and r.runs == {"start": 1, "b": 1}


@pytest.mark.parametrize(
    "spec,rule",
    [
        ("{final_step: nope}", "unknown-final-step"),
        ("{final_step: start}", "final-step-entry"),
        ("{final_step: b}", "final-step-routed"),
        ("{no_next_is_error: 'yes'}", "no-next-is-error"),
        ("{bogus: 1}", "executor-spec-key"),
    ],
)
def test_executor_spec_errors(write_pb, spec, rule):
    path = write_pb(_nne("false").replace("spec: {no_next_is_error: false}", f"spec: {spec}"))
    _, issues, _ = check_file_with_warnings(path)
    assert rule in {i.rule for i in issues}, [str(i) for i in issues]


def test_final_step_with_next_is_an_error(write_pb):
    path = write_pb(FINAL.rstrip() + "\n    next: {arcs: [{step: work}]}\n")
    _, issues, _ = check_file_with_warnings(path)
    assert "final-step-next" in {i.rule for i in issues}


def test_noetl_executor_keys_without_effect_are_warned(write_pb):
    text = (
        _nne("false")
        .replace("executor:\n", "executor:\n  profile: local\n  requires: {tools: [python]}\n")
        .replace(
            "spec: {no_next_is_error: false}",
            "spec: {no_next_is_error: false, policy: {defaults: {timeout_s: 3}}}",
        )
    )
    pb, issues, warnings = check_file_with_warnings(write_pb(text))
    assert issues == [] and pb is not None
    assert {w.path for w in warnings if w.rule == "executor-no-effect"} == {
        "executor.profile", "executor.requires", "executor.spec.policy"}  # fmt: skip


def test_kubernetes_placement_keys_are_implemented_not_unknown(write_pb):
    """executor.spec.profiles / default_profile drive translator/k8s.py (docs/deploy.md): no error, and an
    executor.profile naming one of them is not warned as without effect (regression: both were refused)."""
    text = (
        _nne("false")
        .replace("executor:\n", "executor:\n  profile: small\n")
        .replace(
            "spec: {no_next_is_error: false}",
            "spec: {no_next_is_error: false, default_profile: small, profiles: {small: {resources: {cpu: 1}}}}",
        )
    )
    pb, issues, warnings = check_file_with_warnings(write_pb(text))
    assert issues == [] and pb is not None, [str(i) for i in issues]
    assert "executor.profile" not in {w.path for w in warnings}
