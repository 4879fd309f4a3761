"""The playbook behind an execution, for ``explain`` and ``diff`` (issue 36): found from the
execution's request (its file, or the canonical YAML of a generated playbook), its step graph
(arcs, joins, back-edges, cycles) and each step's source line; and which steps changed between
two versions of a playbook, matched by step name."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from noetl_dagster.engine.events import Event
from noetl_dagster.engine.graph import analyze

if TYPE_CHECKING:
    from noetl_dagster.dsl.model import Playbook


def playbook_of(events: list[Event]) -> tuple[Playbook | None, str]:
    """(the playbook as it is now at the request's file, or as generated; why not, when None)."""
    from noetl_dagster.dsl import load_playbook  # noqa: PLC0415
    from noetl_dagster.dsl.loader import load_yaml_text  # noqa: PLC0415
    from noetl_dagster.dsl.parse import load_playbook_dict  # noqa: PLC0415

    req = next((e for e in events if e.name == "playbook.execution.requested"), None)
    data = req.data if req is not None and isinstance(req.data, dict) else {}
    try:
        if data.get("definition"):
            raw, sm = load_yaml_text(str(data["definition"]), f"<generated {data.get('playbook_id')}>")
            return load_playbook_dict(raw, source_map=sm), ""
        path = str(data.get("file") or "")
        if not path or not Path(path).is_file():
            return None, f"its playbook file {path!r} is not available"
        return load_playbook(path), ""
    except Exception as e:  # noqa: BLE001 - the file changed into something invalid: explain without it
        return None, f"its playbook no longer loads ({type(e).__name__}: {str(e)[:160]})"


def step_lines(pb: Playbook | None) -> dict[str, int]:
    return {s.name: s.line for s in pb.workflow if s.line} if pb is not None else {}


def playbook_graph(pb: Playbook | None, observed: list[dict[str, Any]]) -> dict[str, Any]:
    """Steps and arcs (every declared arc, and any the log shows that the file no longer has),
    with joins, back-edges and cyclic components; ``observed``: explain's ``arcs`` (tokens per arc)."""
    tokens = {(a["from"], a["to"]): 0 for a in observed}
    for a in observed:
        tokens[(a["from"], a["to"])] += a["tokens"]
    steps: list[str] = []
    edges: dict[tuple[str, str], dict[str, Any]] = {}
    joins: set[str] = set()
    back: set[tuple[str, str]] = set()
    cyclic: set[str] = set()
    entry = None
    if pb is not None:
        g = analyze(pb)
        entry, steps, joins, back = g.entry, list(g.order), set(g.joins), set(g.back_edges)
        for comp in g.sccs:
            if g.is_cyclic(comp):
                cyclic.update(comp)
        for s in pb.workflow:
            for i, arc in enumerate(s.next.arcs if s.next else ()):
                if arc.step in pb.steps:
                    e = edges.setdefault(
                        (s.name, arc.step), {"from": s.name, "to": arc.step, "when": [], "arcs": []}
                    )
                    e["arcs"].append(i)
                    e["when"].append(None if arc.when is None else str(arc.when))
    for a, b in tokens:
        for s in (a, b):
            if s not in steps:
                steps.append(s)
        edges.setdefault((a, b), {"from": a, "to": b, "when": [], "arcs": [], "undeclared": pb is not None})
    return {
        "entry": entry, "steps": steps, "joins": sorted(joins), "cyclic": sorted(cyclic),
        "edges": [{**e, "tokens": tokens.get(k, 0), "back_edge": k in back} for k, e in edges.items()],
    }  # fmt: skip


def changed_steps(a: Playbook | None, b: Playbook | None) -> dict[str, list[str]] | None:
    """Steps added, removed and changed from ``a`` to ``b`` (by name; a step's line does not count)."""
    if a is None or b is None:
        return None

    def body(s: Any) -> Any:
        return s.model_dump(mode="json", exclude={"line"})

    sa, sb = {s.name: body(s) for s in a.workflow}, {s.name: body(s) for s in b.workflow}
    return {
        "added": sorted(set(sb) - set(sa)), "removed": sorted(set(sa) - set(sb)),
        "changed": sorted(n for n in sa.keys() & sb.keys() if sa[n] != sb[n]),
    }  # fmt: skip
