"""NoETL's `iterator` and `playbooks` kinds, read as task loops of the kinds they run (issue 32.4),
so they are recorded and pass the trust gate as those kinds. ``ctx`` is the parser's (``ctx.err``)."""

from __future__ import annotations

from typing import Any

from noetl_dagster.dsl.source import PathT

_LOOP_MODES = {"sequential": "sequential", "async": "parallel", "parallel": "parallel"}


def iterator_body(ctx: Any, body: dict[str, Any], path: PathT) -> dict[str, Any] | None:
    """NoETL's ``kind: iterator`` (``collection``, ``element``, ``mode``, a nested ``task``) as the
    nested task with a task loop, so it runs (and passes the trust gate) as any looped task does."""
    task, mode = body.get("task"), str(body.get("mode") or "sequential")
    if not isinstance(task, dict) or not isinstance(task.get("kind"), str):
        ctx.err(
            (*path, "task"),
            "iterator-shape",
            "`kind: iterator` needs `task:` (a mapping with its own `kind`)",
        )
        return None
    if "collection" not in body:
        ctx.err(path, "iterator-shape", "`kind: iterator` needs `collection` (a list or a template)")
        return None
    if mode not in _LOOP_MODES or "loop" in task or "loop" in body:
        why = (
            f"mode {mode!r} is not sequential or async"
            if mode not in _LOOP_MODES
            else "it cannot also have `loop`"
        )
        ctx.err(
            (*path, "mode" if mode not in _LOOP_MODES else "loop"),
            "iterator-shape",
            f"`kind: iterator`: {why}",
        )
        return None
    spec: dict[str, Any] = {"mode": _LOOP_MODES[mode]}
    for key in ("max_in_flight", "concurrency"):
        if body.get(key) is not None:
            spec["max_in_flight"] = body[key]
    out = {
        **task,
        "loop": {"in": body["collection"], "iterator": str(body.get("element") or "item"), "spec": spec},
    }
    for key in ("spec", "set"):
        if key in body and key not in task:
            out[key] = body[key]
    return out


def playbooks_body(ctx: Any, body: dict[str, Any], path: PathT) -> dict[str, Any] | None:
    """``kind: playbooks``: several sub-playbooks as one task, i.e. ``kind: playbook`` looped over
    ``playbooks: [path | {path, input, return_step}]`` (``mode: sequential | parallel``)."""
    items, mode = body.get("playbooks"), str(body.get("mode") or "sequential")
    if not isinstance(items, list) or not items:
        ctx.err((*path, "playbooks"), "playbooks-shape", "`kind: playbooks` needs `playbooks:`, a non-empty list "
                "of catalog paths or {path, input, return_step}")  # fmt: skip
        return None
    norm = []
    for i, item in enumerate(items):
        item = {"path": item} if isinstance(item, str) else item
        if not isinstance(item, dict) or not isinstance(item.get("path"), str) or "definition" in item:
            ctx.err((*path, "playbooks", i), "playbooks-shape", "each entry is a path or {path, input, return_step} "
                    "(an inline definition runs with `kind: playbook`)")  # fmt: skip
            return None
        extra = sorted(set(item) - {"path", "input", "args", "return_step", "name"})
        if extra:
            ctx.err(
                (*path, "playbooks", i, extra[0]),
                "playbooks-shape",
                f"unknown key(s) {extra}: path, input, return_step, name",
            )
            return None
        norm.append({"path": item["path"], "input": item.get("input", item.get("args")) or {},
                     "return_step": item.get("return_step"), "name": item.get("name") or item["path"]})  # fmt: skip
    if mode not in _LOOP_MODES:
        ctx.err(
            (*path, "mode"),
            "playbooks-shape",
            f"`kind: playbooks`: mode {mode!r} is not sequential or parallel",
        )
        return None
    out = {k: v for k, v in body.items() if k not in ("kind", "playbooks", "mode", "loop")}
    out.update({"kind": "playbook", "path": "{{ playbook_item.path }}", "input": "{{ playbook_item.input }}",
                "return_step": "{{ playbook_item.return_step }}",
                "loop": {"in": norm, "iterator": "playbook_item", "spec": {"mode": _LOOP_MODES[mode]}}})  # fmt: skip
    return out
