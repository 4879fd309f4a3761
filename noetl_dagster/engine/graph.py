"""Static analysis of a playbook's step graph.

Joins (SEMANTICS.md §5): a step with two or more distinct predecessor steps,
not counting back-edges (edges that close a cycle in a depth-first walk from
the entry). A join fires when no live position can still reach one of its
predecessors without passing through the join itself: its *feeders*.
Strongly connected components are what the Dagster translator condenses into
region ops.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from noetl_dagster.dsl.model import Playbook


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


def _dfs_back_edges(entry: str, succ: dict[str, list[str]], order: list[str]) -> set[tuple[str, str]]:
    back: set[tuple[str, str]] = set()
    state: dict[str, int] = {}  # 1 on stack, 2 done

    def visit(root: str) -> None:
        stack = [(root, iter(succ.get(root, [])))]
        state[root] = 1
        while stack:
            node, it = stack[-1]
            for nxt in it:
                st = state.get(nxt, 0)
                if st == 1:
                    back.add((node, nxt))
                elif st == 0:
                    state[nxt] = 1
                    stack.append((nxt, iter(succ.get(nxt, []))))
                    break
            else:
                state[node] = 2
                stack.pop()

    visit(entry)
    for s in order:  # steps unreachable from the entry still get classified
        if s not in state:
            visit(s)
    return back


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


def _tarjan(order: list[str], succ: dict[str, list[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0

    for root in order:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on.add(v)
            nbrs = succ.get(v, [])
            recurse = False
            while i < len(nbrs):
                w = nbrs[i]
                i += 1
                if w not in index:
                    work.append((v, i))
                    work.append((w, 0))
                    recurse = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if recurse:
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                pos = {s: k for k, s in enumerate(order)}
                out.append(sorted(comp, key=pos.__getitem__))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    out.reverse()  # Tarjan yields reverse topological order
    return out


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
    back = _dfs_back_edges(entry, succ, order)
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
    return StepGraph(entry, order, succ, pred, back, joins, feeders, _tarjan(order, succ))
