"""The shape of a playbook's Dagster job, computed without Dagster.

The step graph is condensed into strongly connected components (a DAG): an
acyclic single step is a *step node*, a cycle (incl. a self-loop) is a
*region node* that runs the engine's token machine over its steps. The job is
``noetl_start -> nodes`` with one optional output per condensed edge.

Which node gets a token is decided at run time by the engine; Dagster only
needs to know when an op *may* have work downstream. An op yields its output
towards a target node when some step of that node, or of any node below it in
the job, holds a pending token or an unfinished step run. In a first run that
is exactly "an arc fired"; in a resumed run it walks Dagster down to the work
left in the event log, with the ops in between doing nothing.

Steps compiled to their own job (``mode="per_step"``, or ``spec.dagster.run:
separate`` on a step) are left out of the main job; the token-routing sensor
launches them, and a resumed run of the main job picks up what they route back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from noetl_dagster.dsl.model import Playbook, Step
from noetl_dagster.engine.graph import StepGraph, analyze
from noetl_dagster.util.graphs import strongly_connected

MODES = ("default", "per_step")


@dataclass
class Node:
    key: str  # stable id inside the playbook: "step:<name>" or "region:<first step>"
    kind: str  # "step" | "region"
    steps: tuple[str, ...]
    succ: list[str] = field(default_factory=list)  # node keys in the same job
    pred: list[str] = field(default_factory=list)
    reach: frozenset[str] = frozenset()  # own steps + steps of every node below it in the job

    @property
    def first(self) -> str:
        return self.steps[0]


@dataclass
class JobPlan:
    playbook: Playbook
    graph: StepGraph
    mode: str
    nodes: dict[str, Node]  # main-job nodes, in topological order
    roots: list[str]  # nodes fed by noetl_start
    separate: list[str]  # steps that run in their own job (routed by the sensor)
    node_of_step: dict[str, str]

    @property
    def start_reach(self) -> frozenset[str]:
        out: set[str] = set()
        for r in self.roots:
            out |= self.nodes[r].reach
        return frozenset(out)


def runs_separately(step: Step) -> bool:
    dag = step.spec.get("dagster") if isinstance(step.spec, dict) else None
    return isinstance(dag, dict) and str(dag.get("run", "")).lower() == "separate"


def plan_job(pb: Playbook, mode: str = "default", graph: StepGraph | None = None) -> JobPlan:
    if mode not in MODES:
        raise ValueError(f"unknown translation mode {mode!r}; use one of {', '.join(MODES)}")
    g = graph or analyze(pb)
    if mode == "per_step":
        separate = [s.name for s in pb.workflow]
    else:
        separate = [s.name for s in pb.workflow if runs_separately(s)]
    sep = set(separate)

    nodes: dict[str, Node] = {}
    node_of_step: dict[str, str] = {}
    if sep:  # the components of the job's own subgraph: a separate step breaks the cycles through it
        order = [s for s in g.order if s not in sep]
        sub = {s: [t for t in g.succ.get(s, []) if t not in sep] for s in order}
        comps = strongly_connected(order, sub)
    else:
        sub, comps = g.succ, g.sccs
    for comp in comps:
        cyclic = len(comp) > 1 or comp[0] in sub.get(comp[0], [])
        kind = "region" if cyclic else "step"
        node = Node(f"{kind}:{comp[0]}", kind, tuple(comp))
        nodes[node.key] = node
        for s in comp:
            node_of_step[s] = node.key
    # condensed edges among main-job nodes
    for a, targets in g.succ.items():
        na = node_of_step.get(a)
        if na is None:
            continue
        for b in targets:
            nb = node_of_step.get(b)
            if nb is None or nb == na:
                continue
            if nb not in nodes[na].succ:
                nodes[na].succ.append(nb)
                nodes[nb].pred.append(na)
    order = _topological(nodes)
    nodes = {k: nodes[k] for k in order}
    for key in reversed(order):
        n = nodes[key]
        reach = set(n.steps)
        for s in n.succ:
            reach |= nodes[s].reach
        n.reach = frozenset(reach)
    roots = [k for k, n in nodes.items() if not n.pred]
    entry_node = node_of_step.get(g.entry)
    if entry_node is not None and entry_node not in roots:
        roots.insert(0, entry_node)
    return JobPlan(pb, g, mode, nodes, roots, separate, node_of_step)


def _topological(nodes: dict[str, Node]) -> list[str]:
    """Kahn's algorithm, ties broken by declaration order (stable names and layout)."""
    indeg = {k: len(n.pred) for k, n in nodes.items()}
    ready = [k for k in nodes if indeg[k] == 0]
    out: list[str] = []
    while ready:
        k = ready.pop(0)
        out.append(k)
        for s in nodes[k].succ:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    if len(out) != len(nodes):  # cannot happen for a condensation; guard against a bad graph
        raise ValueError("step graph condensation is not acyclic")
    return out
