"""Static analysis of a playbook's step graph.

Joins (SEMANTICS.md §5): a step with two or more distinct predecessor steps,
not counting back-edges (u->v where v dominates u: every path from the entry
to u passes through v; independent of the order steps and arcs are written in). A join fires when no live position can still reach one of its
predecessors without passing through the join itself: its *feeders*.
Strongly connected components are what the Dagster translator condenses into
region ops.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from noetl_dagster.util.graphs import strongly_connected

if TYPE_CHECKING:
    from noetl_dagster.dsl.model import Playbook


class Feeders(Mapping[str, frozenset[str]]):
    """The feeders of each join, computed on first use by one backwards search from the join's
    predecessors that never enters the join, and kept as a bitset over the step order.

    Computing them all up front cost O(joins x steps) time and held a set per join: a
    10,000-step playbook of 3,332 joins took 10.6 s and 1.7 GB to analyze before anything ran
    (tests/engine/test_graph_scale.py). Now analysis, validation and translation compute none;
    a run computes a join's when a token first waits on it."""

    def __init__(
        self, joins: set[str], order: list[str], succ: dict[str, list[str]], pred: dict[str, set[str]]
    ):
        self._joins, self._order, self._pred = joins, order, pred
        self._index = {s: i for i, s in enumerate(order)}
        self._rev: dict[str, list[str]] = {s: [] for s in order}
        for a, targets in succ.items():
            for b in targets:
                self._rev[b].append(a)
        self._bits: dict[str, int] = {}  # (a race computes one twice, the same value: no lock)

    def bits(self, join: str) -> int:
        b = self._bits.get(join)
        if b is None:
            if join not in self._joins:
                return 0
            seen = {p for p in self._pred[join] if p != join}
            todo, rev = list(seen), self._rev
            while todo:
                for m in rev[todo.pop()]:
                    if m != join and m not in seen:
                        seen.add(m)
                        todo.append(m)
            mask = bytearray(len(self._order) // 8 + 1)
            for s in seen:
                i = self._index[s]
                mask[i >> 3] |= 1 << (i & 7)
            b = self._bits[join] = int.from_bytes(mask, "little")
        return b

    def feeds(self, join: str, step: str) -> bool:
        """Whether ``step`` can reach one of ``join``'s predecessors without passing through it."""
        i = self._index.get(step)
        return i is not None and bool(self.bits(join) >> i & 1)

    def __getitem__(self, join: str) -> frozenset[str]:
        if join not in self._joins:
            raise KeyError(join)
        b = self.bits(join)
        return frozenset(s for i, s in enumerate(self._order) if b >> i & 1)

    def __iter__(self) -> Iterator[str]:
        return (s for s in self._order if s in self._joins)

    def __len__(self) -> int:
        return len(self._joins)


@dataclass
class StepGraph:
    entry: str
    order: list[str]
    succ: dict[str, list[str]]
    pred: dict[str, set[str]]  # forward predecessors (back-edges removed)
    back_edges: set[tuple[str, str]]
    joins: set[str]
    feeders: Feeders | None = None  # set by analyze
    sccs: list[list[str]] = field(default_factory=list)  # topological order of the condensation

    def is_join(self, step: str) -> bool:
        return step in self.joins

    def join_waits_on(self, join: str, steps: Iterable[str]) -> bool:
        """Whether any of ``steps`` (other than the join itself) feeds ``join`` (SEMANTICS §5)."""
        if join not in self.joins or self.feeders is None:
            return False
        feeds = self.feeders.feeds
        return any(s != join and feeds(join, s) for s in steps)

    def join_ready(self, join: str, pending: Iterable[str], running: Iterable[str]) -> bool:
        """The join barrier (SEMANTICS §5): no step with a queued token and no running step feeds it."""
        return not self.join_waits_on(join, pending) and not self.join_waits_on(join, running)

    def needed_for(self, targets: Iterable[str]) -> set[str]:
        """The steps a run producing ``targets`` needs: they and every step with a path to one of them
        (joins, loops and cycles on the way included, back-edges too); the rest may be skipped."""
        rev: dict[str, list[str]] = {}
        for a, ts in self.succ.items():
            for b in ts:
                rev.setdefault(b, []).append(a)
        seen: set[str] = set()
        todo = [t for t in targets if t in self.succ]
        while todo:
            s = todo.pop()
            if s not in seen:
                seen.add(s)
                todo.extend(rev.get(s, ()))
        return seen

    def scc_of(self) -> dict[str, int]:
        return {s: i for i, comp in enumerate(self.sccs) for s in comp}

    def is_cyclic(self, comp: list[str]) -> bool:
        return len(comp) > 1 or comp[0] in self.succ.get(comp[0], [])


def _dominance_back_edges(entry: str, succ: dict[str, list[str]], order: list[str]) -> set[tuple[str, str]]:
    """Back-edges by dominance (SEMANTICS §5): u->v where every path from the entry to u
    passes through v. Independent of the order steps and arcs are written in. Steps the
    entry cannot reach hang off a virtual root, so none of them dominates another.

    Immediate dominators by Cooper, Harvey and Kennedy's iterative algorithm over reverse
    postorder, then "v dominates u" as interval containment in the dominator tree: about linear
    for playbook graphs (the set-intersection fixpoint it replaces took 7.4 s at 1,000 steps)."""
    root = ""  # not a step name (names are non-empty)
    nodes = list(dict.fromkeys([*order, entry]))
    reach = _reach_without(entry, succ, root)
    children: dict[str, list[str]] = {root: [entry, *(n for n in nodes if n not in reach)]}
    for n in nodes:
        children[n] = succ.get(n, [])
    # postorder numbers of an iterative DFS from the root
    post: dict[str, int] = {}
    seen = {root}
    stack: list[tuple[str, int]] = [(root, 0)]
    while stack:
        v, i = stack.pop()
        kids = children.get(v, [])
        while i < len(kids) and kids[i] in seen:
            i += 1
        if i < len(kids):
            stack.append((v, i + 1))
            seen.add(kids[i])
            stack.append((kids[i], 0))
        else:
            post[v] = len(post)
    preds: dict[str, list[str]] = {n: [] for n in post}
    for v, kids in children.items():
        if v in post:
            for k in kids:
                if k in preds:
                    preds[k].append(v)
    rpo = sorted(post, key=post.__getitem__, reverse=True)
    idom: dict[str, str] = {root: root}
    changed = True
    while changed:
        changed = False
        for n in rpo[1:]:
            new: str | None = None
            for p in preds[n]:
                if p not in idom:
                    continue
                if new is None:
                    new = p
                    continue
                a, b = p, new
                while a != b:
                    while post[a] < post[b]:
                        a = idom[a]
                    while post[b] < post[a]:
                        b = idom[b]
                new = a
            if new is not None and idom.get(n) != new:
                idom[n], changed = new, True
    # dominator tree intervals: v dominates u iff u's interval lies inside v's
    tree: dict[str, list[str]] = {}
    for n, d in idom.items():
        if n != root:
            tree.setdefault(d, []).append(n)
    tin: dict[str, int] = {}
    tout: dict[str, int] = {}
    clock = 0
    walk: list[tuple[str, bool]] = [(root, False)]
    while walk:
        v, done = walk.pop()
        if done:
            tout[v] = clock
            continue
        tin[v] = clock
        clock += 1
        walk.append((v, True))
        walk.extend((c, False) for c in tree.get(v, []))
    return {
        (a, b)
        for a in nodes
        for b in succ.get(a, [])
        if b in tin and a in tin and tin[b] <= tin[a] and tout[a] <= tout[b]
    }


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


# analyses by their whole input (entry, step order, arcs): every execution of a playbook analyzed it
# anew (~40 us of a five-step execution's ~1 ms of engine CPU, issue 35); a StepGraph is never
# changed after analysis (Feeders fills its own cache with values that depend on the graph only)
_ANALYZED: dict[tuple[Any, ...], StepGraph] = {}
_ANALYZED_MAX = 256
_CACHED_STEPS = 1000  # a bigger playbook is analyzed per run (its run dwarfs it; its graph stays unheld)


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
    if len(order) > _CACHED_STEPS:
        return _analyze(entry, order, succ)
    # the step names, a separator, then each step's targets each list ended by one (names are str)
    key = (entry, *order, None, *(t for targets in succ.values() for t in (*targets, None)))
    hit = _ANALYZED.get(key)
    if hit is not None:
        return hit
    if len(_ANALYZED) >= _ANALYZED_MAX:
        _ANALYZED.clear()
    graph = _ANALYZED[key] = _analyze(entry, order, succ)
    return graph


def _analyze(entry: str, order: list[str], succ: dict[str, list[str]]) -> StepGraph:
    back = _dominance_back_edges(entry, succ, order)
    pred: dict[str, set[str]] = {s: set() for s in order}
    for a, targets in succ.items():
        for b in targets:
            if (a, b) not in back:
                pred[b].add(a)
    joins = {s for s, p in pred.items() if len(p) >= 2}
    feeders = Feeders(joins, order, succ, pred)
    return StepGraph(entry, order, succ, pred, back, joins, feeders, strongly_connected(order, succ))
