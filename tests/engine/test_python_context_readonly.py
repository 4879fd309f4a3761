"""A python task's `context` global is a copy-on-read view, not the engine's live state: code that
edits what it read (ctx, workload, a step result, the loop item) changes only its own copy, so the
next step sees the recorded state and replay of the event log equals the live run."""

from __future__ import annotations

import json

from noetl_dagster.engine.replay import diff_snapshots, replay
from noetl_dagster.engine.scope import ResultView, Scope
from noetl_dagster.runners.local import FINISHED_HOOKS
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.tools import core, pycontext

MUTATE = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: pyctx, path: tests/pyctx}
workload: {n: 1, rows: [{k: 1}]}
workflow:
  - step: start
    tool: {kind: python, code: "result = {'xs': [1, 2]}"}
    set: {ctx.items: [1, 2], ctx.x: 1, ctx.d: {a: [1]}}
    next: {arcs: [{step: mutate}]}
  - step: mutate
    tool:
      kind: python
      code: |
        c = context["ctx"]
        c["items"].append(3)
        c["x"] = 99
        c["d"]["a"].append(2)
        c.setdefault("new", []).append(1)
        context["workload"]["n"] = 7
        context["workload"]["rows"][0]["k"] = 7
        context["start"]["xs"].append(3)
        context["start"]["data"]["xs"].append(4)
        # the task's own edits are visible to itself, as with any local copy
        result = {"seen": context["ctx"]["items"], "x": context["ctx"]["x"], "as_json": json.dumps(c)}
    next: {arcs: [{step: via_main}]}
  - step: via_main
    tool:
      kind: python
      code: |
        def main(context):
            context["ctx"]["items"].clear()
            dict(context["ctx"])["d"]["a"].clear()
            for v in context["ctx"].values():
                if isinstance(v, list):
                    v.append("v")
            return {"ok": True}
    next: {arcs: [{step: each}]}
  - step: each
    loop: {in: "{{ workload.rows }}", iterator: row}
    tool:
      kind: python
      code: |
        context["iter"]["row"]["k"] = 100
        context["ctx"]["items"].append("loop")
        result = {"k": context["iter"]["row"]["k"]}
    next: {arcs: [{step: check}]}
  - step: check
    tool:
      kind: python
      input: {items: "{{ ctx.items }}", n: "{{ workload.n }}"}
      code: |
        result = {"items": items, "n": n, "ctx": dict(context["ctx"]), "wl": dict(context["workload"]),
                  "start": dict(context["start"])}
"""


def test_code_cannot_change_ctx_workload_or_results_and_replay_equals_live(run_pb):
    captured = []
    FINISHED_HOOKS.append(lambda eng: captured.append(eng.state.snapshot()))
    try:
        r = run_pb(MUTATE)
    finally:
        FINISHED_HOOKS.pop()
    assert r.status == "completed", r.events[-3:]
    mutate = r.results["mutate"]
    assert mutate["seen"] == [1, 2, 3] and mutate["x"] == 99
    assert json.loads(mutate["as_json"]) == {"items": [1, 2, 3], "x": 99, "d": {"a": [1, 2]}, "new": [1]}
    assert r.results["each"]["results"] == [{"k": 100}]
    check = r.results["check"]
    assert check["items"] == [1, 2] and check["n"] == 1
    assert check["ctx"] == {"items": [1, 2], "x": 1, "d": {"a": [1]}}
    assert check["wl"]["n"] == 1 and check["wl"]["rows"] == [{"k": 1}]
    assert check["start"] == {"xs": [1, 2]}
    assert r.ctx == {"items": [1, 2], "x": 1, "d": {"a": [1]}} and r.results["start"] == {"xs": [1, 2]}
    with open_event_store(r.result.event_store_url) as store:
        state = replay(store, r.result.execution_id)
    assert diff_snapshots(captured[-1], state.snapshot()) == []


def test_only_the_values_code_reads_are_copied(monkeypatch):
    copied: list[object] = []
    real = pycontext.deepcopy
    monkeypatch.setattr(pycontext, "deepcopy", lambda v: copied.append(v) or real(v))
    big = list(range(10_000))
    live_ctx = {"i": 1, "small": [1], "big": big}
    scope = Scope({"ctx": live_ctx, "workload": {"n": 1}}, ({"r": ResultView({"v": [1]})},))
    code = "result = [context['ctx']['i'], context['ctx']['small'], context['ctx']['small'], 'big' in context['ctx']]"
    assert core.run_python_inline(code, {}, pycontext.CodeContext(scope)) == [1, [1], [1], True]
    assert copied == [[1]] and live_ctx["big"] is big  # `small` once; `big` neither copied nor walked


def test_the_view_keeps_dict_behaviour():
    live = {"ctx": {"a": {"b": [1]}}, "execution_id": "e1"}
    scope = Scope(live, ({"step": ResultView({"v": 1})},))
    code = """
c = context["ctx"]
result = [context.get("execution_id"), context.get("nope", 0), "step" in context, sorted(context),
          context["step"]["data"]["v"], context["step"].get("data")["v"], json.dumps(c), {**c}, c | {"z": 1},
          isinstance(c, dict), list(c.items()), c.pop("a"), "a" in c]
"""
    out = core.run_python_inline(code, {}, pycontext.CodeContext(scope))
    assert out == [
        "e1",
        0,
        True,
        ["ctx", "execution_id", "step"],
        1,
        1,
        '{"a": {"b": [1]}}',
        {"a": {"b": [1]}},
        {"a": {"b": [1]}, "z": 1},
        True,
        [("a", {"b": [1]})],
        {"b": [1]},
        False,
    ]
    assert live == {"ctx": {"a": {"b": [1]}}, "execution_id": "e1"}
