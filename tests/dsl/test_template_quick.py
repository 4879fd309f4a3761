"""The renderer's quick expressions (issue 46: a one-step run imports no Jinja2): a dotted name,
alone or with an integer literal (``+ - * < <= > >= == !=``), is evaluated without the gate, and
every value it gives is the gate's own (value and type); anything else is left to the gate."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from noetl_dagster.dsl.template_front import QUICK_MISS, TemplateError, render_quick
from noetl_dagster.dsl.template_lazy import engine_template_env
from noetl_dagster.dsl.templates import template_env

OPS = ["", "+", "-", "*", "<", "<=", ">", ">=", "==", "!="]
VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
)


def _gate(source: str, scope: dict) -> object:
    return template_env()._render_template(source, scope)


@given(value=VALUES, op=st.sampled_from(OPS), literal=st.integers(min_value=0, max_value=999_999_999),
       spaces=st.sampled_from(["", " ", "  "]))  # fmt: skip
def test_a_quick_value_is_the_gates_value(value, op, literal, spaces):
    source = f"{{{{{spaces}workload.n{spaces}{op}{spaces}{literal if op else ''}{spaces}}}}}"
    scope = {"workload": {"n": value}}
    quick = render_quick(source, scope)
    try:
        expected = _gate(source, scope)
    except Exception:  # noqa: BLE001 - the gate refuses it: the quick path must have left it to the gate
        assert quick is QUICK_MISS
        return
    if quick is QUICK_MISS:
        return
    assert type(quick) is type(expected)
    assert quick == expected or (isinstance(quick, float) and math.isnan(quick) and math.isnan(expected))


@pytest.mark.parametrize(
    "source",
    [
        "{{ workload.n | string }}",  # a filter
        "{{ 2 * workload.n }}",  # a literal first
        "{{ workload.n * -2 }}",  # a signed literal
        "{{ workload.n ** 2 }}",  # an operator outside the set
        "{{ true }}",  # a Jinja literal, not a name
        "{{ loop.index }}",  # a special name
        "{{ missing * 2 }}",  # not in the scope (Jinja's undefined)
        "{{ workload.items.n }}",  # a step into a list
        "{{ workload.big * 2 }}",  # an integer beyond the quick range
        "{{ workload.text * 2 }}",  # repetition: the gate's limits
        "{{ workload.n }} ",  # padding: a string
        "n={{ workload.n }}",
        "{% if workload.n %}1{% endif %}",
    ],
)
def test_anything_else_is_left_to_the_gate(source):
    scope = {"workload": {"n": 2, "items": [1], "big": 2**80, "text": "ab"}}
    assert render_quick(source, scope) is QUICK_MISS
    front = engine_template_env()
    try:
        expected = _gate(source, scope)
    except TemplateError as e:
        with pytest.raises(TemplateError, match="undefined") as raised:
            front.render_str(source, scope)
        assert str(raised.value) == str(e)
        return
    assert front.render_str(source, scope) == expected


def test_the_engine_renderer_answers_quick_expressions_as_the_gate():
    front = engine_template_env()
    scope = {"workload": {"n": 2, "name": "x", "flag": False, "none": None}, "ctx": {"i": 9}}
    for source in ["{{ workload.n * 2 }}", "{{ ctx.i < 10 }}", "{{ ctx.i >= 10 }}", "{{ workload.name }}",
                   "{{ workload.flag }}", "{{ workload.none }}", "{{ ctx . i - 1 }}", "{{ workload.n == 2 }}\n"]:  # fmt: skip
        assert render_quick(source, scope) is not QUICK_MISS, source
        got, expected = front.render_str(source, scope), _gate(source, scope)
        assert got == expected and type(got) is type(expected), source
    assert front.truthy("{{ ctx.i < 10 }}", scope) is True
    assert front.truthy("{{ ctx.i > 10 }}", scope) is False
