"""Issue 29.2: a hypothesis generator of allocation-heavy templates (test_fuzz.py style).

A big seed value (long strings, shared references, long lists, big ints) goes through one
to three growing operations (``*``, ``~``, ``+``, ``join``, ``format``, ``%``, ``tojson``,
padding filters, ``split``, ``sum``, ``sorted``, ``max(key=)``...) inside one of several
template shapes (a single expression, string output, loops, ``{% set %}`` blocks, a
namespace that keeps every value alive, macros). Every example must end with a value or
a TemplateError — never another exception, never a MemoryError — and allocate (traced by
tracemalloc, per example) less than 256 MB.

NOETL_FUZZ_EXAMPLES (default 60) sets the example count; run with ``-s`` to see the outcome
counts printed at the end.
"""

from __future__ import annotations

import collections
import os
import tracemalloc

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from noetl_dagster.dsl.templates import TemplateError, template_env

EXAMPLES = int(os.environ.get("NOETL_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # a render is bounded by its own budget; the assertion is on memory
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=os.environ.get("NOETL_FUZZ_RANDOM") is None,
    database=None,
)
PEAK_MB = 256

N = st.sampled_from([0, 1, 7, 1000, 100_000, 1_000_000, 16_000_000, 20_000_000])  # characters
K = st.sampled_from([0, 1, 3, 100, 1000, 100_000, 1_000_000, 10_000_000])  # counts

SEEDS = [
    "'x' * {n}", "'\\u00e9' * {n}", "'a ' * {n}", "'\\t\\n<' * {n}", "['x' * {n}] * {k}", "[0] * {k}",
    "range({k} % 100001) | list", "[[0] * {k}] * {k}", "{{'k': 'x' * {n}}}", "2 ** ({k} % 20000)",
    "lipsum({k} % 1001)", "workload.text * {k}", "[workload] * {k}",
]  # fmt: skip
GROW = [
    "({e}) * {k}", "({e}) ~ ({e})", "({e}) + ({e})", "({e}) | join", "({e}) | join(',' * {k})", "({e}) | tojson",
    "({e}) | tojson(indent={k} % 100)", "({e}) | pprint", "({e}) | string", "str({e})", "'{{}}{{}}'.format({e}, {e})",
    "'%s%s' % (({e}), ({e}))", "'%{k}s' % (({e}),)", "({e}) | center({n})", "({e}) | indent({k} % 10000)",
    "({e}) | wordwrap(1, wrapstring='y' * ({k} % 10000))", "({e}) | replace('x', 'y' * ({k} % 10000))",
    "({e}) | replace('', '-')", "({e}) | urlencode", "({e}) | e", "({e}) | upper", "(({e}) | string).split()",
    "(({e}) | string).expandtabs({k} % 10000)", "(({e}) | string).ljust({n})", "({e}) | list", "({e}) | batch(1) | list",
    "({e}) | slice({k}) | list", "sorted({e})", "max({e}, key=lipsum)", "sum({e}, [])", "({e}) | sum(start=[])",
    "({e})[::-1]", "({e}) | unique | list", "({e}) | map('string') | list", "(({e}) | string) | fromjson",
    "zip({e}, {e}) | list", "({e}) | b64encode", "(({e}) | string).translate({{120: 'y' * ({k} % 10000)}})",
    "(({e}) | string).encode()", "({e}) | dictsort", "({e}) | items | list", "({e}) | selectattr('x') | list",
]  # fmt: skip
SHAPES = [
    "{{{{ {e} }}}}",
    "{{{{ ({e}) | length }}}}",
    "x{{{{ {e} }}}}y",
    "{{% for i in range({k} % 100001) %}}{{{{ {e} }}}}{{% endfor %}}",
    "{{% set ns = namespace(v=[]) %}}{{% for i in range({k} % 1001) %}}{{% set ns.v = ns.v + [{e}] %}}{{% endfor %}}{{{{ ns.v | length }}}}",
    "{{% set s %}}{{% for i in range({k} % 100001) %}}{{{{ {e} }}}}{{% endfor %}}{{% endset %}}{{{{ s | length }}}}",
    "{{% macro m(v) %}}{{{{ v }}}}{{{{ v }}}}{{% endmacro %}}{{{{ m({e}) | length }}}}",
    "{{% set l = {e} %}}{{% for a in l %}}{{% for b in l %}}{{% endfor %}}{{% endfor %}}x",
]  # fmt: skip


@st.composite
def heavy_templates(draw: st.DrawFn) -> str:
    e = draw(st.sampled_from(SEEDS)).format(n=draw(N), k=draw(K))
    for _ in range(draw(st.integers(1, 3))):
        e = draw(st.sampled_from(GROW)).format(e=e, n=draw(N), k=draw(K))
    return draw(st.sampled_from(SHAPES)).format(e=e, k=draw(K))


COUNTS: collections.Counter[str] = collections.Counter()


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    if COUNTS:
        print(
            f"\nallocation-heavy templates: {sum(COUNTS.values())} examples: "
            + ", ".join(f"{k} {v}" for k, v in sorted(COUNTS.items()))
        )


@FUZZ
@given(src=heavy_templates())
def test_allocation_heavy_templates_end_cleanly_in_bounded_memory(src):
    env = template_env()
    scope = {"workload": {"text": "abc" * 1000, "n": 3}, "ctx": {}}
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        try:
            value = env.render_str(src, scope)
            outcome = "accepted"
        except TemplateError as e:
            assert "MemoryError" not in e.message and "out of memory" not in e.message, e.message
            outcome = "rejected by a limit" if e.message.startswith("limit:") else "other template error"
        peak_mb = (tracemalloc.get_traced_memory()[1] - base) / 2**20
    finally:
        tracemalloc.stop()
    value = None  # noqa: F841 - drop it before the next example
    COUNTS[outcome] += 1
    event(outcome)
    assert peak_mb < PEAK_MB, f"{src[:200]} allocated {peak_mb:.0f} MB"
