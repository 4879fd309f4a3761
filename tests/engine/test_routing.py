"""SEMANTICS §5: routing (exclusive / inclusive, arc args and set), cycles, joins,
admission, entry step, completion, handled vs unhandled failure."""

from __future__ import annotations

HEAD = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
"""


# -- cycles ---------------------------------------------------------------------


def test_self_routing_cycle_runs_once_per_token(run_pb):
    r = run_pb(
        HEAD
        + """
workload: {limit: 5}
workflow:
  - step: start
    tool: {kind: noop}
    set: {ctx.n: 0}
    next:
      arcs: [{step: spin}]
  - step: spin
    tool: {kind: noop}
    set: {ctx.n: "{{ ctx.n + 1 }}"}
    next:
      arcs:
        - step: spin
          when: "{{ ctx.n < workload.limit }}"
        - step: end
  - step: end
    tool: {kind: noop}
"""
    )
    assert r.status == "completed"
    assert r.ctx["n"] == 5
    assert r.runs == {"start": 1, "spin": 5, "end": 1}
    assert r.started_steps() == ["start"] + ["spin"] * 5 + ["end"]


def test_two_step_cycle_is_not_a_join(run_pb):
    # a -> b -> a is a back-edge; `a` has start and b as predecessors but only one forward one
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool: {kind: noop}
    next: {arcs: [{step: a}]}
  - step: a
    tool: {kind: noop}
    set: {ctx.k: "{{ (ctx.k or 0) + 1 }}"}
    next: {arcs: [{step: b}]}
  - step: b
    tool: {kind: noop}
    next:
      arcs:
        - {step: a, when: "{{ ctx.k < 3 }}"}
        - {step: done}
  - step: done
    tool: {kind: noop}
"""
    )
    assert r.status == "completed"
    assert r.runs == {"start": 1, "a": 3, "b": 3, "done": 1}


def test_cycle_that_never_exits_stops_only_when_its_condition_fails(run_pb):
    # failing case for the cycle rule: a condition that is never true never re-enters
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - {step: start, when: "{{ false }}"}
        - {step: end}
  - step: end
    tool: {kind: noop}
"""
    )
    assert r.runs == {"start": 1, "end": 1}


# -- exclusive / inclusive ------------------------------------------------------


def test_exclusive_fires_first_match_only(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool: {kind: noop}
    next:
      spec: {mode: exclusive}
      arcs:
        - {step: a, when: "{{ 1 == 2 }}"}
        - {step: b, when: "{{ 1 == 1 }}"}
        - {step: c}
  - step: a
    tool: {kind: noop}
  - step: b
    tool: {kind: noop}
  - step: c
    tool: {kind: noop}
"""
    )
    assert r.runs == {"start": 1, "b": 1}
    ev = r.named("next.evaluated", "start")[0]
    assert ev.data["mode"] == "exclusive"
    assert [f["step"] for f in ev.data["fired"]] == ["b"]


def test_exclusive_is_the_default_mode(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool: {kind: noop}
    next:
      arcs: [{step: a}, {step: b}]
  - step: a
    tool: {kind: noop}
  - step: b
    tool: {kind: noop}
"""
    )
    assert r.runs == {"start": 1, "a": 1}


def test_inclusive_fires_every_match(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool: {kind: noop}
    next:
      spec: {mode: inclusive}
      arcs:
        - {step: a}
        - {step: b, when: "{{ false }}"}
        - {step: c, when: "{{ true }}"}
  - step: a
    tool: {kind: noop}
  - step: b
    tool: {kind: noop}
  - step: c
    tool: {kind: noop}
"""
    )
    assert r.runs == {"start": 1, "a": 1, "c": 1}
    fired = r.named("next.evaluated", "start")[0].data["fired"]
    assert [f["step"] for f in fired] == ["a", "c"]


def test_no_matching_arc_ends_the_branch_and_completes(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool: {kind: noop}
    next:
      arcs: [{step: a, when: "{{ false }}"}]
  - step: a
    tool: {kind: noop}
"""
    )
    assert r.status == "completed"
    assert r.runs == {"start": 1}


# -- joins ----------------------------------------------------------------------

FANOUT = (
    HEAD
    + """
workflow:
  - step: start
    tool: {kind: noop}
    next:
      spec: {mode: inclusive}
      arcs:
        - {step: left, args: {side: L}}
        - {step: right, args: {side: R}}
  - step: left
    tool:
      kind: python
      code: |
        import time
        time.sleep(0.02)
        result = {"side": "L"}
    next:
      arcs: [{step: join, args: {from: left, v: "{{ left.side }}"}}]
  - step: right
    tool:
      kind: python
      code: |
        result = {"side": "R"}
    next:
      arcs: [{step: join, args: {from: right, v: "{{ right.side }}"}}]
  - step: join
    tool:
      kind: python
      input: {arrived: "{{ args }}"}
      code: |
        result = {"arrived": sorted(a["from"] for a in arrived)}
"""
)


def test_inclusive_fanout_then_join_fires_once_after_both(run_pb):
    r = run_pb(FANOUT)
    assert r.status == "completed"
    assert r.runs == {"start": 1, "left": 1, "right": 1, "join": 1}
    join_start = r.index("step.started", "join")[0]
    assert max(r.index("step.done", "left") + r.index("step.done", "right")) < join_start
    # join args = the list of the arriving tokens' args
    sched = r.named("step.scheduled", "join")[0]
    assert sorted(a["from"] for a in sched.data["args"]) == ["left", "right"]
    assert len(sched.data["token_ids"]) == 2
    assert r.results["join"] == {"arrived": ["left", "right"]}


def test_join_fires_when_other_branch_can_no_longer_arrive(run_pb):
    # `right` never routes to the join: the join must not wait forever, and fires once
    r = run_pb(
        FANOUT.replace(
            'arcs: [{step: join, args: {from: right, v: "{{ right.side }}"}}]',
            'arcs: [{step: join, when: "{{ false }}"}]',
        )
    )
    assert r.status == "completed"
    assert r.runs["join"] == 1
    assert r.results["join"] == {"arrived": ["left"]}


def test_join_waits_for_a_skipped_branch_to_be_decided(run_pb):
    # right is denied admission: it can no longer reach the join, which fires once with left's token
    text = FANOUT.replace(
        "  - step: right\n",
        "  - step: right\n    spec:\n      policy:\n        admit:\n          rules:\n"
        "            - when: \"{{ args.side == 'R' }}\"\n              then: {allow: false}\n",
    )
    r = run_pb(text)
    assert r.status == "completed"
    assert "right" not in r.runs
    assert len(r.named("step.skipped", "right")) == 1
    assert r.runs["join"] == 1


def test_exclusive_merge_runs_once_on_either_branch(run_pb):
    text = (
        HEAD
        + """
workload: {pick: a}
workflow:
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - {step: a, when: "{{ workload.pick == 'a' }}"}
        - {step: b}
  - step: a
    tool: {kind: noop, result: from_a}
    next: {arcs: [{step: merge}]}
  - step: b
    tool: {kind: noop, result: from_b}
    next: {arcs: [{step: merge}]}
  - step: merge
    tool: {kind: noop, result: "{{ args }}"}
"""
    )
    ra = run_pb(text, {"pick": "a"})
    assert ra.runs == {"start": 1, "a": 1, "merge": 1}
    rb = run_pb(text, {"pick": "b"}, name="b.yaml")
    assert rb.runs == {"start": 1, "b": 1, "merge": 1}
    # one arriving token: the join's args is a one-item list
    assert ra.results["merge"] == [{}]


def test_non_join_step_fires_once_per_token(run_pb):
    # `sink` has a single predecessor; two tokens from an inclusive router -> two runs
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool: {kind: noop}
    next:
      spec: {mode: inclusive}
      arcs:
        - {step: sink, args: {n: 1}}
        - {step: sink, args: {n: 2}}
  - step: sink
    tool: {kind: noop, result: "{{ args.n }}"}
"""
    )
    assert r.runs["sink"] == 2
    assert [e.data["args"] for e in r.named("step.scheduled", "sink")] == [{"n": 1}, {"n": 2}]


# -- arcs: args and set ---------------------------------------------------------


def test_arc_args_are_rendered_and_become_the_token_payload(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool: {kind: noop, result: {x: 41}}
    next:
      arcs:
        - step: use
          args: {value: "{{ start.x + 1 }}", label: "v{{ start.x }}", fixed: [1, 2]}
  - step: use
    tool:
      kind: python
      input: {v: "{{ args.value }}", bare: "{{ value }}", label: "{{ label }}"}
      code: |
        result = {"v": v, "bare": bare, "label": label}
"""
    )
    assert r.results["use"] == {"v": 42, "bare": 42, "label": "v41"}
    tok = [e for e in r.named("token.enqueued") if e.data["step"] == "use"][0]
    assert tok.data["args"] == {"value": 42, "label": "v41", "fixed": [1, 2]}
    assert tok.data["from_step"] == "start"


def test_arc_without_args_gives_empty_args(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool: {kind: noop}
    next: {arcs: [{step: use}]}
  - step: use
    tool: {kind: noop, result: "{{ args }}"}
"""
    )
    assert r.results["use"] == {}


def test_arc_set_patches_ctx_only_when_the_arc_fires(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - {step: a, when: "{{ false }}", set: {ctx.took: a}}
        - {step: b, set: {ctx.took: b}}
  - step: a
    tool: {kind: noop}
  - step: b
    tool: {kind: noop}
"""
    )
    assert r.ctx == {"took": "b"}


def test_arc_template_error_does_not_fire_and_is_recorded(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - {step: a, when: "{{ 1 / 0 }}"}
        - {step: b}
  - step: a
    tool: {kind: noop}
  - step: b
    tool: {kind: noop}
"""
    )
    assert r.runs == {"start": 1, "b": 1}
    ev = r.named("next.evaluated", "start")[0]
    assert ev.data["errors"] and "1 / 0" in ev.data["errors"][0]


# -- admission ------------------------------------------------------------------

ADMIT = (
    HEAD
    + """
workload: {go: false}
workflow:
  - step: start
    tool: {kind: noop}
    next: {arcs: [{step: gated, args: {who: me}}]}
  - step: gated
    spec:
      policy:
        admit:
          rules:
            - when: "{{ workload.go }}"
              then: {allow: true}
            - else:
                then: {allow: false}
    tool: {kind: noop}
    next: {arcs: [{step: after}]}
  - step: after
    tool: {kind: noop}
"""
)


def test_admission_denied_records_step_skipped_and_ends_the_branch(run_pb):
    r = run_pb(ADMIT)
    assert r.status == "completed"
    assert r.runs == {"start": 1}
    skipped = r.named("step.skipped", "gated")
    assert len(skipped) == 1
    assert skipped[0].data["reason"] == "else"
    assert len(skipped[0].data["token_ids"]) == 1
    assert not r.named("step.started", "gated")
    assert not r.named("step.scheduled", "gated")


def test_admission_allowed_runs_the_step(run_pb):
    r = run_pb(ADMIT, {"go": True})
    assert r.runs == {"start": 1, "gated": 1, "after": 1}
    assert not r.named("step.skipped")


def test_admission_default_allow_when_no_rule_matches(run_pb):
    r = run_pb(ADMIT.replace("            - else:\n                then: {allow: false}\n", ""))
    assert r.runs == {"start": 1, "gated": 1, "after": 1}


def test_admission_reads_token_args(run_pb):
    text = ADMIT.replace('"{{ workload.go }}"', "\"{{ args.who == 'me' }}\"")
    assert run_pb(text).runs == {"start": 1, "gated": 1, "after": 1}
    assert run_pb(text.replace("who: me", "who: you"), name="2.yaml").runs == {"start": 1}


# -- entry ----------------------------------------------------------------------


def test_entry_is_start_step_when_not_first(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: other
    tool: {kind: noop}
  - step: start
    tool: {kind: noop}
"""
    )
    assert r.started_steps() == ["start"]


def test_entry_is_first_step_without_start(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: first
    tool: {kind: noop}
  - step: second
    tool: {kind: noop}
"""
    )
    assert r.started_steps() == ["first"]


def test_entry_step_from_executor_spec(run_pb):
    r = run_pb(
        HEAD
        + """
executor: {spec: {entry_step: second}}
workflow:
  - step: start
    tool: {kind: noop}
  - step: second
    tool: {kind: noop}
"""
    )
    assert r.started_steps() == ["second"]
    assert r.named("workflow.started")[0].data["entry"] == "second"


def test_pure_routing_step_without_tool(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    next: {arcs: [{step: end}]}
  - step: end
    tool: {kind: noop}
"""
    )
    assert r.status == "completed"
    assert r.runs == {"start": 1, "end": 1}


# -- failure: handled vs unhandled ----------------------------------------------

FAIL = (
    HEAD
    + """
workflow:
  - step: start
    tool:
      kind: python
      code: |
        raise RuntimeError("boom")
    next:
      arcs:
        - {step: recover, when: "{{ event.name == 'call.error' }}"}
        - {step: ok_path, when: "{{ event.name == 'call.done' }}"}
  - step: ok_path
    tool: {kind: noop}
  - step: recover
    tool: {kind: noop, result: "{{ start.status }}"}
"""
)


def test_failure_routed_by_a_matching_arc_is_handled(run_pb):
    r = run_pb(FAIL)
    assert r.status == "completed"
    assert r.runs == {"start": 1, "recover": 1}
    ev = r.named("next.evaluated", "start")[0]
    assert ev.data["event_name"] == "call.error"
    assert ev.data["unhandled_failure"] is False
    # a failed step's result is {"status": "error", "error": {...}}
    assert r.results["recover"] == "error"
    assert r.results["start"]["status"] == "error"
    assert "boom" in r.results["start"]["error"]["message"]


def test_an_arc_without_when_routes_a_failure_too(run_pb):
    # SEMANTICS §5: an arc with no `when` matches, so it handles the failure
    r = run_pb(
        FAIL.replace(
            """        - {step: recover, when: "{{ event.name == 'call.error' }}"}
        - {step: ok_path, when: "{{ event.name == 'call.done' }}"}""",
            "        - {step: ok_path}",
        )
    )
    assert r.status == "completed"
    assert r.runs == {"start": 1, "ok_path": 1}
    ev = r.named("next.evaluated", "start")[0]
    assert ev.data["event_name"] == "call.error" and ev.data["unhandled_failure"] is False
    assert r.results["start"]["status"] == "error"


def test_failure_routed_by_step_status_condition(run_pb):
    r = run_pb(FAIL.replace("{{ event.name == 'call.error' }}", "{{ start.status == 'error' }}"))
    assert r.status == "completed"
    assert r.runs == {"start": 1, "recover": 1}


def test_unhandled_failure_fails_the_execution(run_pb):
    r = run_pb(FAIL.replace("{{ event.name == 'call.error' }}", "{{ event.name == 'call.done' }}"))
    assert r.status == "failed"
    assert r.runs == {"start": 1}
    ev = r.named("next.evaluated", "start")[0]
    assert ev.data["unhandled_failure"] is True and ev.status == "error"
    assert r.named("workflow.finished")[0].data["status"] == "failed"
    assert r.named("playbook.processed")[0].status == "error"


def test_failure_without_any_next_fails_the_execution(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool:
      kind: python
      code: "raise ValueError('x')"
"""
    )
    assert r.status == "failed"


def test_unhandled_failure_lets_other_live_branches_drain(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool: {kind: noop}
    next:
      spec: {mode: inclusive}
      arcs: [{step: bad}, {step: good}]
  - step: bad
    tool:
      kind: python
      code: "raise RuntimeError('bad branch')"
    next: {arcs: [{step: never, when: "{{ event.name == 'call.done' }}"}]}
  - step: good
    tool: {kind: noop}
    next: {arcs: [{step: good2}]}
  - step: good2
    tool: {kind: noop}
  - step: never
    tool: {kind: noop}
"""
    )
    assert r.status == "failed"
    assert r.runs == {"start": 1, "bad": 1, "good": 1, "good2": 1}
    assert r.events[-1].name == "playbook.processed"


def test_handled_failure_does_not_fail_even_if_the_handler_path_completes(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool:
      kind: python
      code: "raise RuntimeError('x')"
    next:
      arcs:
        - {step: cleanup, when: "{{ start.status == 'error' }}", args: {why: "{{ start.error.kind }}"}}
  - step: cleanup
    tool: {kind: noop, result: "{{ args.why }}"}
"""
    )
    assert r.status == "completed"
    assert r.results["cleanup"] == "python_exception"


def test_join_inside_a_cycle_fires_once_per_activation(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool: {kind: noop}
    set: {ctx.round: "{{ (ctx.round or 0) + 1 }}"}
    next:
      spec: {mode: inclusive}
      arcs: [{step: a}, {step: b}]
  - step: a
    tool: {kind: noop}
    next: {arcs: [{step: j}]}
  - step: b
    tool: {kind: noop}
    next: {arcs: [{step: j}]}
  - step: j
    tool: {kind: noop, result: "{{ args | length }}"}
    next:
      arcs:
        - {step: start, when: "{{ ctx.round < 3 }}"}
"""
    )
    assert r.status == "completed"
    assert r.runs == {"start": 3, "a": 3, "b": 3, "j": 3}
    assert r.results["j"] == 2
    # every activation of j comes after both branches of its round
    order = [s for s in r.started_steps() if s in ("a", "b", "j")]
    assert order == ["a", "b", "j"] * 3


def test_join_after_an_unhandled_failed_branch_still_fires_and_execution_fails(run_pb):
    r = run_pb(
        FANOUT.replace('result = {"side": "R"}', 'raise RuntimeError("right broke")').replace(
            "arcs: [{step: join, args: {from: right,",
            """arcs: [{step: join, when: "{{ event.name == 'call.done' }}", args: {from: right,""",
        )
    )
    assert r.status == "failed"
    assert r.runs["join"] == 1
    assert r.results["join"] == {"arrived": ["left"]}


def test_event_name_is_call_done_on_success(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - {step: a, when: "{{ event.name == 'call.error' }}"}
        - {step: b, when: "{{ event.name == 'call.done' and event.status == 'ok' and outcome.status == 'ok' }}"}
  - step: a
    tool: {kind: noop}
  - step: b
    tool: {kind: noop}
"""
    )
    assert r.runs == {"start": 1, "b": 1}
    assert r.named("next.evaluated")[0].data["event_name"] == "call.done"


def test_join_waits_while_a_branch_is_still_cycling(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool: {kind: noop}
    next:
      spec: {mode: inclusive}
      arcs: [{step: spin}, {step: quick}]
  - step: spin
    tool: {kind: noop}
    set: {ctx.n: "{{ (ctx.n or 0) + 1 }}"}
    next:
      arcs:
        - {step: spin, when: "{{ ctx.n < 4 }}"}
        - {step: j}
  - step: quick
    tool: {kind: noop}
    next: {arcs: [{step: j}]}
  - step: j
    tool: {kind: noop, result: "{{ args | length }}"}
"""
    )
    assert r.runs == {"start": 1, "spin": 4, "quick": 1, "j": 1}
    assert r.results["j"] == 2
    assert r.index("step.started", "j")[0] > max(r.index("step.done", "spin"))


def test_admission_denied_at_a_join_skips_once_with_every_token(run_pb):
    text = FANOUT.replace(
        "  - step: join\n",
        "  - step: join\n    spec:\n      policy:\n        admit:\n          rules:\n"
        '            - when: "{{ args | length == 2 }}"\n              then: {allow: false}\n',
    )
    r = run_pb(text)
    assert r.status == "completed"
    assert "join" not in r.runs
    (skipped,) = r.named("step.skipped", "join")
    assert len(skipped.data["token_ids"]) == 2
