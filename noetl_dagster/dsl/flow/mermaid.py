"""Workflow graph -> mermaid ``stateDiagram-v2`` in the seed's own style.

Task invocations are ``state "A" as A.1`` (name, then the invocation's number),
the workflow's start and end are ``[*]``, a subflow is a ``<<fork>>`` state
``_start_N_`` and a ``<<join>>`` state ``_end_N_``. Resources are states too
(``_load_N_``, ``_store_N_``, ``_literal_N_``); guards, ``*`` and ``>`` are
shown as notes. Transitions are listed by source then target number, as the
seed lists them.

:func:`check_state_diagram` is a grammar check of the subset written here, for
tests and for machines without a mermaid renderer.
"""

from __future__ import annotations

import re

from noetl_dagster.dsl.flow.graph import FlowGraph, Node, NodeKind


def _mangle(name: str) -> str:
    return name.replace(":", "_COLON_").replace("-", "_HYPHEN_")


def state_id(graph: FlowGraph, node: Node) -> str:
    k = node.kind
    if k in (NodeKind.START, NodeKind.END) and node.index in (0, len(graph.nodes) - 1):
        return "[*]"
    if k == NodeKind.TASK:
        return f"{_mangle(node.name)}.{node.index}"
    if k == NodeKind.FORK:
        return f"_start_{node.index}_"
    if k == NodeKind.JOIN:
        return f"_end_{node.index}_"
    return f"_{k.value}_{node.index}_"


def _text(s: str) -> str:
    """Mermaid label text: quotes and angle brackets as mermaid entity codes."""
    return s.replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")


def _notes(node: Node) -> list[str]:
    out = []
    if node.star:
        out.append("* for each item")
    if node.merge:
        out.append("> merged input")
    if node.guard:
        out.append(f"? {node.guard}")
    return out


def to_mermaid(graph: FlowGraph, *, direction: str = "LR", notes: bool = True) -> str:
    lines = ["stateDiagram-v2"]
    if direction:
        lines.append(f"direction {direction}")
    note_lines: list[str] = []
    for node in graph.nodes:
        sid = state_id(graph, node)
        if sid == "[*]":
            continue
        if node.kind == NodeKind.TASK:
            lines.append(f'state "{_text(node.name)}" as {sid}')
        elif node.kind == NodeKind.FORK:
            lines.append(f"state {sid} <<fork>>")
        elif node.kind == NodeKind.JOIN:
            lines.append(f"state {sid} <<join>>")
        elif node.kind == NodeKind.LITERAL:
            lines.append(f'state "literal" as {sid}')
        else:  # LOAD / STORE
            lines.append(f'state "{node.kind.value} {_text("<" + node.name + ">")}" as {sid}')
        if notes:
            for text in _notes(node):
                note_lines.append(f"note right of {sid} : {_text(text)}")
    for a, b in graph.sorted_edges():
        lines.append(f"{state_id(graph, graph.nodes[a])}-->{state_id(graph, graph.nodes[b])}")
    lines.extend(note_lines)
    return "\n".join(lines) + "\n"


# -- a grammar check for the subset above -------------------------------------------------------

_ID = r"(?:\[\*\]|[A-Za-z_][A-Za-z0-9_]*(?:\.[0-9]+)?)"
_LINE_RULES = [
    ("direction", re.compile(r"^direction (?:LR|RL|TB|BT)$")),
    ("state", re.compile(r'^state "[^"<>\n]*" as [A-Za-z_][A-Za-z0-9_]*(?:\.[0-9]+)?$')),
    ("fork/join", re.compile(r"^state [A-Za-z_][A-Za-z0-9_]* <<(?:fork|join)>>$")),
    ("transition", re.compile(rf"^(?P<a>{_ID})-->(?P<b>{_ID})$")),
    ("note", re.compile(r"^note (?:left|right) of [A-Za-z_][A-Za-z0-9_]*(?:\.[0-9]+)? : [^\n]+$")),
]


def check_state_diagram(text: str) -> list[str]:
    """Problems with a ``stateDiagram-v2`` of the shape :func:`to_mermaid` writes (empty: valid).

    Checks the header, each line against the statement forms used, that every
    transition and note names a state declared before it (or ``[*]``), and
    that no state is declared twice.
    """
    problems: list[str] = []
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip() and not ln.strip().startswith("%%")]
    if not lines or lines[0] != "stateDiagram-v2":
        return ["the first line must be 'stateDiagram-v2'"]
    declared: set[str] = set()
    kinds: dict[str, str] = {}
    for n, line in enumerate(lines[1:], start=2):
        rule = next((name for name, rx in _LINE_RULES if rx.match(line)), None)
        if rule is None:
            problems.append(f"line {n}: not a statement of the diagram: {line!r}")
            continue
        if rule == "state":
            sid = line.rsplit(" as ", 1)[1]
            if sid in declared:
                problems.append(f"line {n}: state {sid} declared twice")
            declared.add(sid)
            kinds[sid] = "state"
        elif rule == "fork/join":
            sid = line.split()[1]
            if sid in declared:
                problems.append(f"line {n}: state {sid} declared twice")
            declared.add(sid)
            kinds[sid] = "fork" if "<<fork>>" in line else "join"
        elif rule == "transition":
            m = _LINE_RULES[3][1].match(line)
            assert m is not None
            for sid in (m["a"], m["b"]):
                if sid != "[*]" and sid not in declared:
                    problems.append(f"line {n}: transition uses undeclared state {sid}")
        elif rule == "note":
            sid = line.split(" of ", 1)[1].split(" : ", 1)[0]
            if sid not in declared:
                problems.append(f"line {n}: note on undeclared state {sid}")
    return problems
