"""A python task's `context` global is a copy-on-read view, not the engine's live state: code that
edits what it read (ctx, workload, a step result, the loop item) changes only its own copy, so the
next step sees the recorded state and replay of the event log equals the live run."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

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


TOP_LEVEL = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: pyctx_top, path: tests/pyctx_top}
workload: {n: 1}
workflow:
  - step: start
    tool: {kind: python, code: "result = {'xs': [1, 2]}"}
    set: {ctx.items: [1, 2]}
    next: {arcs: [{step: dump}]}
  - step: dump
    tool:
      kind: python
      code: |
        def names(**kw):
            return sorted(kw)
        text = json.dumps(context)
        back = json.loads(text)
        plain = dict(context)
        spread = {**context}
        context["ctx"]["items"].append(3)   # a local edit, seen by later reads of this task only
        context["extra"] = 1                 # a local name
        del context["extra"]
        result = {
            "json_ctx": back["ctx"], "json_wl": back["workload"], "json_start": back["start"],
            "indent": json.loads(json.dumps(context, indent=1, sort_keys=True))["ctx"],
            "same": sorted(plain) == sorted(spread) == sorted(context) == names(**context) == sorted(back),
            "len": len(context) == len(list(context)) == len(plain),
            "in": ["ctx" in context, "workload" in context, "nope" in context],
            "get": [context.get("nope", 0), context.get("workload")["n"]],
            "eq": context == dict(context.items()),
            "repr": repr(context).startswith("{") and "'items': [1, 2, 3]" in repr(context),
            "items": context["ctx"]["items"],
        }
    next: {arcs: [{step: after}]}
  - step: after
    tool: {kind: python, code: "result = {'items': context['ctx']['items'], 'json': json.loads(json.dumps(context))['ctx']}"}
"""


def test_top_level_context_behaves_like_a_dict(run_pb):
    """json.dumps(context) at the top level, dict(context), **context, iteration, in, get, len, repr,
    ==: a dict's behaviour; writes stay in the task (the next step sees the recorded ctx)."""
    r = run_pb(TOP_LEVEL)
    assert r.status == "completed", r.events[-3:]
    d = r.results["dump"]
    assert d["json_ctx"] == {"items": [1, 2]} and d["json_wl"] == {"n": 1}
    assert d["json_start"] == {"xs": [1, 2]}
    assert d["indent"] == {"items": [1, 2, 3]}
    assert d["same"] is True and d["len"] is True and d["eq"] is True and d["repr"] is True
    assert d["in"] == [True, True, False] and d["get"] == [0, 1]
    assert d["items"] == [1, 2, 3]
    assert r.results["after"] == {"items": [1, 2], "json": {"items": [1, 2]}}
    assert r.ctx == {"items": [1, 2]}


class _Secrets(Mapping):
    """A keychain namespace (a Mapping resolving on access, as engine.keychain's) recording reads."""

    def __init__(self) -> None:
        self.read: list[str] = []

    def __getitem__(self, key: str) -> dict:
        self.read.append(key)
        return {"token": {"value": "s3cret"}}[key]

    def __iter__(self) -> Iterator[str]:
        return iter(["token"])

    def __len__(self) -> int:
        return 1


def test_top_level_view_lists_no_keychain_but_reads_it_by_name():
    keychain = _Secrets()
    scope = Scope({"ctx": {"a": 1}, "keychain": keychain}, ({"a": 1},))
    code = "result = [json.loads(json.dumps(context)), sorted(context), 'keychain' in context]"
    assert core.run_python_inline(code, {}, pycontext.CodeContext(scope)) == [
        {"ctx": {"a": 1}, "a": 1},
        ["a", "ctx"],
        True,
    ]
    assert keychain.read == []  # dumping the context resolved no secret
    code = "result = context['keychain']['token']['value']"
    assert core.run_python_inline(code, {}, pycontext.CodeContext(scope)) == "s3cret"
    assert keychain.read == ["token"]


class _CountingNames(dict):
    """A chain mapping (the scope's bare names) that counts how often its names are listed."""

    listed = 0

    def __iter__(self) -> Iterator[str]:
        _CountingNames.listed += 1
        return super().__iter__()

    def keys(self):  # dict.fromkeys / update read a dict subclass's keys through these
        _CountingNames.listed += 1
        return super().keys()


def test_bare_names_are_listed_only_when_code_asks():
    names = _CountingNames({f"k{i}": i for i in range(1000)})
    scope = Scope({"ctx": names, "workload": {"n": 1}}, (names,))
    _CountingNames.listed = 0
    assert core.run_python_inline("result = context['workload']['n']", {}, pycontext.CodeContext(scope)) == 1
    assert _CountingNames.listed == 0  # reading a namespace does not list the bare names (ctx's keys)
    assert core.run_python_inline("result = len(context)", {}, pycontext.CodeContext(scope)) == 1002
    assert _CountingNames.listed >= 1
