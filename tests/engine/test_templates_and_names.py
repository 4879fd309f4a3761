"""SEMANTICS §2: the sandboxed Jinja2 templates, the native-value rule,
undefined names, template errors, and name lookup in a running execution."""

from __future__ import annotations

import pytest

from noetl_dagster.dsl.templates import TemplateError, template_env
from noetl_dagster.engine.scope import Scope

env = template_env()


def render(src, **scope):
    return env.render(src, Scope(scope, ()))


# -- native values ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("src", "expected"),
    [
        ("{{ 1 + 2 }}", 3),
        ("{{ [1, 2] }}", [1, 2]),
        ("{{ {'a': 1} }}", {"a": 1}),
        ("{{ true }}", True),
        ("  {{ 2.5 }}  ", "  2.5  "),  # SEMANTICS §2: padding around the expression makes a string
        (" {{ x }} ", " {'deep': [1]} "),
        ("{{ 2.5 }}\n", 2.5),  # the trailing newline of a YAML block scalar is tolerated
        ("{{ x }}", {"deep": [1]}),
        ("{{ range(3) | list }}", [0, 1, 2]),
        ("{{ len(x.deep) }}", 1),
    ],
)
def test_single_expression_yields_the_native_value(src, expected):
    assert render(src, x={"deep": [1]}) == expected


@pytest.mark.parametrize(
    ("src", "expected"),
    [
        ("{{ 1 + 2 }}!", "3!"),
        ("a{{ 1 }}b{{ 2 }}", "a1b2"),
        ("{{ 1 }} {{ 2 }}", "1 2"),
        ("{% if true %}yes{% endif %}", "yes"),
        ("plain text", "plain text"),
    ],
)
def test_any_other_template_yields_a_string(src, expected):
    assert render(src) == expected


def test_render_walks_dicts_and_lists():
    assert render({"a": ["{{ 1 }}", "x{{ 2 }}"], "b": 3}) == {"a": [1, "x2"], "b": 3}


# -- undefined --------------------------------------------------------------------


def test_undefined_renders_none_natively_and_empty_in_strings():
    assert render("{{ nope }}") is None
    assert render("a{{ nope }}b") == "ab"


def test_undefined_is_chainable_and_falsy():
    assert render("{{ nope.a.b.c }}") is None
    assert render("{{ nope.a['b'] | default(5) }}") == 5
    assert render("{{ not nope }}") is True
    assert render("{{ nope == 1 }}") is False
    assert render("{{ 'y' if nope.x else 'n' }}") == "n"
    assert render("{{ is_defined(nope) }}") is False
    assert render("{{ is_defined(x) }}", x=0) is True


def test_truthy_conditions():
    s = Scope({"v": "false"}, ())
    assert env.truthy(None, s) is True  # an arc without `when` matches
    assert env.truthy("{{ v }}", s) is False  # strings like 'false' are false
    assert env.truthy("{{ 0 }}", s) is False
    assert env.truthy("{{ nope }}", s) is False
    assert env.truthy("{{ 'x' }}", s) is True
    assert env.truthy(True, s) is True and env.truthy(False, s) is False


# -- errors -------------------------------------------------------------------------


@pytest.mark.parametrize("src", ["{{ 1 + }}", "{{ x", "{% if %}", "a {{ (1 }} b"])
def test_syntax_error_raises_template_error_naming_the_template(src):
    with pytest.raises(TemplateError) as e:
        render(src)
    assert src in str(e.value) and "syntax error" in str(e.value)


@pytest.mark.parametrize("src", ["{{ 1 / 0 }}", "x{{ 1 / 0 }}", "{{ none_fn() }}", "{{ {}['k'] + 1 }}"])
def test_exception_while_rendering_raises_template_error(src):
    with pytest.raises(TemplateError) as e:
        render(src, none_fn=None)
    assert src in str(e.value)


def test_check_syntax():
    assert env.check_syntax("{{ a + 1 }}") is None
    assert "line 1" in env.check_syntax("{{ a + }}")


def test_sandbox_blocks_dunder_access():
    # an unsafe attribute as a value, or calling through it, is a template error (an error outcome)
    with pytest.raises(TemplateError):
        render("{{ x.__class__ }}", x=1)
    with pytest.raises(TemplateError):
        render("{{ x.__class__.__mro__[1].__subclasses__() }}", x=1)


# -- names in a running execution ---------------------------------------------------

HEAD = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: n, path: tests/n}
"""


def _probe(run_pb, text, workload=None):
    r = run_pb(HEAD + text, workload)
    assert r.status == "completed", r.results
    return r


def test_bare_name_args_beat_ctx(run_pb):
    r = _probe(
        run_pb,
        """
workload: {k: workload}
workflow:
  - step: start
    tool: {kind: noop}
    set: {ctx.k: ctx}
    next: {arcs: [{step: probe, args: {k: args}}]}
  - step: probe
    tool: {kind: noop, result: "{{ k }}"}
""",
    )
    assert r.results["probe"] == "args"


def test_bare_name_ctx_beats_iter(run_pb):
    r = _probe(
        run_pb,
        """
workflow:
  - step: start
    tool: {kind: noop}
    set: {ctx.k: ctx}
    next: {arcs: [{step: probe}]}
  - step: probe
    loop: {in: "{{ ['iter'] }}", iterator: k}
    tool: {kind: noop, result: "{{ k }}"}
""",
    )
    assert r.results["probe"]["results"] == ["ctx"]


def test_bare_name_iter_beats_task_results(run_pb):
    r = _probe(
        run_pb,
        """
workflow:
  - step: start
    loop: {in: "{{ ['iter'] }}", iterator: k}
    tool:
      - k: {kind: noop, result: task}
      - probe: {kind: noop, result: "{{ k }}"}
""",
    )
    assert r.results["start"]["results"] == ["iter"]


def test_bare_name_task_results_beat_step_results(run_pb):
    r = _probe(
        run_pb,
        """
workflow:
  - step: start
    tool: {kind: noop, result: step}
    next: {arcs: [{step: k}]}
  - step: k
    tool:
      - k: {kind: noop, result: task}
      - probe: {kind: noop, result: "{{ k }}"}
""",
    )
    assert r.results["k"] == "task"


def test_bare_name_step_results_beat_workload(run_pb):
    r = _probe(
        run_pb,
        """
workload: {k: workload, only_w: w}
workflow:
  - step: k
    tool: {kind: noop, result: step}
    next: {arcs: [{step: probe}]}
  - step: probe
    tool: {kind: noop, result: "{{ k }}|{{ only_w }}|{{ workload.k }}"}
""",
    )
    assert r.results["probe"] == "step|w|workload"


def test_undefined_bare_name_in_a_task_renders_none(run_pb):
    r = _probe(
        run_pb,
        """
workflow:
  - step: start
    tool:
      kind: python
      input: {v: "{{ missing }}", s: "x{{ missing.deeper }}y", d: "{{ missing | default('dflt') }}"}
      code: "result = [v, s, d]"
""",
    )
    assert r.results["start"] == [None, "xy", "dflt"]


def test_step_result_data_alias_and_steps_namespace(run_pb):
    r = _probe(
        run_pb,
        """
workflow:
  - step: start
    tool: {kind: noop, result: {v: 1}}
    next: {arcs: [{step: with_data}]}
  - step: with_data
    tool: {kind: noop, result: {data: {v: 2}}}
    next: {arcs: [{step: probe}]}
  - step: probe
    tool:
      kind: noop
      result:
        alias: "{{ start.data.v }}"
        own: "{{ with_data.data.v }}"
        steps: "{{ steps.start.v }}"
        exec: "{{ execution_id is string }}"
""",
    )
    assert r.results["probe"] == {"alias": 1, "own": 2, "steps": 1, "exec": True}


def test_workload_is_merged_and_overrides_win(run_pb):
    r = _probe(
        run_pb,
        """
workload: {a: 1, b: {x: 1}}
workflow:
  - step: start
    tool: {kind: noop, result: "{{ workload }}"}
""",
        {"b": {"y": 2}, "c": 3},
    )
    assert r.results["start"] == {"a": 1, "b": {"y": 2}, "c": 3}


def test_request_may_seed_ctx(run_pb):
    r = _probe(
        run_pb,
        """
workflow:
  - step: start
    tool: {kind: noop, result: "{{ ctx.seed }}"}
""",
        {"ctx": {"seed": 9}},
    )
    assert r.results["start"] == 9 and r.ctx == {"seed": 9}


def test_template_error_in_arc_args_is_recorded_not_raised(run_pb):
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    tool: {kind: noop}
    next: {arcs: [{step: b, args: {v: "{{ 1 / 0 }}"}}]}
  - step: b
    tool: {kind: noop}
"""
    )
    assert r.status == "completed"
    assert r.runs == {"start": 1}
    assert "1 / 0" in r.named("next.evaluated")[0].data["errors"][0]
