"""Static analysis of a playbook's step graph.

Joins (SEMANTICS.md §5): a step with two or more distinct predecessor steps,
not counting back-edges (u->v where v dominates u: every path from the entry
to u passes through v; independent of the order steps and arcs are written in). A join fires when no live position can still reach one of its
predecessors without passing through the join itself: its *feeders*.
Strongly connected components are what the Dagster translator condenses into
region ops.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from noetl_dagster.dsl.model import Playbook
from noetl_dagster.util.graphs import strongly_connected


@dataclass
class StepGraph:
    entry: str
    order: list[str]
    succ: dict[str, list[str]]
    pred: dict[str, set[str]]  # forward predecessors (back-edges removed)
    back_edges: set[tuple[str, str]]
    joins: set[str]
    feeders: dict[str, frozenset[str]] = field(default_factory=dict)
    sccs: list[list[str]] = field(default_factory=list)  # topological order of the condensation

    def is_join(self, step: str) -> bool:
        return step in self.joins

    def scc_of(self) -> dict[str, int]:
        return {s: i for i, comp in enumerate(self.sccs) for s in comp}

    def is_cyclic(self, comp: list[str]) -> bool:
        return len(comp) > 1 or comp[0] in self.succ.get(comp[0], [])


def _dominance_back_edges(entry: str, succ: dict[str, list[str]], order: list[str]) -> set[tuple[str, str]]:
    """Back-edges by dominance (SEMANTICS §5): u->v where every path from the entry to u
    passes through v. Independent of the order steps and arcs are written in. Steps the
    entry cannot reach hang off a virtual root, so none of them dominates another."""
    root = object()
    reach = _reach_without(entry, succ, "")
    nodes = set(order) | {entry}
    preds: dict[object, set[object]] = {n: set() for n in nodes}
    for a in nodes:
        for b in succ.get(a, []):
            preds.setdefault(b, set()).add(a)
    preds[entry].add(root)
    for n in nodes - reach:
        preds[n].add(root)
    allnodes: set[object] = set(preds) | {root}
    dom: dict[object, set[object]] = {n: set(allnodes) for n in preds}
    dom[root] = {root}
    changed = True
    while changed:
        changed = False
        for n in preds:
            ps = [dom[p] for p in preds[n] if p in dom]
            new = set.intersection(*ps) | {n} if ps else {n}
            if new != dom[n]:
                dom[n], changed = new, True
    return {(a, b) for a in nodes for b in succ.get(a, []) if b in dom.get(a, ())}


def _reach_without(start: str, succ: dict[str, list[str]], blocked: str) -> set[str]:
    seen = {start}
    todo = [start]
    while todo:
        n = todo.pop()
        for m in succ.get(n, []):
            if m != blocked and m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def analyze(pb: Playbook) -> StepGraph:
    order = [s.name for s in pb.workflow]
    succ: dict[str, list[str]] = {}
    for s in pb.workflow:
        targets: list[str] = []
        for t in s.targets:
            if t in pb.steps and t not in targets:
                targets.append(t)
        succ[s.name] = targets
    entry = pb.entry_step
    back = _dominance_back_edges(entry, succ, order)
    pred: dict[str, set[str]] = {s: set() for s in order}
    for a, targets in succ.items():
        for b in targets:
            if (a, b) not in back:
                pred[b].add(a)
    joins = {s for s, p in pred.items() if len(p) >= 2}
    feeders: dict[str, frozenset[str]] = {}
    for j in joins:
        f: set[str] = set()
        for s in order:
            if s == j:
                continue
            reach = _reach_without(s, succ, j)
            if reach & pred[j]:
                f.add(s)
        feeders[j] = frozenset(f)
    return StepGraph(entry, order, succ, pred, back, joins, feeders, strongly_connected(order, succ))
