"""Workflow graph -> a playbook in the standard form (a plain dict, YAML-ready).

Each node of the flow becomes one step, named after the node (``A_1`` for
the invocation ``A.1`` of the mermaid diagram; ``start``, ``end``,
``fork_N`` / ``join_N`` for subflows, ``load_N`` / ``store_N`` /
``literal_N`` for resources). Every edge becomes an arc whose token carries
the producer's output: ``args: {input: <output>, from: <producer step>}``.

The runtime does the rest of the seed's semantics:

- a step with two or more predecessor steps is a join: it runs once, when all
  predecessors are done or unreachable, with the list of arriving tokens;
  a ``flow_input`` task turns that list into the input by the aggregation rules
  (start, end, fork and join steps are such tasks; a task node that needs it
  gets a ``<step>_in`` step before it);
- ``>`` is ``merge: true`` on that ``flow_input`` task;
- a guard is a ``<step>_guard`` step (``flow_guard`` task) before the node: when
  the guard holds, its arc goes to the node; when not, its arcs go straight to
  the node's successors with an empty input, as if the node produced nothing
  (a guarded subflow's fork step is the guard step and skips to its join);
- ``*`` is a ``loop`` over the input (``iterator: input``); the node's output is
  the list of the iterations' results.

Task names resolve, in order, to: a ``@task`` subflow or alias (done when the
graph is built), a tool ``kind`` given in the (merged) parameters, an entry of
the ``@flow``'s ``workbook``, or a tool kind of that name (``python``,
``http``, ``noop``...). In task parameters ``{{ input }}`` is the task's input
(the current item under ``*``); a python task also gets it as the global
``input``; a workbook entry gets it as ``args.input``.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any

from noetl_dagster.dsl.flow.errors import FlowCompileError, excerpt
from noetl_dagster.dsl.flow.graph import FlowGraph, Node, NodeKind

API_VERSION = "noetl.io/v2"
FLOW_PARAM_KEYS = ("workload", "workbook", "keychain", "executor", "path", "version", "description")
RESOURCE_RESERVED = ("uri", "op", "value")

# outputs as arcs render them (arcs see the finished step's outcome)
_OUT_RESULT = "{{ outcome.result if outcome.result is not none else {} }}"
_OUT_PLAIN = "{{ outcome.result }}"
_OUT_LOOP = "{{ outcome.result.results }}"
_OUT_GUARDED_FORK = "{{ outcome.result.input }}"
# a flow stops where a task fails: every arc routes only an ok outcome (an arc with no `when`
# would also route a failure, SEMANTICS §5)
_OK = "{{ outcome.status == 'ok' }}"
_PASS = "{{ outcome.status == 'ok' and outcome.result.pass }}"
_FAIL = "{{ outcome.status == 'ok' and not outcome.result.pass }}"
_IN_ARGS = "{{ args.input }}"
_IN_ITER = "{{ iter.input }}"


def step_name(node: Node) -> str:
    k = node.kind
    if k == NodeKind.START:
        return "start"
    if k == NodeKind.END:
        return "end"
    if k == NodeKind.TASK:
        ident = re.sub(r"[^A-Za-z0-9_]", "_", node.name)
        if ident[:1].isdigit():
            ident = "t_" + ident
        return f"{ident}_{node.index}"
    return f"{k.value}_{node.index}"


@dataclass
class _Plan:
    node: Node
    step: str
    loop: bool = False
    guard_step: str | None = None
    in_step: str | None = None

    @property
    def entry(self) -> str:
        return self.guard_step or self.in_step or self.step

    @property
    def out(self) -> str:
        k = self.node.kind
        if k == NodeKind.TASK:
            return _OUT_LOOP if self.loop else _OUT_RESULT
        if k in (NodeKind.LOAD, NodeKind.STORE):
            return _OUT_RESULT
        if k == NodeKind.FORK and self.node.guard:
            return _OUT_GUARDED_FORK
        return _OUT_PLAIN

    def key_for_arrival(self) -> str:
        """The args key a token into this node's entry step carries its value under."""
        return "sequence" if self.loop and self.entry == self.step else "input"


class _Compiler:
    def __init__(self, graph: FlowGraph, *, name: str | None, file: str | None, text: str):
        self.g = graph
        self.file = file
        self.text = text
        self.name = graph.name or name or "flow"
        self.plans: dict[int, _Plan] = {}
        self.flow_params: dict[str, Any] = {}
        self.workbook_names: set[str] = set()
        self._kinds: set[str] | None = None

    def error(self, message: str, node_or_pos: Any, rule: str) -> FlowCompileError:
        pos = getattr(node_or_pos, "pos", node_or_pos)
        line, col = (pos.line, pos.column) if pos is not None else (None, None)
        return FlowCompileError(
            message, line, col, file=self.file, rule=rule, excerpt=excerpt(self.text, line, col)
        )

    def kinds(self) -> set[str]:
        if self._kinds is None:
            from noetl_dagster.dsl.kinds import known_kinds

            self._kinds = known_kinds()
        return self._kinds

    # -- the @flow declaration ----------------------------------------------------------------
    def read_flow_params(self) -> None:
        params = self.g.params
        if params is None:
            return
        if not isinstance(params, dict):
            raise self.error("@flow parameters must be an object with " + ", ".join(FLOW_PARAM_KEYS),
                             self.g.params_pos, "flow-params")  # fmt: skip
        unknown = sorted(set(params) - set(FLOW_PARAM_KEYS))
        if unknown:
            raise self.error(
                f"unknown @flow parameter(s) {', '.join(unknown)}; @flow takes {', '.join(FLOW_PARAM_KEYS)} "
                "(the flow's default input goes under `workload`)",
                self.g.params_pos,
                "flow-params",
            )
        if "workload" in params and not isinstance(params["workload"], dict):
            raise self.error("@flow `workload` must be an object", self.g.params_pos, "flow-params")
        wb = params.get("workbook")
        if wb is not None:
            if isinstance(wb, dict):
                wb = [{"name": k, **(v if isinstance(v, dict) else {})} for k, v in wb.items()]
            if not isinstance(wb, list) or not all(isinstance(w, dict) and w.get("name") for w in wb):
                raise self.error(
                    "@flow `workbook` must be a list of entries with `name`", self.g.params_pos, "flow-params"
                )
            self.workbook_names = {str(w["name"]) for w in wb}
            params = {**params, "workbook": wb}
        self.flow_params = params

    # -- planning -------------------------------------------------------------------------------
    def plan(self) -> None:
        for node in self.g.nodes:
            p = _Plan(node, step_name(node))
            if node.kind == NodeKind.TASK:
                p.loop = node.star
                if node.guard:
                    p.guard_step = f"{p.step}_guard"
            self.plans[node.index] = p
        # a task, load or store node needs an aggregating step before it when it merges or
        # when two or more steps send it tokens (a guarded predecessor sends from two)
        for node in self.g.nodes:
            p = self.plans[node.index]
            if node.kind not in (NodeKind.TASK, NodeKind.LOAD, NodeKind.STORE) or p.guard_step:
                continue
            if node.merge or len(self.sources(node)) >= 2:
                p.in_step = f"{p.step}_in"

    def sources(self, node: Node) -> list[str]:
        """Steps whose arcs reach this node's entry, in flow order."""
        out: list[str] = []
        for pi in self.g.predecessors(node.index):
            pp = self.plans[pi]
            out.append(pp.step)
            if pp.guard_step and pp.node.kind == NodeKind.TASK:
                out.append(pp.guard_step)
        if node.kind == NodeKind.JOIN and node.fork is not None and self.g.nodes[node.fork].guard:
            out.append(self.plans[node.fork].step)
        return list(dict.fromkeys(out))

    def order(self, node: Node) -> list[str]:
        """Token order for a collection: the flow predecessors by number."""
        out = [self.plans[pi].step for pi in self.g.predecessors(node.index)]
        if node.kind == NodeKind.JOIN and node.fork is not None and self.g.nodes[node.fork].guard:
            out.append(self.plans[node.fork].step)
        return out

    # -- arcs -----------------------------------------------------------------------------------
    def arc(self, target: int, value: Any, source_step: str, when: str | None = None) -> dict[str, Any]:
        tp = self.plans[target]
        arc: dict[str, Any] = {"step": tp.entry, "when": when or _OK}
        arc["args"] = {tp.key_for_arrival(): value, "from": source_step}
        return arc

    def node_arcs(self, node: Node) -> list[dict[str, Any]]:
        p = self.plans[node.index]
        succ = self.g.successors(node.index)
        if node.kind == NodeKind.FORK and node.guard:
            arcs = [self.arc(s, p.out, p.step, _PASS) for s in succ]
            assert node.join is not None
            arcs.append(self.arc(node.join, {}, p.step, _FAIL))
            return arcs
        return [self.arc(s, p.out, p.step) for s in succ]

    @staticmethod
    def router(arcs: list[dict[str, Any]]) -> dict[str, Any]:
        return {"spec": {"mode": "inclusive"}, "arcs": arcs}

    # -- steps ----------------------------------------------------------------------------------
    def aggregate_task(self, label: str, node: Node, kind: str = "flow_input") -> dict[str, Any]:
        task: dict[str, Any] = {"name": label, "kind": kind}
        if kind == "flow_guard":
            task["path"] = node.guard
        task["tokens"] = "{{ args }}"
        order = self.order(node)
        if len(order) > 1:
            task["order"] = order
        if node.merge:
            task["merge"] = True
        return task

    def steps_for(self, node: Node) -> list[dict[str, Any]]:
        p = self.plans[node.index]
        k = node.kind
        out: list[dict[str, Any]] = []
        if k == NodeKind.START:
            out.append({"step": p.step, "desc": "flow input: the workload",
                        "tool": [{"name": "input", "kind": "flow_input", "value": "{{ workload }}"}]})  # fmt: skip
        elif k == NodeKind.END:
            out.append({"step": p.step, "desc": "flow output", "tool": [self.aggregate_task("output", node)]})
        elif k == NodeKind.FORK:
            desc = f"subflow {node.subflow} start" if node.subflow else "subflow start"
            if node.guard:
                desc += f" (guard {node.guard})"
            kind = "flow_guard" if node.guard else "flow_input"
            out.append({"step": p.step, "desc": desc, "tool": [self.aggregate_task("input", node, kind)]})
        elif k == NodeKind.JOIN:
            desc = f"subflow {node.subflow} end" if node.subflow else "subflow end"
            out.append({"step": p.step, "desc": desc, "tool": [self.aggregate_task("output", node)]})
        elif k == NodeKind.LITERAL:
            out.append({"step": p.step, "desc": "resource literal", "tool": [self.literal_task(node.params)]})
        else:
            if p.guard_step:
                out.append({"step": p.guard_step, "desc": f"guard of {p.step}: {node.guard}",
                            "tool": [self.aggregate_task("guard", node, "flow_guard")]})  # fmt: skip
            elif p.in_step:
                out.append(
                    {
                        "step": p.in_step,
                        "desc": f"input of {p.step}",
                        "tool": [self.aggregate_task("input", node)],
                    }
                )
            out.append(self.node_step(node))
        # arcs: a helper step routes to the node; the node routes to its successors
        for s in out:
            if s["step"] == p.guard_step:
                succ = self.g.successors(node.index)
                arcs = [{"step": p.step, "when": _PASS,
                         "args": {"sequence" if p.loop else "input": "{{ outcome.result.input }}", "from": p.step}}]  # fmt: skip
                arcs += [self.arc(t, {}, p.step, _FAIL) for t in succ]
                s["next"] = self.router(arcs)
            elif s["step"] == p.in_step:
                key = "sequence" if p.loop else "input"
                s["next"] = self.router(
                    [{"step": p.step, "when": _OK, "args": {key: _OUT_PLAIN, "from": p.step}}]
                )
            elif s["step"] == p.step:
                arcs = self.node_arcs(node)
                if arcs:
                    s["next"] = self.router(arcs)
        return out

    @staticmethod
    def literal_task(value: Any) -> dict[str, Any]:
        task: dict[str, Any] = {"name": "literal", "kind": "flow_input"}
        if _has_template_markers(value):
            # literals are not templates; the playbook validator checks every string that looks like one
            task["literal_b64"] = base64.b64encode(json.dumps(value).encode()).decode()
        else:
            task["literal"] = value
        return task

    def node_step(self, node: Node) -> dict[str, Any]:
        p = self.plans[node.index]
        step: dict[str, Any] = {"step": p.step}
        if node.kind == NodeKind.TASK:
            if node.doc:
                step["desc"] = node.doc
            elif node.invoked_as:
                step["desc"] = f"{node.invoked_as} (alias of {node.name})"
            if p.loop:
                step["loop"] = {
                    "in": "{{ args.sequence }}",
                    "iterator": "input",
                    "spec": {"mode": "sequential"},
                }
            step["tool"] = [self.task(node, p)]
            return step
        params = node.params if node.has_params else {}
        if not isinstance(params, dict):
            raise self.error(
                f"resource parameters must be an object, not {type(params).__name__}", node, "resource-params"
            )
        bad = [k for k in RESOURCE_RESERVED if k in params]
        if bad:
            raise self.error(f"resource parameters cannot set {', '.join(bad)}", node, "resource-params")
        op = "load" if node.kind == NodeKind.LOAD else "store"
        task: dict[str, Any] = {"name": op, "kind": "resource", "op": op, "uri": node.name, **params}
        if op == "store":
            task["value"] = _IN_ARGS
        step["desc"] = f"{op} <{node.name}>"
        step["tool"] = [task]
        return step

    def task(self, node: Node, p: _Plan) -> dict[str, Any]:
        params = node.params if node.has_params else None
        value_expr = _IN_ITER if p.loop else _IN_ARGS
        if params is not None and not isinstance(params, dict):
            raise self.error(
                f"parameters of task {node.name!r} must be an object to configure a tool, not {type(params).__name__}",
                node,
                "task-params",
            )
        params = dict(params or {})
        kind = params.pop("kind", None)
        if kind is not None:
            if not isinstance(kind, str) or kind not in self.kinds():
                raise self.error(
                    f"task {node.name!r}: tool kind {kind!r} is not recognized", node, "unknown-tool-kind"
                )
        elif node.name in self.workbook_names:
            user_input = params.pop("input", None)
            call_input = {
                **params,
                **(user_input if isinstance(user_input, dict) else {}),
                "input": value_expr,
            }
            return {"name": node.name, "kind": "workbook", "input": call_input}
        elif node.name in self.kinds():
            kind = node.name
        else:
            raise self.error(
                f"task {node.name!r} does not resolve to a tool: declare it (`@task {node.name} (- kind: python, ... -)`), "
                "add a workbook entry of that name to @flow, or use a tool kind name",
                node,
                "unknown-task",
            )
        if kind in ("flow_input", "flow_guard"):
            raise self.error(f"{kind} is internal to compiled flows", node, "unknown-tool-kind")
        task: dict[str, Any] = {"name": node.name, "kind": kind}
        if kind == "python":
            user_input = params.pop("input", None)
            if user_input is not None and not isinstance(user_input, dict):
                raise self.error("python `input` must be an object", node, "task-params")
            task.update(params)
            task["input"] = {"input": value_expr, **(user_input or {})}
        elif kind == "resource":
            task.update(params)
            task.setdefault("value", value_expr)
        else:
            task.update(params)
        return task

    # -- the playbook ----------------------------------------------------------------------------
    def compile(self) -> dict[str, Any]:
        self.read_flow_params()
        self.plan()
        fp = self.flow_params
        meta: dict[str, Any] = {"name": self.name, "path": str(fp.get("path") or f"flows/{self.name}")}
        if fp.get("version") is not None:
            meta["version"] = fp["version"]
        description = fp.get("description") or self.g.doc
        if description:
            meta["description"] = description
        pb: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "Playbook", "metadata": meta}
        if fp.get("keychain"):
            pb["keychain"] = fp["keychain"]
        if fp.get("executor"):
            ex = fp["executor"]
            if isinstance(ex, dict) and isinstance(ex.get("spec"), dict) and "entry_step" in ex["spec"]:
                raise self.error("a flow always enters at its start; remove executor.spec.entry_step",
                                 self.g.params_pos, "flow-params")  # fmt: skip
            pb["executor"] = ex
        pb["workload"] = dict(fp.get("workload") or {})
        workflow: list[dict[str, Any]] = []
        for node in self.g.nodes:
            workflow.extend(self.steps_for(node))
        pb["workflow"] = workflow
        if fp.get("workbook"):
            pb["workbook"] = fp["workbook"]
        return pb


def _has_template_markers(value: Any) -> bool:
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, dict):
        return any(_has_template_markers(k) or _has_template_markers(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_template_markers(v) for v in value)
    return False


def compile_graph(
    graph: FlowGraph, *, name: str | None = None, file: str | None = None, text: str = ""
) -> dict[str, Any]:
    """The playbook (standard form, plain dict) of a flow graph; raise :class:`FlowCompileError`."""
    return _Compiler(graph, name=name, file=file, text=text).compile()
