"""Syntax tree -> workflow graph: task invocations, subflows and label stitching.

Nodes are numbered in source order (the seed's mermaid numbering): the start
of the workflow is 0, every invocation, resource and literal takes the next
number when it is met, a subflow takes one number for its start (the fork)
before its contents and one for its end (the join) after them, and the end
of the workflow takes the last number.

Labels are junctions, local to the (sub)flow that uses them. A label's
*producers* are the tasks whose output it names (``A :x``, or ``A → :x`` at
the end of a statement); its *consumers* are the tasks whose input it names
(``:x A``, or ``:x → A`` at the start of a statement). Every producer is
connected to every consumer. A statement that does not start with a label
(or with a resource) starts at the (sub)flow's start; one that does not end
with a label (or a resource) ends at its end.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from noetl_dagster.dsl.flow.ast import (
    Block,
    Declaration,
    FlowDocument,
    Label,
    Pos,
    Resource,
    ResourceLiteral,
    Statement,
    Step,
    TaskList,
    TaskRef,
)
from noetl_dagster.dsl.flow.errors import FlowCompileError, excerpt


class NodeKind(enum.StrEnum):
    START = "start"
    END = "end"
    TASK = "task"
    FORK = "fork"  # start of a subflow
    JOIN = "join"  # end of a subflow
    LOAD = "load"  # <uri> beginning a statement
    STORE = "store"  # <uri> ending a statement
    LITERAL = "literal"  # <- yaml -> / <{ json }> / <[ json ]>


@dataclass
class Node:
    index: int
    kind: NodeKind
    pos: Pos | None = None
    name: str = ""  # task name (after alias resolution), or the resource URI
    params: Any = None  # merged parameters (declaration defaults + invocation), or the literal value
    has_params: bool = False
    star: bool = False  # `*`: invoked once per item of its input
    merge: bool = False  # `>`: its inputs are merged into one object
    guard: str | None = None  # JSONPath on its input
    guard_pos: Pos | None = None
    doc: str | None = None
    invoked_as: str | None = None  # the name written in the flow when it is an alias
    join: int | None = None  # FORK: index of its JOIN
    fork: int | None = None  # JOIN: index of its FORK
    subflow: str | None = None  # FORK/JOIN: the declared subflow's name, if any


@dataclass
class FlowGraph:
    nodes: list[Node]
    edges: set[tuple[int, int]]
    name: str | None = None
    doc: str | None = None
    params: Any = None  # @flow parameters
    params_pos: Pos | None = None
    declarations: dict[str, Declaration] = field(default_factory=dict)

    @property
    def start(self) -> Node:
        return self.nodes[0]

    @property
    def end(self) -> Node:
        return self.nodes[-1]

    def _adjacency(self) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        key = len(self.edges)
        cached = getattr(self, "_adj", None)
        if cached is None or cached[0] != key:
            succ: dict[int, list[int]] = {}
            pred: dict[int, list[int]] = {}
            for a, b in sorted(self.edges):
                succ.setdefault(a, []).append(b)
                pred.setdefault(b, []).append(a)
            for v in pred.values():
                v.sort()
            cached = (key, succ, pred)
            self._adj = cached
        return cached[1], cached[2]

    def successors(self, index: int) -> list[int]:
        return list(self._adjacency()[0].get(index, ()))

    def predecessors(self, index: int) -> list[int]:
        return list(self._adjacency()[1].get(index, ()))

    def sorted_edges(self) -> list[tuple[int, int]]:
        return sorted(self.edges)


@dataclass
class _LabelUse:
    producers: list[int] = field(default_factory=list)
    consumers: list[int] = field(default_factory=list)
    out_label: Pos | None = None  # `A :x` (at most one per label)
    in_label: Pos | None = None  # `:x A` (at most one per label)
    as_source: Pos | None = None  # first `:x → ...`
    as_destination: Pos | None = None  # first `... → :x`
    merge: bool = False  # `... → > :x`


class _Scope:
    """One (sub)flow: its start and end nodes and its labels."""

    def __init__(self, start: Node, end: Node | None):
        self.start = start
        self.end = end
        self.labels: dict[str, _LabelUse] = {}
        self.end_merge = False  # `... → > :end`

    def label(self, name: str) -> _LabelUse:
        return self.labels.setdefault(name, _LabelUse())


class _GraphBuilder:
    def __init__(self, doc: FlowDocument):
        self.doc = doc
        self.nodes: list[Node] = []
        self.edges: set[tuple[int, int]] = set()
        self.decls: dict[str, Declaration] = {}
        self.flow_decl: Declaration | None = None
        self._star_depth = 0
        self._expanding: list[str] = []  # declared subflows being expanded (recursion check)

    # -- helpers -------------------------------------------------------------------------------
    def error(self, message: str, pos: Pos | None, rule: str) -> FlowCompileError:
        line, col = (pos.line, pos.column) if pos else (None, None)
        return FlowCompileError(message, line, col, file=self.doc.file, rule=rule,
                                excerpt=excerpt(self.doc.text, line, col))  # fmt: skip

    def new(self, kind: NodeKind, pos: Pos | None = None, **kw: Any) -> Node:
        node = Node(len(self.nodes), kind, pos, **kw)
        self.nodes.append(node)
        return node

    def edge(self, a: Node | int, b: Node | int) -> None:
        self.edges.add((a if isinstance(a, int) else a.index, b if isinstance(b, int) else b.index))

    # -- declarations --------------------------------------------------------------------------
    def collect_declarations(self) -> None:
        for d in self.doc.declarations:
            if d.kind == "flow":
                if self.flow_decl is not None:
                    raise self.error(
                        f"a flow has one @flow declaration (the first is at {self.flow_decl.pos})",
                        d.pos,
                        "duplicate-flow",
                    )
                self.flow_decl = d
                continue
            if d.name in self.decls:
                raise self.error(
                    f"task {d.name!r} is declared twice (first at {self.decls[d.name].pos})",
                    d.pos,
                    "duplicate-task",
                )
            if d.block is not None and d.params is not None:
                raise self.error(
                    f"@task {d.name} is a subflow; parameters on a subflow declaration have no effect",
                    d.params.pos,
                    "subflow-params",
                )
            self.decls[d.name] = d

    def _merge_params(self, base: Any, over: Any, pos: Pos | None, name: str) -> Any:
        if base is None:
            return over
        if over is None:
            return base
        if isinstance(base, dict) and isinstance(over, dict):
            return _deep_merge(base, over)
        if type(base) is not type(over):
            raise self.error(
                f"parameters of {name!r} are {_kind(over)} but its declaration's defaults are {_kind(base)}",
                pos,
                "params-type",
            )
        return over  # lists and scalars: the invocation's value replaces the default

    def resolve_task(self, ref: TaskRef) -> tuple[str, Any, bool, str | None, Declaration | None]:
        """Follow aliases: (task name, merged params, has params, doc, subflow declaration)."""
        name = ref.name
        params = ref.params.value if ref.params else None
        has = ref.params is not None
        doc = None
        seen: list[str] = []
        while name in self.decls:
            d = self.decls[name]
            if name in seen:
                raise self.error(f"alias cycle: {' = '.join([*seen, name])}", d.pos, "alias-cycle")
            seen.append(name)
            if d.params is not None:
                params = self._merge_params(
                    d.params.value, params, ref.params.pos if ref.params else d.pos, name
                )
                has = True
            doc = doc or d.doc
            if d.block is not None:
                if has:  # from the invocation or from an alias's declaration
                    raise self.error(
                        f"{name!r} is a subflow (declared at {d.pos}); it takes no parameters",
                        ref.params.pos if ref.params else ref.pos,
                        "subflow-params",
                    )
                return name, None, False, doc, d
            if d.alias is None:
                break
            name = d.alias.name
        return name, params, has, doc, None

    # -- flows ---------------------------------------------------------------------------------
    def build(self) -> FlowGraph:
        self.collect_declarations()
        start = self.new(NodeKind.START)
        scope = _Scope(start, None)
        self.statements(self.doc.statements, scope)
        end = self.new(NodeKind.END)
        scope.end = end
        self.finish(scope)
        if len(self.nodes) == 2:
            raise self.error("the flow has no flow statements", Pos(1, 1), "empty-flow")
        fd = self.flow_decl
        return FlowGraph(
            nodes=self.nodes,
            edges=self.edges,
            name=fd.name if fd else None,
            doc=fd.doc if fd else None,
            params=fd.params.value if fd and fd.params else None,
            params_pos=fd.params.pos if fd and fd.params else None,
            declarations=self.decls,
        )

    def statements(self, statements: list[Statement], scope: _Scope) -> None:
        # the scope's end node does not exist yet (it is numbered after the contents):
        # edges to it are recorded against a placeholder and fixed in finish()
        for st in statements:
            self.statement(st, scope)

    _END = -1  # placeholder for "the end of the current scope"

    def statement(self, st: Statement, scope: _Scope) -> None:
        current: list[int] | None
        source_label: Label | None = None
        src = st.source
        if isinstance(src, Label):
            if src.name == "end":
                raise self.error(":end can only end a flow statement", src.pos, "reserved-label")
            if src.name == "start":
                current = [scope.start.index]
            else:
                source_label = src
                use = scope.label(src.name)
                use.as_source = use.as_source or src.pos
                current = None
        elif isinstance(src, Resource):
            node = self.new(NodeKind.LOAD, src.pos, name=src.uri, params=src.params.value if src.params else None,
                            has_params=src.params is not None)  # fmt: skip
            self.edge(scope.start, node)
            current = [node.index]
        elif isinstance(src, ResourceLiteral):
            node = self.new(NodeKind.LITERAL, src.pos, params=src.literal.value, has_params=True)
            self.edge(scope.start, node)
            current = [node.index]
        else:
            current = [scope.start.index]

        for step in st.steps:
            entry, exit_ = self.step(step, scope)
            if step.in_label is not None:
                lab = step.in_label
                self._check_reserved(lab, "input")
                use = scope.label(lab.name)
                if use.in_label is not None:
                    raise self.error(
                        f"duplicate input label {lab.name!r} (first used at {use.in_label})",
                        lab.pos,
                        "duplicate-input-label",
                    )
                use.in_label = lab.pos
                use.consumers.append(entry)
            if current is None:
                assert source_label is not None
                scope.label(source_label.name).consumers.append(entry)
            else:
                for c in current:
                    self.edge(c, entry)
            current = [exit_]
            if step.out_label is not None:
                lab = step.out_label
                self._check_reserved(lab, "output")
                use = scope.label(lab.name)
                if use.out_label is not None:
                    raise self.error(
                        f"duplicate output label {lab.name!r} (first used at {use.out_label}); "
                        "end the first statement with ';' if the label should start a new one",
                        lab.pos,
                        "duplicate-output-label",
                    )
                use.out_label = lab.pos
                use.producers.append(exit_)

        assert current is not None
        dst = st.destination
        if dst is None or (isinstance(dst, Label) and dst.name == "end"):
            for c in current:
                self.edge(c, self._END)
            scope.end_merge = scope.end_merge or st.destination_merge
        elif isinstance(dst, Label):
            if dst.name == "start":
                raise self.error(":start can only begin a flow statement", dst.pos, "reserved-label")
            use = scope.label(dst.name)
            use.as_destination = use.as_destination or dst.pos
            use.producers.extend(current)
            use.merge = use.merge or st.destination_merge
        else:
            node = self.new(NodeKind.STORE, dst.pos, name=dst.uri, params=dst.params.value if dst.params else None,
                            has_params=dst.params is not None, merge=st.destination_merge)  # fmt: skip
            for c in current:
                self.edge(c, node)
            self.edge(node, self._END)

    def _check_reserved(self, lab: Label, role: str) -> None:
        if lab.name == "start":
            raise self.error(
                f":start is reserved and can only begin a flow statement (not be an {role} label)",
                lab.pos,
                "reserved-label",
            )
        if lab.name == "end":
            raise self.error(
                f":end is reserved and can only end a flow statement (not be an {role} label)",
                lab.pos,
                "reserved-label",
            )

    def step(self, step: Step, scope: _Scope) -> tuple[int, int]:
        """Realize one step; return (entry node, exit node)."""
        target = step.target
        star = step.star or self._star_depth > 0
        if isinstance(target, TaskRef):
            name, params, has, doc, sub = self.resolve_task(target)
            if sub is not None:
                return self.subflow(sub.block.statements, step, target.pos, subflow=sub.name, doc=doc)  # type: ignore[union-attr]
            node = self.new(
                NodeKind.TASK,
                target.pos,
                name=name,
                params=params,
                has_params=has,
                star=star,
                merge=step.merge,
                guard=step.guard.expr if step.guard else None,
                guard_pos=step.guard.pos if step.guard else None,
                doc=doc,
                invoked_as=target.name if name != target.name else None,
            )
            return node.index, node.index
        if isinstance(target, TaskList):
            statements = [Statement(steps=[Step(target=t, pos=t.pos)], pos=t.pos) for t in target.tasks]
            return self.subflow(statements, step, target.pos)
        assert isinstance(target, Block)
        return self.subflow(target.statements, step, target.pos)

    def subflow(
        self,
        statements: list[Statement],
        step: Step,
        pos: Pos,
        subflow: str | None = None,
        doc: str | None = None,
    ) -> tuple[int, int]:
        if subflow is not None:
            if subflow in self._expanding:
                raise self.error(
                    f"subflow {subflow!r} invokes itself ({' → '.join([*self._expanding, subflow])})",
                    pos,
                    "recursive-subflow",
                )
            self._expanding.append(subflow)
        fork = self.new(
            NodeKind.FORK,
            pos,
            merge=step.merge,
            guard=step.guard.expr if step.guard else None,
            guard_pos=step.guard.pos if step.guard else None,
            subflow=subflow,
            doc=doc,
        )
        inner = _Scope(fork, None)
        saved_edges = self.edges
        self.edges = set()
        if step.star:
            self._star_depth += 1
        try:
            self.statements(statements, inner)
        finally:
            if step.star:
                self._star_depth -= 1
        join = self.new(NodeKind.JOIN, pos, subflow=subflow, fork=fork.index)
        fork.join = join.index
        inner.end = join
        self.finish(inner)
        saved_edges |= self.edges
        self.edges = saved_edges
        if subflow is not None:
            self._expanding.pop()
        return fork.index, join.index

    def finish(self, scope: _Scope) -> None:
        """Resolve the end placeholder and the labels of one (sub)flow."""
        assert scope.end is not None
        end = scope.end.index
        self.edges = {(a, end if b == self._END else b) for a, b in self.edges}
        scope.end.merge = scope.end.merge or scope.end_merge
        for name, use in scope.labels.items():
            if use.as_source is not None and not use.producers:
                raise self.error(
                    f"label {name!r} starts a statement but no task's output is labeled {name!r} "
                    f"(write `A :{name}` or `A → :{name}`)",
                    use.as_source,
                    "unknown-label",
                )
            if use.as_destination is not None and not use.consumers:
                raise self.error(
                    f"label {name!r} ends a statement but no task's input is labeled {name!r} "
                    f"(write `:{name} B` or `:{name} → B`)",
                    use.as_destination,
                    "unknown-label",
                )
            for p in use.producers:
                for c in use.consumers:
                    self.edge(p, c)
            if use.merge:
                for c in use.consumers:
                    self.nodes[c].merge = True


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(out.get(k), dict) and isinstance(v, dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


def build_graph(doc: FlowDocument) -> FlowGraph:
    """Build the workflow graph of a parsed flow; raise :class:`FlowCompileError` on label or declaration errors."""
    return _GraphBuilder(doc).build()
