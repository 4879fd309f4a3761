"""Issue 16.2/16.3 (SEMANTICS §5): join detection by dominance, independent of
the order steps and arcs are written in; joins inside a cycle join once per
round; joins waiting on each other in an irreducible cycle fire together."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from noetl_dagster.dsl.parse import load_playbook_dict
from noetl_dagster.engine.graph import analyze

HEAD = {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "j", "path": "tests/j"}}

# start fans out to a and b; a and b both feed c; c loops back to a (guarded).
# c -> a is no back-edge (a does not dominate c), so a is a join of start and c.
IRREDUCIBLE = [
    {
        "step": "start",
        "tool": {"kind": "noop"},
        "set": {"ctx.round": 0},
        "next": {"spec": {"mode": "inclusive"}, "arcs": [{"step": "a"}, {"step": "b"}]},
    },
    {"step": "a", "tool": {"kind": "noop"}, "next": {"arcs": [{"step": "c"}]}},
    {"step": "b", "tool": {"kind": "noop"}, "next": {"arcs": [{"step": "c"}]}},
    {
        "step": "c",
        "tool": {"kind": "noop"},
        "set": {"ctx.round": "{{ ctx.round + 1 }}"},
        "next": {
            "spec": {"mode": "inclusive"},
            "arcs": [
                {"step": "a", "when": "{{ ctx.round < 2 }}"},
                {"step": "end", "when": "{{ ctx.round >= 2 }}"},
            ],
        },
    },
    {"step": "end", "tool": {"kind": "noop"}},
]

# a fan-out/join diamond inside a counting cycle: head -> (a | b) -> join -> head
DIAMOND_CYCLE = [
    {
        "step": "start",
        "tool": {"kind": "noop"},
        "set": {"ctx.round": 0},
        "next": {"arcs": [{"step": "head"}]},
    },
    {
        "step": "head",
        "tool": {"kind": "noop"},
        "set": {"ctx.round": "{{ ctx.round + 1 }}"},
        "next": {"spec": {"mode": "inclusive"}, "arcs": [{"step": "a"}, {"step": "b"}]},
    },
    {
        "step": "a",
        "tool": {"kind": "python", "code": "import time; time.sleep(0.01); result = 'a'"},
        "next": {"arcs": [{"step": "join", "args": {"from": "a"}}]},
    },
    {"step": "b", "tool": {"kind": "noop"}, "next": {"arcs": [{"step": "join", "args": {"from": "b"}}]}},
    {
        "step": "join",
        "tool": {
            "kind": "python",
            "input": {"got": "{{ args }}"},
            "code": "result = sorted(g['from'] for g in got)",
        },
        "set": {"ctx.joined": "{{ (ctx.joined or []) + [join] }}"},
        "next": {
            "arcs": [
                {"step": "head", "when": "{{ ctx.round < 3 }}"},
                {"step": "end", "when": "{{ ctx.round >= 3 }}"},
            ]
        },
    },
    {"step": "end", "tool": {"kind": "noop"}},
]


def _text(steps: list[dict]) -> str:
    return yaml.safe_dump({**HEAD, "workflow": steps}, sort_keys=False)


def _permuted(steps: list[dict], step_order: list[int], arc_seed: int) -> list[dict]:
    """Steps reordered (start stays the entry by name) and every router's arcs rotated."""
    out = []
    for k in step_order:
        s = yaml.safe_load(yaml.safe_dump(steps[k]))
        arcs = (s.get("next") or {}).get("arcs")
        if arcs:
            r = arc_seed % len(arcs)
            s["next"]["arcs"] = arcs[r:] + arcs[:r]
        out.append(s)
    return out


def _outcome(r) -> tuple:
    return r.status, r.runs, r.ctx, r.results


def test_back_edges_by_dominance_are_order_independent():
    g1 = analyze(load_playbook_dict(yaml.safe_load(_text(IRREDUCIBLE))))
    swapped = _permuted(IRREDUCIBLE, [0, 2, 1, 4, 3], 1)
    g2 = analyze(load_playbook_dict(yaml.safe_load(_text(swapped))))
    assert g1.back_edges == g2.back_edges == set()  # no step dominates another inside the cycle
    assert g1.joins == g2.joins == {"a", "c"}
    g = analyze(load_playbook_dict(yaml.safe_load(_text(DIAMOND_CYCLE))))
    assert g.back_edges == {("join", "head")} and g.joins == {"join"}


def test_irreducible_cycle_joins_fire_together(run_pb):
    r = run_pb(_text(IRREDUCIBLE))
    assert r.status == "completed"
    # a and c wait only on each other: each time nothing else can run, both fire at once
    assert r.runs == {"start": 1, "a": 2, "b": 1, "c": 3, "end": 2}
    first_a, first_c = r.index("step.scheduled", "a")[0], r.index("step.scheduled", "c")[0]
    assert not any(e.name == "step.started" for e in r.events[min(first_a, first_c) : max(first_a, first_c)])


def test_diamond_inside_counting_cycle_joins_once_per_round(run_pb):
    r = run_pb(_text(DIAMOND_CYCLE))
    assert r.status == "completed"
    assert r.runs == {"start": 1, "head": 3, "a": 3, "b": 3, "join": 3, "end": 1}
    assert r.ctx["joined"] == [["a", "b"]] * 3  # both branches every round (join state resets)
    assert [len(e.data["token_ids"]) for e in r.named("step.scheduled", "join")] == [2, 2, 2]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.permutations(range(5)), st.integers(0, 5), st.permutations(range(6)), st.integers(0, 5))
def test_reordering_steps_and_arcs_never_changes_the_outcome(run_pb, p1, s1, p2, s2):
    for steps, order, seed in ((IRREDUCIBLE, p1, s1), (DIAMOND_CYCLE, p2, s2)):
        base = run_pb(_text(steps))
        moved = run_pb(_text(_permuted(steps, list(order), seed)))
        assert _outcome(moved) == _outcome(base)
