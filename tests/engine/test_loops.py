"""SEMANTICS §4: loops (sequential / parallel), iteration scopes, results in
index order, stats, failing iterations, max_in_flight, set_ctx conflicts in
parallel loops, nested loops with iter.parent, what `loop.in` may be."""

from __future__ import annotations

import pytest

HEAD = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: l, path: tests/l}
"""


def _loop(items: str, mode: str = "sequential", tool: str = "", extra_spec: str = "", after: str = "") -> str:
    tool = (
        tool
        or """
    tool:
      - t:
          kind: python
          input: {x: "{{ iter.item }}", i: "{{ iter.index }}"}
          code: "result = {'x': x, 'i': i}"
"""
    )
    return (
        HEAD
        + f"""
workload:
  things: [a, b, c]
workflow:
  - step: start
    loop:
      in: "{items}"
      iterator: item
      spec: {{mode: {mode}{extra_spec}}}
"""
        + tool.lstrip("\n")
        + after
    )


def test_sequential_loop_result_shape_and_order(run_pb):
    r = run_pb(_loop("{{ workload.things }}"))
    assert r.status == "completed"
    assert r.results["start"] == {
        "results": [{"x": "a", "i": 0}, {"x": "b", "i": 1}, {"x": "c", "i": 2}],
        "stats": {"total": 3, "ok": 3, "failed": 0},
    }
    iters = [e.iteration for e in r.named("loop.iteration.started")]
    assert iters == [0, 1, 2]
    started = r.named("loop.started")[0]
    assert started.data["total"] == 3 and started.data["mode"] == "sequential"
    done = r.named("loop.done")[0]
    assert done.loop_id == started.loop_id and done.data["result"]["stats"]["ok"] == 3


def test_loop_iterator_is_also_a_bare_name(run_pb):
    r = run_pb(
        _loop(
            "{{ workload.things }}",
            tool="""
    tool:
      kind: python
      input: {v: "{{ item }}"}
      code: "result = v.upper()"
""",
        )
    )
    assert r.results["start"]["results"] == ["A", "B", "C"]


def test_parallel_results_are_in_index_order(run_pb):
    r = run_pb(
        _loop(
            "{{ [0.4, 0.2, 0.0, 0.1] }}",
            "parallel",
            tool="""
    tool:
      kind: python
      input: {d: "{{ iter.item }}", i: "{{ iter.index }}"}
      code: |
        import time
        time.sleep(d)
        result = i
""",
        )
    )
    assert r.results["start"]["results"] == [0, 1, 2, 3]
    # they really ran concurrently: completion order differs from index order
    finished = [e.iteration for e in r.named("loop.iteration.done")]
    assert finished != [0, 1, 2, 3]
    assert r.named("loop.started")[0].data["max_in_flight"] == 16  # the default


MIF_TOOL = """
    tool:
      kind: python
      input: {i: "{{ iter.index }}"}
      code: |
        import time
        t0 = time.monotonic()
        time.sleep(0.15)
        result = {"start": t0, "end": time.monotonic()}
"""


def _max_overlap(results: list[dict]) -> int:
    points = sorted(
        [(r["start"], 1) for r in results] + [(r["end"], -1) for r in results], key=lambda p: (p[0], p[1])
    )
    cur = best = 0
    for _, d in points:
        cur += d
        best = max(best, cur)
    return best


def test_parallel_max_in_flight_is_respected(run_pb):
    r = run_pb(_loop("{{ range(6) | list }}", "parallel", tool=MIF_TOOL, extra_spec=", max_in_flight: 2"))
    res = r.results["start"]["results"]
    assert _max_overlap(res) == 2
    assert r.named("loop.started")[0].data["max_in_flight"] == 2


def test_parallel_max_in_flight_may_be_a_template(run_pb):
    r = run_pb(
        _loop(
            "{{ range(4) | list }}",
            "parallel",
            tool=MIF_TOOL,
            extra_spec=', max_in_flight: "{{ workload.mif }}"',
        ),
        {"mif": 3},
    )
    assert _max_overlap(r.results["start"]["results"]) == 3


def test_sequential_loop_never_overlaps(run_pb):
    r = run_pb(_loop("{{ range(3) | list }}", "sequential", tool=MIF_TOOL))
    assert _max_overlap(r.results["start"]["results"]) == 1


def test_failed_iteration_fails_step_after_loop_done(run_pb):
    r = run_pb(
        _loop(
            "{{ [1, 0, 2] }}",
            tool="""
    tool:
      kind: python
      input: {x: "{{ iter.item }}"}
      code: "result = 10 // x"
""",
            after="""
    next:
      arcs:
        - {step: ok_path, when: "{{ start.stats.failed == 0 }}"}
        - {step: on_loop_done, when: "{{ event.name == 'loop.done' and start.stats.failed > 0 }}"}
  - step: ok_path
    tool: {kind: noop}
  - step: on_loop_done
    tool: {kind: noop}
""",
        )
    )
    assert r.status == "completed"  # handled by the loop.done arc
    assert r.runs == {"start": 1, "on_loop_done": 1}
    assert [e.iteration for e in r.named("loop.iteration.failed")] == [1]
    done = r.named("loop.done")[0]
    assert done.status == "error"
    assert done.data["result"]["stats"] == {"total": 3, "ok": 2, "failed": 1}
    assert done.data["result"]["results"][0] == 10 and done.data["result"]["results"][2] == 5
    assert done.data["result"]["results"][1]["status"] == "error"
    # loop.done comes before step.failed, and arcs see event.name == 'loop.done'
    assert r.index("loop.done", "start")[0] < r.index("step.failed", "start")[0]
    assert r.named("next.evaluated", "start")[0].data["event_name"] == "loop.done"
    assert "1 of 3 loop iterations failed" in r.named("step.failed", "start")[0].data["error"]["message"]
    # SEMANTICS §4: the step's result keeps results and stats although an iteration failed
    assert r.results["start"]["stats"] == {"total": 3, "ok": 2, "failed": 1}
    assert r.results["start"]["results"][1]["status"] == "error"


def test_failed_iteration_result_reaches_arcs_and_later_steps(run_pb):
    """Issue 16.1: arcs testing stats.failed and outcome.result see the aggregate; a later step reads it."""
    r = run_pb(
        _loop(
            "{{ [1, 0, 2, 0] }}",
            tool="""
    tool:
      kind: python
      input: {x: "{{ iter.item }}"}
      code: "result = 10 // x"
""",
            after="""
    next:
      arcs:
        - step: report
          when: "{{ start.stats.failed > 0 and outcome.result.stats.ok == 2 }}"
          args: {failed: "{{ start.stats.failed }}", first: "{{ start.results[0] }}"}
  - step: report
    tool:
      kind: python
      input: {failed: "{{ args.failed }}", n: "{{ start.stats.total }}", kinds: "{{ start.results | map(attribute='status') | list }}"}
      code: "result = {'failed': failed, 'n': n, 'kinds': kinds}"
""",
        )
    )
    assert r.status == "completed"
    assert r.runs == {"start": 1, "report": 1}
    assert r.results["report"]["failed"] == 2 and r.results["report"]["n"] == 4
    assert r.named("next.evaluated", "start")[0].data["errors"] == []


def test_failed_iteration_retry_policy_applies_inside_iteration(run_pb):
    """Per-iteration task policy: `continue` on error turns the failed iteration into an ok one."""
    r = run_pb(
        _loop(
            "{{ [1, 0] }}",
            tool="""
    tool:
      - t:
          kind: python
          input: {x: "{{ iter.item }}"}
          code: "result = 10 // x"
          spec:
            policy:
              rules:
                - when: "{{ outcome.status == 'error' }}"
                  then: {do: retry, attempts: 2, delay: 0}
""",
        )
    )
    assert r.status == "failed"
    assert (
        len(r.named("task.started", "start")) == 3
    )  # iteration 0 once, the failing iteration twice (attempts: 2)
    assert r.results["start"]["stats"] == {"total": 2, "ok": 1, "failed": 1}


def test_failed_iteration_unhandled_fails_execution(run_pb):
    r = run_pb(
        _loop(
            "{{ [1, 0] }}",
            tool="""
    tool:
      kind: python
      input: {x: "{{ iter.item }}"}
      code: "result = 10 // x"
""",
            after="""
    next:
      arcs: [{step: after, when: "{{ outcome.status == 'ok' }}"}]
  - step: after
    tool: {kind: noop}
""",
        )
    )
    assert r.status == "failed"
    assert r.runs == {"start": 1}


def test_loop_step_arcs_evaluated_once_on_loop_done(run_pb):
    r = run_pb(
        _loop(
            "{{ workload.things }}",
            after="""
    next:
      arcs:
        - step: after
          when: "{{ event.name == 'loop.done' }}"
          args: {n: "{{ start.stats.total }}", first: "{{ start.results[0].x }}"}
  - step: after
    tool: {kind: noop, result: "{{ args }}"}
""",
        )
    )
    assert len(r.named("next.evaluated", "start")) == 1
    assert r.runs["after"] == 1
    assert r.results["after"] == {"n": 3, "first": "a"}


def test_loop_over_mapping_iterates_one_item(run_pb):
    r = run_pb(_loop("{{ workload.one }}"), {"one": {"k": 1}})
    assert r.results["start"]["stats"]["total"] == 1
    assert r.results["start"]["results"] == [{"x": {"k": 1}, "i": 0}]


def test_loop_over_previous_loop_aggregate_iterates_its_results(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    loop: {in: "{{ [1, 2, 3] }}", iterator: n}
    tool: {kind: noop, result: "{{ iter.n * 10 }}"}
    next: {arcs: [{step: again}]}
  - step: again
    loop: {in: "{{ start }}", iterator: m}
    tool: {kind: noop, result: "{{ iter.m + 1 }}"}
"""
    )
    assert r.results["again"]["results"] == [11, 21, 31]


def test_loop_over_empty_list_is_done_with_zero_stats(run_pb):
    r = run_pb(_loop("{{ [] }}"))
    assert r.status == "completed"
    assert r.results["start"] == {"results": [], "stats": {"total": 0, "ok": 0, "failed": 0}}


def test_loop_in_literal_list(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    loop:
      in: [3, 4]
      iterator: v
    tool: {kind: noop, result: "{{ iter.v }}"}
"""
    )
    assert r.results["start"]["results"] == [3, 4]


@pytest.mark.parametrize("items", ["{{ 42 }}", "{{ nothing_here }}", "{{ 'not json' }}"])
def test_loop_in_not_a_list_is_an_error_outcome(run_pb, items):
    r = run_pb(_loop(items))
    assert r.status == "failed"
    assert r.results["start"]["error"]["kind"] == "template_error"
    assert not r.named("loop.started")


def test_iter_scope_is_isolated_per_iteration(run_pb):
    r = run_pb(
        _loop(
            "{{ workload.things }}",
            tool="""
    tool:
      - first:
          kind: noop
          result: "{{ iter.seen | default('fresh') }}"
          spec:
            policy:
              rules:
                - when: "{{ true }}"
                  then: {do: continue, set_iter: {seen: "{{ iter.item }}"}}
      - second:
          kind: noop
          result: "{{ _prev }}:{{ iter.seen }}"
""",
        )
    )
    assert r.results["start"]["results"] == ["fresh:a", "fresh:b", "fresh:c"]


def test_sequential_set_ctx_accumulates(run_pb):
    r = run_pb(
        _loop(
            "{{ workload.things }}",
            tool="""
    tool:
      kind: noop
      set: {ctx.joined: "{{ (ctx.joined or '') ~ iter.item }}"}
""",
        )
    )
    assert r.ctx == {"joined": "abc"}


def test_parallel_set_ctx_same_key_is_a_conflict(run_pb):
    r = run_pb(
        _loop(
            "{{ workload.things }}",
            "parallel",
            tool="""
    tool:
      kind: noop
      set: {ctx.last: "{{ iter.item }}"}
""",
        )
    )
    assert r.status == "failed"
    failed = r.named("loop.iteration.failed")
    assert len(failed) == 2  # the first writer owns the key, the other two are rejected
    assert all(e.data["error"]["kind"] == "ctx_conflict" for e in failed)
    assert "ctx.last" in failed[0].data["error"]["message"]
    assert (
        sum(
            isinstance(x, dict) and (x.get("error") or {}).get("kind") == "ctx_conflict"
            for x in r.results["start"]["results"]
        )
        == 2
    )


def test_parallel_set_ctx_conflict_via_policy_rule(run_pb):
    r = run_pb(
        _loop(
            "{{ [1, 2] }}",
            "parallel",
            tool="""
    tool:
      kind: noop
      spec:
        policy:
          rules:
            - when: "{{ true }}"
              then: {do: continue, set_ctx: {total: "{{ iter.item }}"}}
""",
        )
    )
    assert r.status == "failed"
    assert [e.data["error"]["kind"] for e in r.named("loop.iteration.failed")] == ["ctx_conflict"]


def test_parallel_set_iter_is_safe(run_pb):
    r = run_pb(
        _loop(
            "{{ workload.things }}",
            "parallel",
            tool="""
    tool:
      - a:
          kind: noop
          set: {iter.mine: "{{ iter.item }}"}
      - b:
          kind: noop
          result: "{{ iter.mine }}"
""",
        )
    )
    assert r.status == "completed"
    assert r.results["start"]["results"] == ["a", "b", "c"]


def test_parallel_same_iteration_may_write_its_key_twice(run_pb):
    r = run_pb(
        _loop(
            "{{ [1] }}",
            "parallel",
            tool="""
    tool:
      - a: {kind: noop, set: {ctx.k: 1}}
      - b: {kind: noop, set: {ctx.k: 2}}
""",
        )
    )
    assert r.status == "completed" and r.ctx == {"k": 2}


def test_nested_loop_task_sees_iter_parent(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    loop:
      in: "{{ ['a', 'b'] }}"
      iterator: outer
    tool:
      - inner:
          kind: python
          loop:
            in: "{{ [1, 2, 3] }}"
            iterator: n
          input:
            o: "{{ iter.parent.outer }}"
            oi: "{{ iter.parent.index }}"
            n: "{{ iter.n }}"
            i: "{{ iter.index }}"
          code: "result = f'{o}{oi}-{n}{i}'"
"""
    )
    assert r.status == "completed"
    outer = r.results["start"]
    assert outer["stats"] == {"total": 2, "ok": 2, "failed": 0}
    assert outer["results"][0]["results"] == ["a0-10", "a0-21", "a0-32"]
    assert outer["results"][1]["results"] == ["b1-10", "b1-21", "b1-32"]
    # two loop levels in the log: 1 outer loop + 2 inner loops
    assert len(r.named("loop.started")) == 3


def test_iter_parent_is_none_in_a_top_level_loop(run_pb):
    r = run_pb(
        _loop(
            "{{ [1] }}",
            tool="""
    tool:
      kind: noop
      result: "{{ iter.parent is none }}"
""",
        )
    )
    assert r.results["start"]["results"] == [True]


def test_nested_loop_inner_failure_fails_outer_iteration(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    loop: {in: "{{ [1, 0] }}", iterator: d}
    tool:
      - inner:
          kind: python
          loop: {in: "{{ [1, 2] }}", iterator: n}
          input: {n: "{{ iter.n }}", d: "{{ iter.parent.d }}"}
          code: "result = n // d"
"""
    )
    assert r.status == "failed"
    outer = r.named("loop.done")[-1]
    assert outer.data["result"]["stats"] == {"total": 2, "ok": 1, "failed": 1}


def test_loop_positions_replay(run_pb):
    from noetl_dagster.engine.replay import replay
    from noetl_dagster.storage.event_stores import open_event_store

    r = run_pb(
        _loop(
            "{{ [1, 0, 2] }}",
            tool="""
    tool:
      kind: python
      input: {x: "{{ iter.item }}"}
      code: "result = 1 // x"
""",
        )
    )
    with open_event_store(r.result.event_store_url) as store:
        state = replay(store, r.result.execution_id)
    (pos,) = state.loops.values()
    assert pos.snapshot() == {"step": "start", "total": 3, "done": [0, 2], "failed": [1], "finished": True}
