"""analyze() keeps its analyses by their whole input (entry, steps, arcs; issue 35): every execution
of a playbook analyzed it again. A playbook that differs in any arc, step or entry gets its own."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from noetl_dagster.dsl.parse import load_playbook_dict
from noetl_dagster.engine import graph
from noetl_dagster.engine.graph import analyze


def _doc(order: list[str], succ: dict[str, list[str]]) -> dict:
    return {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "g", "path": "t/g"},
            "workflow": [{"step": s, "tool": {"kind": "noop"}, "next": {"arcs": [{"step": t} for t in succ[s]]}}
                         for s in order]}  # fmt: skip


def _fields(g: graph.StepGraph) -> tuple:
    return g.entry, g.order, g.succ, g.pred, g.back_edges, g.joins, g.sccs, {j: g.feeders[j] for j in g.joins}


@st.composite
def graphs(draw):
    n = draw(st.integers(1, 6))
    order = ["start", *(f"s{i}" for i in range(1, n))]
    succ = {s: draw(st.lists(st.sampled_from(order), max_size=3, unique=True)) for s in order}
    return order, succ


@settings(max_examples=300, deadline=None)
@given(graphs())
def test_a_kept_analysis_equals_a_fresh_one(g):
    order, succ = g
    pb = load_playbook_dict(_doc(order, succ))
    kept = analyze(pb)
    fresh = graph._analyze(pb.entry_step, list(order), {s: list(t) for s, t in succ.items()})  # noqa: SLF001
    assert _fields(kept) == _fields(fresh)


def test_the_same_playbook_is_analyzed_once_and_a_changed_one_again():
    order = ["start", "a", "b"]
    one = analyze(load_playbook_dict(_doc(order, {"start": ["a"], "a": ["b"], "b": []})))
    again = analyze(load_playbook_dict(_doc(order, {"start": ["a"], "a": ["b"], "b": []})))  # another object
    assert again is one and one.back_edges == set()
    cycle = analyze(load_playbook_dict(_doc(order, {"start": ["a"], "a": ["b"], "b": ["a"]})))
    assert cycle is not one and cycle.back_edges == {("b", "a")}
    # the same arcs split differently between the steps is another graph (the key cannot alias)
    moved = analyze(load_playbook_dict(_doc(order, {"start": ["a", "b"], "a": [], "b": []})))
    assert moved is not one and moved.succ == {"start": ["a", "b"], "a": [], "b": []}


def test_a_big_playbook_is_not_kept(monkeypatch):
    monkeypatch.setattr(graph, "_CACHED_STEPS", 2)
    order = ["start", "a", "b"]
    doc = _doc(order, {"start": ["a"], "a": ["b"], "b": []})
    assert analyze(load_playbook_dict(doc)) is not analyze(load_playbook_dict(doc))
