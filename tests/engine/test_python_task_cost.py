"""Issue 35: what a python task and a big context cost per step, as counts (benchmarks/bench_python_task.py
has the times). Each test counts work that used to grow with a value's size or with the number of calls."""

from __future__ import annotations

import builtins
import sys

import pytest

from noetl_dagster.dsl import kinds, templates
from noetl_dagster.dsl.templates import TemplateError, template_env
from noetl_dagster.tools import core
from noetl_dagster.tools.configs import PythonConfig
from noetl_dagster.util.jsonstream import json_size_bound

CYCLE = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: cost, path: tests/cost}
workload: {n: 5}
workflow:
  - step: start
    tool: {kind: noop}
    set: {ctx.i: 0, ctx.big: "{{ range(10000) | list }}"}
    next: {arcs: [{step: tick}]}
  - step: tick
    tool:
      kind: python
      input: {i: "{{ ctx.i }}"}
      code: |
        result = {"i": i + 1}
    set: {ctx.i: "{{ tick.i }}"}
    next: {arcs: [{step: tick, when: "{{ ctx.i < workload.n }}"}]}
"""


def test_a_flat_list_is_copied_without_a_python_call_per_item(monkeypatch):
    """`{{ ctx.trail + [x] }}` and `{{ ctx.big }}`: the limits' checks ran a Python walk per item
    (the counting cycle's superlinear part); now C loops, the render budget still ticked per item."""
    calls, units = [0], [0]
    real_tick = templates.tick

    def counting(n: int = 1) -> None:
        calls[0] += 1
        units[0] += n
        real_tick(n)

    monkeypatch.setattr(templates, "tick", counting)
    big = list(range(10_000))
    out = template_env().render_str("{{ ctx.big }}", {"ctx": {"big": big}})
    assert out == big and out is not big  # a copy: a task mutating its input cannot reach ctx
    assert calls[0] < 10 and units[0] >= 10_000
    calls[0] = units[0] = 0
    words = template_env().render_str("{{ w + ['z'] }}", {"w": ["ab"] * 5000})
    assert len(words) == 5001 and calls[0] < 10 and units[0] >= 5001


def test_the_flat_copy_keeps_the_limits():
    env = template_env()
    with pytest.raises(TemplateError, match="integer beyond"):
        env.render_str("{{ xs }}", {"xs": [1] * 20 + [2**20_000]})
    with pytest.raises(TemplateError, match="more than 1000000 items"):
        env.render_str("{{ xs }}", {"xs": list(range(1_200_000))})
    with pytest.raises(TemplateError, match="characters"):
        env.render_str("{{ xs }}", {"xs": ["x" * (8 * 2**20)] * 9})
    mixed = [1, "a", None, 2.5, True, [1], {"k": 1}, (1, 2), 3, 4]
    assert env.render_str("{{ xs }}", {"xs": mixed}) == [1, "a", None, 2.5, True, [1], {"k": 1}, (1, 2), 3, 4]


def _next_calls(value: object) -> int:
    """builtins.next calls json_size_bound makes on ``value`` (one per item it walks)."""
    n = [0]

    def prof(frame, event, arg):
        if event == "c_call" and arg is builtins.next:
            n[0] += 1

    sys.setprofile(prof)
    try:
        json_size_bound(value, 10**9)
    finally:
        sys.setprofile(None)
    return n[0]


def test_the_event_size_bound_does_not_walk_a_flat_list():
    assert json_size_bound(list(range(1000)), 10**9) >= 1000 + 1 + 1000
    assert json_size_bound(["ab"] * 100, 10**9) == 100 + 1 + 100 * 4
    assert _next_calls({"patch": {"trail": list(range(10_000))}}) < 20
    assert _next_calls({"patch": {"rows": [{"a": 1}] * 50}}) > 50  # nested items are still walked


def test_repeated_python_code_is_compiled_and_validated_once(monkeypatch):
    compiled, validated = [0], [0]
    real_compile, real_validate = builtins.compile, PythonConfig.model_validate.__func__

    def counting_compile(*a, **k):
        compiled[0] += 1
        return real_compile(*a, **k)

    def counting_validate(cls, *a, **k):
        validated[0] += 1
        return real_validate(cls, *a, **k)

    monkeypatch.setattr(core, "compile", counting_compile, raising=False)
    monkeypatch.setattr(PythonConfig, "model_validate", classmethod(counting_validate))
    getattr(kinds, "_VALID", {}).clear()
    kind = kinds.get_tool("python")
    code = "result = {'i': i + 1}  # issue 35 compile-once\n"
    for i in range(5):
        cfg = {"code": code, "input": {"i": i}}
        kind.check_config(cfg)
        assert core.run_python_inline(code, {"i": i}, {}) == {"i": i + 1}
    # validated never: python's config is declared plain (kinds.ToolKind.plain_config), and a str
    # `code` is within the declaration (tests/tools/test_config_accepts_any.py checks it is the model's)
    assert compiled[0] == 1 and validated[0] == 0
    with pytest.raises(kinds.ToolConfigError):  # a config outside it is validated by the model
        kind.check_config({"code": 5, "input": {}})


def test_a_validator_on_input_turns_the_config_cache_off():
    from pydantic import field_validator

    from noetl_dagster.tools.configs import ToolConfig

    class Checked(ToolConfig):
        @field_validator("input")
        @classmethod
        def _positive(cls, v):
            assert v["n"] > 0
            return v

    assert kinds._input_free(PythonConfig) and not kinds._input_free(Checked)


def test_a_task_sees_a_fresh_namespace_and_cannot_change_the_next_ones():
    assert core.run_python_inline("json = None\nos = 1\nresult = 1", {}, {}) == 1
    assert core.run_python_inline("result = json.dumps([os.sep != ''])", {}, {}) == "[true]"
    assert core.run_python_inline("result = 'leak' in globals()", {}, {}) is False
    core.run_python_inline("leak = 1\nresult = 0", {}, {})
    assert core.run_python_inline("result = 'leak' in globals()", {}, {}) is False


def test_an_untouched_ctx_value_is_shared_not_copied_or_measured(run_pb, monkeypatch):
    """The 10,000-item list is put in ctx once; later steps neither copy nor size nor encode it."""
    from noetl_dagster.engine import recorder

    seen: list[int] = []
    real_bound = recorder.json_size_bound

    def bound(v, cap):
        seen.append(len(v) if isinstance(v, list) else 0)
        return real_bound(v, cap)

    monkeypatch.setattr(recorder, "json_size_bound", bound)
    run = run_pb(CYCLE)
    assert run.status == "completed" and run.runs["tick"] == 5
    assert seen.count(10_000) == 1  # the start step's patch only
    patches = run.named("ctx.patched")
    assert "big" in patches[0].data["patch"] and all("big" not in p.data["patch"] for p in patches[1:])
    assert run.ctx["big"] == list(range(10_000))


def test_a_task_result_mutated_by_the_next_task_does_not_change_the_recorded_one(run_pb):
    run = run_pb("""
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: alias, path: tests/alias}
        workflow:
          - step: start
            tool: {kind: python, code: "result = {'xs': list(range(20))}"}
            set: {ctx.xs: "{{ start.xs }}"}
            next: {arcs: [{step: mutate}]}
          - step: mutate
            tool:
              kind: python
              input: {xs: "{{ ctx.xs }}", ys: "{{ start.xs }}"}
              code: |
                xs.append(99)
                ys.clear()
                result = {"n": len(xs)}
    """)
    assert run.status == "completed" and run.results["mutate"] == {"n": 21}
    assert run.ctx["xs"] == list(range(20)) and run.results["start"] == {"xs": list(range(20))}


def test_repeated_rhai_code_is_parsed_once(monkeypatch):
    """A rhai step in a cycle runs the same script each time: one parse, not one a step."""
    from noetl_dagster.dsl import rhai

    parsed = [0]
    real = rhai._parse

    def counting(code):
        parsed[0] += 1
        return real(code)

    monkeypatch.setattr(rhai, "_parse", counting)
    monkeypatch.setattr(rhai, "_TREES", {}, raising=False)
    code = "let n = start;\nn - 1 // issue 35 parse-once"
    assert [rhai.run(code, {"start": i}) for i in range(4)] == [-1, 0, 1, 2]
    assert parsed[0] == 1
    with pytest.raises(rhai.RhaiError):  # errors are not cached away
        rhai.run("let = ;")
    with pytest.raises(rhai.RhaiError):
        rhai.run("let = ;")


def _render_both(monkeypatch, source, scope):
    """(value or error text, work units) read the fast way, then through Jinja only."""
    from noetl_dagster.dsl import template_limits as lim

    out = []
    for through_jinja in (False, True):
        env = template_env()
        if through_jinja:
            monkeypatch.setattr(templates, "_lookup", lambda s, p: templates._MISS)
        work = []
        real_end = lim.end
        monkeypatch.setattr(lim, "end", lambda w=work, e=real_end: (w.append(lim.budget().work), e())[1])
        try:
            got = env.render_str(source, scope)
        except TemplateError as e:
            got = f"error: {e}"
        out.append((got, work))
        monkeypatch.undo()
    return out


def test_a_dotted_name_reads_the_scope_as_jinja_would(monkeypatch):
    """`{{ ctx.i }}`-style inputs (a python task's usual input) skip Jinja: same value, same error,
    same work counted as the Jinja render, for hits, misses, non-mappings and reserved names."""
    from noetl_dagster.engine.scope import ResultView, Scope

    live = {"i": 3, "rows": [{"a": 1}], "_p": 1, "items": [1], "s": "ab", "n": None}
    scope = Scope({"ctx": live, "workload": {"n": 5}}, (live, {"tick": ResultView({"i": 4})}))
    sources = ["{{ ctx.i }}", "{{ctx.rows}}", "{{ ctx . i }}\n", "{{ tick.data.i }}", "{{ tick.i }}", "{{ i }}",
               "{{ ctx._p }}", "{{ ctx.items }}", "{{ ctx.nope }}", "{{ nope.x.y }}", "{{ ctx.s.upper }}",
               "{{ ctx.n.x }}", "{{ range }}", "{{ none }}", "{{ true }}", "{{ ctx.i.__class__ }}",
               "{{ ctx.rows.0 }}", "{{ workload.n }}", "{{ ctx.i }} "]  # fmt: skip
    for source in sources:
        (fast, fast_work), (slow, slow_work) = _render_both(monkeypatch, source, scope)
        if callable(slow):  # a bound method or a global function: equal by what it is
            assert fast == slow or repr(fast) == repr(slow), source
        else:
            assert fast == slow and type(fast) is type(slow), (source, fast, slow)
        assert fast_work == slow_work, (source, fast_work, slow_work)
    big = list(range(5000))
    got = template_env().render_str("{{ ctx.big }}", {"ctx": {"big": big}})
    assert got == big and got is not big  # still a copy


def test_a_dotted_name_renders_without_jinja(monkeypatch):
    env = template_env()
    env.render_str("{{ ctx.i }}", {"ctx": {"i": 1}})
    monkeypatch.setattr(env, "_context", lambda *a: pytest.fail("rendered through Jinja"))
    assert env.render_str("{{ ctx.i }}", {"ctx": {"i": 2}}) == 2
    with pytest.raises(BaseException, match="rendered through Jinja"):  # a miss still asks Jinja
        env.render_str("{{ ctx.j }}", {"ctx": {"i": 2}})


def test_a_config_with_an_unhashable_value_is_validated_every_call(monkeypatch):
    validated = [0]
    real_validate = PythonConfig.model_validate.__func__

    def counting_validate(cls, *a, **k):
        validated[0] += 1
        return real_validate(cls, *a, **k)

    monkeypatch.setattr(PythonConfig, "model_validate", classmethod(counting_validate))
    # the model itself, not the python kind (whose declared plain config answers without validating)
    kind = kinds.ToolKind(name="probe", fn=lambda inputs, ctx: inputs, config=PythonConfig)
    for _ in range(3):
        kind.check_config({"code": "result = 1", "libs": ["json"], "input": {}})
    assert validated[0] == 3
