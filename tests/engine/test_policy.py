"""SEMANTICS §3: the outcome envelope, task policy (first match, defaults),
directives (continue, retry with backoff, jump to a label / previous, break,
fail) and the order of writes."""

from __future__ import annotations

import pytest
from engine_helpers import ts

HEAD = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: p, path: tests/p}
"""


def _step(tool_yaml: str, extra: str = "") -> str:
    return HEAD + "workflow:\n  - step: start\n    tool:\n" + tool_yaml + extra


# -- outcome envelope -----------------------------------------------------------


def test_ok_outcome_envelope(run_pb):
    r = run_pb(
        _step("""
      - t:
          kind: python
          code: "result = {'a': 1}"
""")
    )
    out = r.task_done("start", "t")[0].data["outcome"]
    assert out["status"] == "ok"
    assert out["result"] == {"a": 1}
    assert out["error"] is None
    assert {"attempt", "duration_ms", "started_at"} <= set(out["meta"])
    assert out["meta"]["attempt"] == 1


def test_error_outcome_envelope_with_py_helper(run_pb):
    r = run_pb(
        _step("""
      - t:
          kind: python
          code: "raise KeyError('missing')"
""")
    )
    ev = r.task_done("start", "t")[0]
    out = ev.data["outcome"]
    assert ev.status == "error" and out["status"] == "error"
    assert {"kind", "message", "retryable", "code"} <= set(out["error"])
    assert out["error"]["retryable"] is False
    assert out["py"]["exception_type"] == "KeyError"
    assert r.status == "failed"


def test_outcome_aliases_output_result_data_response_in_rules(run_pb):
    r = run_pb(
        _step("""
      - t:
          kind: noop
          result: {n: 3}
          spec:
            policy:
              rules:
                - when: "{{ outcome.result.n == 3 and output.data.n == 3 and outcome.response.n == 3 }}"
                  then: {do: continue, set_ctx: {ok: true}}
""")
    )
    assert r.ctx == {"ok": True}


# -- policy evaluation ----------------------------------------------------------


def test_first_matching_rule_wins(run_pb):
    r = run_pb(
        _step("""
      - t:
          kind: noop
          spec:
            policy:
              rules:
                - when: "{{ false }}"
                  then: {do: continue, set_ctx: {rule: 0}}
                - when: "{{ true }}"
                  then: {do: continue, set_ctx: {rule: 1}}
                - when: "{{ true }}"
                  then: {do: continue, set_ctx: {rule: 2}}
                - else:
                    then: {do: continue, set_ctx: {rule: else}}
""")
    )
    assert r.ctx == {"rule": 1}


def test_else_applies_when_nothing_matches(run_pb):
    r = run_pb(
        _step("""
      - t:
          kind: noop
          spec:
            policy:
              rules:
                - when: "{{ false }}"
                  then: {do: fail}
                - else:
                    then: {do: continue, set_ctx: {rule: else}}
""")
    )
    assert r.status == "completed" and r.ctx == {"rule": "else"}


def test_no_policy_error_fails_the_step(run_pb):
    r = run_pb(
        _step("""
      - a:
          kind: python
          code: "raise RuntimeError('x')"
      - b:
          kind: noop
""")
    )
    assert r.status == "failed"
    assert [e.data["task"] for e in r.named("task.done")] == ["a"]


def test_policy_without_match_continues_on_ok(run_pb):
    r = run_pb(
        _step("""
      - a:
          kind: noop
          spec:
            policy:
              rules:
                - when: "{{ false }}"
                  then: {do: fail}
      - b:
          kind: noop
          result: reached
""")
    )
    assert r.status == "completed" and r.results["start"] == "reached"


def test_policy_without_match_fails_on_error(run_pb):
    r = run_pb(
        _step("""
      - a:
          kind: python
          code: "raise RuntimeError('x')"
          spec:
            policy:
              rules:
                - when: "{{ false }}"
                  then: {do: continue}
      - b:
          kind: noop
""")
    )
    assert r.status == "failed"
    assert [e.data["task"] for e in r.named("task.done")] == ["a"]


def test_policy_continue_on_error_is_handled_by_the_rule(run_pb):
    r = run_pb(
        _step("""
      - a:
          kind: python
          code: "raise RuntimeError('x')"
          spec:
            policy:
              rules:
                - when: "{{ outcome.status == 'error' }}"
                  then: {do: continue}
      - b:
          kind: noop
          result: "{{ _prev }}|{{ results.a }}"
""")
    )
    assert r.status == "completed"
    assert r.results["start"] == "None|None"


def test_rule_condition_unknown_filter_fails_the_task(run_pb):
    r = run_pb(
        _step("""
      - a:
          kind: noop
          spec:
            policy:
              rules:
                - when: "{{ [] | no_such_filter }}"
                  then: {do: continue}
""")
    )
    assert r.status == "failed"
    err = r.results["start"]["error"]
    assert err["kind"] == "template_error" and "no_such_filter" in err["message"]


def test_rule_condition_runtime_error_fails_the_task(run_pb):
    r = run_pb(
        _step("""
      - a:
          kind: noop
          spec:
            policy:
              rules:
                - when: "{{ 1 // 0 }}"
                  then: {do: continue}
""")
    )
    assert r.status == "failed"
    err = r.results["start"]["error"]
    assert err["kind"] == "template_error" and "1 // 0" in err["message"]


def test_fail_directive_fails_an_ok_task(run_pb):
    r = run_pb(
        _step("""
      - a:
          kind: noop
          spec:
            policy:
              rules:
                - when: "{{ outcome.status == 'ok' }}"
                  then: {do: fail}
      - b:
          kind: noop
""")
    )
    assert r.status == "failed"
    assert r.results["start"]["error"]["kind"] == "policy_fail"
    assert r.named("task.done")[0].data["directive"] == "fail"


# -- pipeline locals, results, last result -------------------------------------


def test_pipeline_locals_and_step_result_is_last_task(run_pb):
    r = run_pb(
        _step("""
      - first:
          kind: noop
          result: {v: 1}
      - second:
          kind: python
          input: {prev: "{{ _prev }}", named: "{{ results.first }}", bare: "{{ first }}", task: "{{ _task }}", attempt: "{{ _attempt }}"}
          code: |
            result = {"prev": prev, "named": named, "bare": bare, "task": task, "attempt": attempt}
""")
    )
    assert r.results["start"] == {
        "prev": {"v": 1},
        "named": {"v": 1},
        "bare": {"v": 1},
        "task": "second",
        "attempt": 1,
    }


# -- retry ----------------------------------------------------------------------

RETRY = """
      - flaky:
          kind: python
          input: {attempt: "{{ _attempt }}", ok_from: "{{ workload.ok_from }}"}
          code: |
            if attempt < ok_from:
                raise RuntimeError(f"attempt {attempt} fails")
            result = {"attempt": attempt}
          spec:
            policy:
              rules:
                - when: "{{ outcome.status == 'error' }}"
                  then: {do: retry, attempts: ATTEMPTS, backoff: BACKOFF, delay: DELAY}
"""


def _retry_pb(attempts: str = "3", backoff: str = "none", delay: str = "0") -> str:
    body = RETRY.replace("ATTEMPTS", attempts).replace("BACKOFF", backoff).replace("DELAY", delay)
    return _step(body)


def _gaps(r, step: str = "start") -> list[float]:
    """Seconds between each failed attempt's task.done and the next task.started."""
    evs = [e for e in r.events if e.step == step and e.name in ("task.started", "task.done")]
    return [
        ts(b) - ts(a)
        for a, b in zip(evs, evs[1:], strict=False)
        if a.name == "task.done" and b.name == "task.started"
    ]


def test_retry_until_success_counts_attempts(run_pb):
    r = run_pb(_retry_pb("5"), {"ok_from": 3})
    assert r.status == "completed"
    assert r.results["start"] == {"attempt": 3}
    done = r.task_done("start", "flaky")
    assert [e.attempt for e in done] == [1, 2, 3]
    assert [e.data["directive"] for e in done] == ["retry", "retry", "continue"]
    assert [e.data["outcome"]["meta"]["attempt"] for e in done] == [1, 2, 3]


def test_retry_exhausted_on_error_fails(run_pb):
    r = run_pb(_retry_pb("3"), {"ok_from": 99})
    assert r.status == "failed"
    assert len(r.named("task.started")) == 3
    assert "attempt 3 fails" in r.results["start"]["error"]["message"]


def test_retry_attempts_default_is_three(run_pb):
    text = _retry_pb().replace("attempts: 3, ", "")
    r = run_pb(text, {"ok_from": 99})
    assert len(r.named("task.started")) == 3


def test_retry_attempts_may_be_a_template(run_pb):
    r = run_pb(_retry_pb('"{{ workload.n }}"'), {"ok_from": 99, "n": 2})
    assert len(r.named("task.started")) == 2


def test_retry_exhausted_on_ok_outcome_continues(run_pb):
    r = run_pb(
        _step("""
      - poll:
          kind: python
          input: {attempt: "{{ _attempt }}"}
          code: "result = {'ready': False, 'attempt': attempt}"
          spec:
            policy:
              rules:
                - when: "{{ not outcome.result.ready }}"
                  then: {do: retry, attempts: 2, backoff: none}
      - after:
          kind: noop
          result: "{{ _prev.attempt }}"
""")
    )
    assert r.status == "completed"
    assert r.results["start"] == 2
    assert [e.attempt for e in r.task_done("start", "poll")] == [1, 2]


def test_retry_fixed_delay(run_pb):
    r = run_pb(_retry_pb("3", "fixed", "0.05"), {"ok_from": 99})
    gaps = _gaps(r)
    assert len(gaps) == 2
    for g in gaps:
        assert 0.045 <= g < 0.55, gaps


def test_retry_absent_backoff_is_fixed(run_pb):
    text = _retry_pb("3", "X", "0.05").replace("backoff: X, ", "")
    gaps = _gaps(run_pb(text, {"ok_from": 99}))
    assert len(gaps) == 2 and all(0.045 <= g < 0.55 for g in gaps), gaps


def test_retry_none_backoff_has_no_delay(run_pb):
    gaps = _gaps(run_pb(_retry_pb("3", "none", "0.5"), {"ok_from": 99}))
    assert len(gaps) == 2 and all(g < 0.25 for g in gaps), gaps


def test_retry_linear_backoff(run_pb):
    gaps = _gaps(run_pb(_retry_pb("4", "linear", "0.05"), {"ok_from": 99}))
    assert len(gaps) == 3
    for n, g in enumerate(gaps, start=1):  # delay * n
        assert 0.05 * n - 0.005 <= g < 0.05 * n + 0.45, gaps


def test_retry_exponential_backoff(run_pb):
    gaps = _gaps(run_pb(_retry_pb("4", "exponential", "0.05"), {"ok_from": 99}))
    assert len(gaps) == 3
    for n, g in enumerate(gaps, start=1):  # delay * 2^(n-1)
        expected = 0.05 * 2 ** (n - 1)
        assert expected - 0.005 <= g < expected + 0.45, gaps


def test_retry_delay_may_be_a_template(run_pb):
    gaps = _gaps(run_pb(_retry_pb("2", "fixed", '"{{ workload.d }}"'), {"ok_from": 99, "d": 0.05}))
    assert len(gaps) == 1 and 0.045 <= gaps[0] < 0.55, gaps


def test_retry_default_delay_is_one_second(run_pb):
    text = _retry_pb("2", "fixed", "X").replace(", delay: X", "")
    gaps = _gaps(run_pb(text, {"ok_from": 99}))
    assert len(gaps) == 1 and 0.95 <= gaps[0] < 1.8, gaps


def test_retry_task_set_only_applies_on_the_final_attempt(run_pb):
    r = run_pb(
        _step("""
      - flaky:
          kind: python
          input: {attempt: "{{ _attempt }}"}
          code: |
            if attempt < 2:
                raise RuntimeError("x")
            result = attempt
          set: {ctx.calls: "{{ (ctx.calls or 0) + 1 }}"}
          spec:
            policy:
              rules:
                - when: "{{ outcome.status == 'error' }}"
                  then: {do: retry, attempts: 3, backoff: none}
""")
    )
    assert r.ctx == {"calls": 1}


# -- jump -----------------------------------------------------------------------


def test_jump_pagination(run_pb):
    r = run_pb(
        _step("""
      - fetch:
          kind: python
          input: {page: "{{ ctx.page | default(1) }}"}
          code: |
            pages = {1: [1, 2], 2: [3, 4], 3: [5]}
            result = {"rows": pages[page], "page": page, "has_more": page < 3}
          spec:
            policy:
              rules:
                - when: "{{ outcome.result.has_more }}"
                  then:
                    do: jump
                    to: fetch
                    set_ctx:
                      page: "{{ outcome.result.page + 1 }}"
                      rows: "{{ (ctx.rows or []) + outcome.result.rows }}"
                - else:
                    then:
                      do: continue
                      set_ctx:
                        rows: "{{ (ctx.rows or []) + outcome.result.rows }}"
      - summarize:
          kind: python
          input: {collected: "{{ ctx.rows }}"}
          code: "result = {'count': len(collected), 'sum': sum(collected)}"
""")
    )
    assert r.status == "completed"
    assert r.ctx["rows"] == [1, 2, 3, 4, 5]
    assert r.ctx["page"] == 3
    assert [e.data["task"] for e in r.named("task.done")] == ["fetch", "fetch", "fetch", "summarize"]
    assert [e.data["directive"] for e in r.named("task.done")] == ["jump", "jump", "continue", "continue"]
    assert r.results["start"] == {"count": 5, "sum": 15}


def test_jump_previous(run_pb):
    r = run_pb(
        _step("""
      - bump:
          kind: noop
          set: {ctx.count: "{{ (ctx.count or 0) + 1 }}"}
      - check:
          kind: noop
          spec:
            policy:
              rules:
                - when: "{{ ctx.count < 3 }}"
                  then: {do: jump, to: previous}
""")
    )
    assert r.status == "completed"
    assert r.ctx["count"] == 3
    assert [e.data["task"] for e in r.named("task.done")] == ["bump", "check"] * 3


def test_jump_forward_skips_tasks(run_pb):
    r = run_pb(
        _step("""
      - a:
          kind: noop
          spec:
            policy:
              rules:
                - when: "{{ true }}"
                  then: {do: jump, to: c}
      - b:
          kind: noop
      - c:
          kind: noop
          result: c
""")
    )
    assert [e.data["task"] for e in r.named("task.done")] == ["a", "c"]
    assert r.results["start"] == "c"


# -- break ----------------------------------------------------------------------


def test_break_ends_pipeline_successfully(run_pb):
    r = run_pb(
        _step(
            """
      - a:
          kind: noop
          result: from_a
          spec:
            policy:
              rules:
                - when: "{{ outcome.status == 'ok' }}"
                  then: {do: break}
      - b:
          kind: python
          code: "raise RuntimeError('must not run')"
""",
            """
    next: {arcs: [{step: after}]}
  - step: after
    tool: {kind: noop}
""",
        )
    )
    assert r.status == "completed"
    assert [e.data["task"] for e in r.named("task.done", "start")] == ["a"]
    assert r.results["start"] == "from_a"
    assert r.runs == {"start": 1, "after": 1}


def test_break_on_error_outcome_still_succeeds(run_pb):
    r = run_pb(
        _step("""
      - a:
          kind: python
          code: "raise RuntimeError('x')"
          spec:
            policy:
              rules:
                - when: "{{ outcome.status == 'error' }}"
                  then: {do: break}
      - b:
          kind: noop
""")
    )
    assert r.status == "completed"
    assert len(r.named("task.done")) == 1


# -- writes ---------------------------------------------------------------------


def test_writes_order_rule_then_task_then_step_then_arc(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool:
      - t:
          kind: noop
          set: {ctx.trace: "{{ ctx.trace }}t"}
          spec:
            policy:
              rules:
                - when: "{{ true }}"
                  then: {do: continue, set_ctx: {trace: "r"}}
    set: {ctx.trace: "{{ ctx.trace }}s"}
    next:
      arcs:
        - step: next_one
          args: {seen: "{{ ctx.trace }}"}
          set: {ctx.trace: "{{ ctx.trace }}a"}
  - step: next_one
    tool: {kind: noop, result: "{{ args.seen }}"}
"""
    )
    assert r.ctx["trace"] == "rtsa"
    # arc args are rendered before the arc's set is applied
    assert r.results["next_one"] == "rts"
    sources = [e.data["source"] for e in r.named("ctx.patched")]
    assert sources == ["rule:t", "task:t", "step", "arc:0"]


def test_runtime_dialect_set_on_rule_writes_ctx_and_iter(run_pb):
    r = run_pb(
        _step("""
      - t:
          kind: noop
          result: 7
          spec:
            policy:
              rules:
                - else:
                    then:
                      do: continue
                      set: {ctx.a: "{{ output.result }}", step.b: 2, iter.c: 3}
      - u:
          kind: noop
          result: "{{ iter.c }}"
""")
    )
    assert r.ctx == {"a": 7, "b": 2}
    assert r.results["start"] == 3


def test_set_iter_outside_loop_stays_in_the_step(run_pb):
    r = run_pb(
        _step(
            """
      - t:
          kind: noop
          spec:
            policy:
              rules:
                - when: "{{ true }}"
                  then: {do: continue, set_iter: {local: 1}}
""",
            """
    next: {arcs: [{step: b}]}
  - step: b
    tool: {kind: noop, result: "{{ iter.local | default('unset') }}"}
""",
        )
    )
    assert r.ctx == {}
    assert r.results["b"] == "unset"


def test_step_set_template_error_fails_the_step(run_pb):
    r = run_pb(
        _step(
            """
      - t: {kind: noop}
""",
            """
    set: {ctx.x: "{{ 1 / 0 }}"}
""",
        )
    )
    assert r.status == "failed"
    assert r.results["start"]["error"]["kind"] == "template_error"


@pytest.mark.parametrize("kind", ["noop", "python"])
def test_task_input_template_error_is_an_error_outcome_naming_the_template(run_pb, kind):
    extra = '\n          code: "result = 1"' if kind == "python" else ""
    r = run_pb(
        _step(f"""
      - t:
          kind: {kind}
          result: "{{{{ {{}}['a']['b'] + 1 }}}}"{extra}
""")
    )
    assert r.status == "failed"
    out = r.task_done("start", "t")[0].data["outcome"]
    assert out["status"] == "error" and out["error"]["kind"] == "template_error"
    assert "['a']['b'] + 1" in out["error"]["message"]


def test_retry_exhausted_on_ok_outcome_applies_the_task_set(run_pb):
    # exhausted retries on an ok outcome continue, exactly like `do: continue`: the task's own set applies once
    r = run_pb(
        _step("""
      - poll:
          kind: noop
          result: {ready: false}
          set: {ctx.polled: "{{ (ctx.polled or 0) + 1 }}"}
          spec:
            policy:
              rules:
                - when: "{{ not outcome.result.ready }}"
                  then: {do: retry, attempts: 3, backoff: none}
""")
    )
    assert r.status == "completed"
    assert len(r.task_done("start", "poll")) == 3
    assert r.ctx == {"polled": 1}
    assert [e.data["directive"] for e in r.task_done("start", "poll")] == ["retry", "retry", "continue"]


@pytest.mark.parametrize("field", ["attempts", "delay"])
def test_retry_parameter_template_error_is_an_error_outcome(run_pb, field):
    params = {"attempts": 'attempts: "{{ 1 / 0 }}", delay: 0', "delay": 'attempts: 2, delay: "{{ 1 / 0 }}"'}[
        field
    ]
    r = run_pb(
        _step(f"""
      - t:
          kind: python
          code: "raise RuntimeError('x')"
          spec:
            policy:
              rules:
                - when: "{{{{ outcome.status == 'error' }}}}"
                  then: {{do: retry, {params}}}
""")
    )
    assert r.status == "failed"
    err = r.results["start"]["error"]
    assert err["kind"] == "template_error" and "1 / 0" in err["message"]


@pytest.mark.parametrize(
    ("backoff", "delay", "expected"),
    [
        (None, 0.5, [0.5, 0.5, 0.5]),  # absent = fixed
        ("fixed", 0.5, [0.5, 0.5, 0.5]),
        ("none", 0.5, [0.0, 0.0, 0.0]),
        ("linear", 0.5, [0.5, 1.0, 1.5]),  # delay * n
        ("exponential", 0.5, [0.5, 1.0, 2.0]),  # delay * 2^(n-1)
        ("linear", None, [1.0, 2.0, 3.0]),  # default delay 1 s
        ("exponential", "{{ 0.25 * 2 }}", [0.5, 1.0, 2.0]),  # a template
    ],
)
def test_retry_delay_formula(backoff, delay, expected):
    """The exact schedule (the timing tests above show the delays are really slept)."""
    from noetl_dagster.dsl import RuleThen
    from noetl_dagster.engine.scope import Scope
    from noetl_dagster.engine.worker import Worker

    worker = Worker(None)  # the delay needs only the template environment
    then = RuleThen(do="retry", backoff=backoff, delay=delay)
    assert [worker._retry_delay(then, n, Scope({}, ())) for n in (1, 2, 3)] == expected


def test_bare_result_in_rules_set_and_next_step_input(run_pb):
    """Issue 16.5 (core fixture root_scripts/test_script_loading): `{{ result }}` is the task's own
    result in its policy rules and writes, the step's own in its `set`, and in a later step's
    input the most recently finished step's result."""
    r = run_pb("""
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: r, path: tests/r}
workflow:
  - step: start
    tool:
      - t:
          kind: python
          code: "result = {'status': 'success', 'n': 2}"
          spec:
            policy:
              rules:
                - when: "{{ result.n == 2 }}"
                  then: {do: continue, set_ctx: {seen: "{{ result.n }}"}}
    set: {ctx.own: "{{ result.status }}"}
    next: {arcs: [{step: end}]}
  - step: end
    tool:
      kind: python
      input: {result: "{{ result }}"}
      code: |
        assert result.get('status') == 'success'
        result = {'test': 'passed'}
""")
    assert r.status == "completed", r.results
    assert r.ctx == {"seen": 2, "own": "success"}
    assert r.results["end"] == {"test": "passed"}
