"""Property: a built playbook's YAML parses back to exactly the built model.

Hypothesis generates builder programs (steps, tasks of several kinds, task
policies with every directive, loops, admission, arcs with args and writes,
keychain, workload, executor) and checks parse(build(x).to_yaml()) == build(x).
"""

from __future__ import annotations

import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.dsl.builder import (
    admit,
    admit_else,
    arc,
    canonical_yaml,
    http,
    loop,
    noop,
    otherwise,
    playbook,
    playbook_id,
    python,
    route,
    subplaybook,
    tool,
    when,
    workbook,
)

EXAMPLES = 2 * settings().max_examples  # 200; 100 under the CI profile (tests/conftest.py)
CHILD_DEF = {
    "apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "c", "path": "g/c"},
    "workflow": [{"step": "start", "tool": [{"t": {"kind": "noop", "result": "{{ workload.x }}"}}]}],
}  # fmt: skip
_RUNS: list[float] = []

# text without template delimiters (a `{{` that does not parse is a validation error, tested elsewhere)
text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="{}%#"), max_size=12)
names = st.from_regex(r"[a-z][a-z0-9_]{0,7}", fullmatch=True)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)
json_values = st.recursive(
    scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(names, c, max_size=3), max_leaves=8
)
templates = st.sampled_from(
    ["{{ outcome.status == 'error' }}", "{{ ctx.n > 2 }}", "{{ workload.flag }}", True, False]
)
set_blocks = st.dictionaries(
    st.builds(lambda p, n: p + n, st.sampled_from(["ctx.", "iter.", ""]), names), json_values, max_size=2
)


@st.composite
def policies(draw, labels: list[str]):
    rules = []
    for _ in range(draw(st.integers(0, 3))):
        do = draw(st.sampled_from(["continue", "retry", "jump", "break", "fail"]))
        kw = {}
        if do == "retry":
            kw = {"attempts": draw(st.integers(1, 5) | st.just("{{ 2 }}")), "delay": draw(st.none() | st.floats(0, 5)),
                  "backoff": draw(st.none() | st.sampled_from(["none", "fixed", "linear", "exponential"]))}  # fmt: skip
        elif do == "jump":
            kw = {"to": draw(st.sampled_from([*labels, "previous"]))}
        kw["set_ctx"] = draw(st.none() | st.dictionaries(names, json_values, max_size=2))
        kw["set_iter"] = draw(st.none() | st.dictionaries(names, json_values, max_size=1))
        rules.append(when(draw(templates), do, **kw))
    if draw(st.booleans()):
        rules.append(otherwise(draw(st.sampled_from(["continue", "fail", "break"]))))
    return rules if rules or draw(st.booleans()) else None


# step `spec`: runner hints beside admission (`policy` keys other than admit are kept only beside it)
step_specs = (
    st.none()
    | st.dictionaries(names.filter(lambda n: n != "policy"), json_values, max_size=2)
    | st.builds(
        lambda extra: {"policy": extra},
        st.dictionaries(
            names.filter(lambda n: n not in ("admit", "rules")), json_values, min_size=1, max_size=2
        ),
    )
)
loops = st.builds(
    lambda over, it, mode, mif, ex: loop(over, it, mode=mode, max_in_flight=mif, exec=ex),
    st.sampled_from(["{{ workload.items }}", "{{ range(3) }}"]) | st.lists(json_values, max_size=3),
    names.filter(str.isidentifier),
    st.sampled_from(["sequential", "parallel"]),
    st.none() | st.integers(1, 8),
    st.none() | st.sampled_from(["distributed", "local"]),
)


@st.composite
def tasks(draw, count: int, entries: list[str]):
    labels = draw(st.lists(names, min_size=count, max_size=count, unique=True))
    out = []
    for label in labels:
        pol = draw(policies(labels))
        set_ = draw(st.none() | set_blocks)
        lp = draw(st.none() | loops)
        choice = draw(st.integers(0, 6))
        if choice == 0:
            out.append(python(draw(st.sampled_from(["result = 1", "def main(x):\n    return x\n"])), label=label,
                              input=draw(st.none() | st.dictionaries(names, json_values, max_size=2)),
                              policy=pol, set=set_, loop=lp))  # fmt: skip
        elif choice == 1:
            out.append(http(draw(st.sampled_from(["GET", "POST"])), "http://example/{{ workload.x }}", label=label,
                            headers=draw(st.none() | st.dictionaries(names, text, max_size=2)), policy=pol,
                            spec=draw(st.none() | st.just({"timeout": 5}))))  # fmt: skip
        elif choice == 2:
            out.append(noop(draw(json_values), label=label, policy=pol, set=set_))
        elif choice == 3:
            out.append(tool("noop", label=label, result=draw(json_values), loop=lp))
        elif choice == 4 and entries:
            out.append(workbook(draw(st.sampled_from(entries)), input=draw(st.none() | st.dictionaries(names, json_values, max_size=2)),
                                label=label, policy=pol))  # fmt: skip
        elif choice == 5:
            out.append(subplaybook(draw(names) + "/" + draw(names), input=draw(st.none() | st.dictionaries(names, json_values, max_size=2)),
                                   return_step=draw(st.none() | names), label=label))  # fmt: skip
        else:  # an inline child: kept verbatim (its templates are its own)
            out.append(subplaybook(definition=draw(st.sampled_from([CHILD_DEF, "{{ plan }}"])), credentials=draw(st.none() | st.lists(names, max_size=2)),
                                   label=label, policy=pol))  # fmt: skip
    return out


@st.composite
def builders(draw):
    step_names = draw(st.lists(names, min_size=1, max_size=5, unique=True))
    b = playbook(draw(names), path=draw(names) + "/" + draw(names), description=draw(st.none() | text))
    if draw(st.booleans()):
        b.workload(draw(st.dictionaries(names, json_values, max_size=4)))
    for _ in range(draw(st.integers(0, 2))):
        b.keychain(draw(names), kind="static", map=draw(st.dictionaries(names, text, min_size=1, max_size=2)))
    if draw(st.booleans()):
        b.executor(entry_step=draw(st.sampled_from(step_names)), max_step_runs=draw(st.none() | st.integers(1, 99)),
                   generated=draw(st.none() | st.just({"allow_kinds": ["noop"], "allow_credentials": []})))  # fmt: skip
    entries = draw(st.lists(names, max_size=2, unique=True))
    for e in entries:
        b.workbook(e, python("result = input", input=draw(st.none() | st.dictionaries(names, json_values, max_size=2))),
                   desc=draw(st.none() | text))  # fmt: skip
    for name in step_names:
        pipeline = draw(tasks(draw(st.integers(0, 3)), entries))
        arcs = []
        for target in draw(st.lists(st.sampled_from(step_names), max_size=3)):
            arcs.append(arc(target, when=draw(st.none() | templates), args=draw(st.none() | st.dictionaries(names, json_values, max_size=2)),
                            set=draw(st.none() | st.dictionaries(st.builds(lambda n: "ctx." + n, names), json_values, max_size=1))))  # fmt: skip
        nxt = route(*arcs, mode=draw(st.sampled_from(["exclusive", "inclusive"]))) if arcs else None
        if not pipeline and nxt is None:
            nxt = route()
        ad = draw(st.none() | st.lists(st.builds(admit, templates, st.booleans()), max_size=2))
        if ad is not None and draw(st.booleans()):
            ad.append(admit_else(draw(st.booleans())))
        b.step(name, tool=pipeline or None, next=nxt, loop=draw(st.none() | loops), admit=ad,
               input=draw(st.none() | st.dictionaries(names, json_values, max_size=2)),
               set=draw(st.none() | set_blocks), desc=draw(st.none() | text), spec=draw(step_specs))  # fmt: skip
    return b


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(builders())
def test_yaml_of_a_built_playbook_parses_back_to_the_same_model(b):
    t0 = time.perf_counter()
    built = b.build()
    text_ = b.to_yaml()
    parsed = load_playbook_dict(yaml.safe_load(text_))
    assert parsed == built
    assert parsed.model_dump(by_alias=True) == built.model_dump(by_alias=True)
    # the identity is a function of content: the same however the YAML is laid out
    before = built.model_dump(by_alias=True)
    assert playbook_id(parsed) == playbook_id(built)
    assert built.model_dump(by_alias=True) == before  # serializing never writes into the model
    assert canonical_yaml(load_playbook_dict(yaml.safe_load(canonical_yaml(built)))) == canonical_yaml(built)
    _RUNS.append(time.perf_counter() - t0)


def test_the_property_ran_its_examples():
    """Runs after the property (file order): it saw the configured number of examples."""
    assert len(_RUNS) >= EXAMPLES * 0.9, len(_RUNS)
