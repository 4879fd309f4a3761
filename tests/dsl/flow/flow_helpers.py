"""Reading mermaid state diagrams back into edges, and running flows, for the flow tests."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

_STATE = re.compile(r'^state "(?P<label>[^"]*)" as (?P<id>\S+)$')
_PSEUDO = re.compile(r"^state (?P<id>\S+) <<(?P<kind>fork|join)>>$")


def diagram(text: str) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(state id -> label, transitions as (id, id)) of a stateDiagram-v2."""
    labels: dict[str, str] = {"[*]": "[*]"}
    edges: list[tuple[str, str]] = []
    for raw in text.strip().splitlines()[1:]:
        line = raw.strip()
        if m := _STATE.match(line):
            labels[m["id"]] = m["label"]
        elif m := _PSEUDO.match(line):
            labels[m["id"]] = f"<<{m['kind']}>>"
        elif "-->" in line:
            a, b = (s.strip() for s in line.split(":", 1)[0].split("-->"))
            edges.append((a, b))
    for a, b in edges:
        labels.setdefault(a, a)
        labels.setdefault(b, b)
    return labels, edges


def label_edges(text: str) -> Counter:
    """The edge multiset over task labels, start and end ([*]), fork and join."""
    labels, edges = diagram(text)
    return Counter((labels[a], labels[b]) for a, b in edges)


def id_edges(text: str) -> Counter:
    return Counter(diagram(text)[1])


def contracted_label_edges(text: str) -> Counter:
    """Label edges with subflow forks and joins contracted away (each in-edge joined to each out-edge)."""
    labels, edges = diagram(text)
    es = set(edges)
    for sid, lab in labels.items():
        if lab not in ("<<fork>>", "<<join>>"):
            continue
        ins = [a for a, b in es if b == sid]
        outs = [b for a, b in es if a == sid]
        es = {(a, b) for a, b in es if sid not in (a, b)}
        es |= {(a, b) for a in ins for b in outs}
    return Counter((labels[a], labels[b]) for a, b in es)


def python_tasks(names: list[str], code: str = "result = {'{name}': input}") -> str:
    """@task declarations making each name a python task (``{name}`` in code is replaced)."""
    out = []
    for n in names:
        body = code.replace("{name}", n)
        out.append(f"@task {n} (- {{kind: python, code: {body!r}}} -);")
    return "\n".join(out) + "\n"


def run_flow(text: str, data_dir: Path, *, workload: dict[str, Any] | None = None, name: str = "t",
             folder: Path | None = None) -> Any:  # fmt: skip
    """Write the flow to a file (resources resolve next to it), compile it and run it with the local runner."""
    from noetl_dagster.dsl.flow import load_flow_playbook
    from noetl_dagster.runners.local import run_playbook

    folder = folder or data_dir.parent
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.flow"
    path.write_text(text, encoding="utf-8")
    return run_playbook(load_flow_playbook(path), workload, data_dir=data_dir)
