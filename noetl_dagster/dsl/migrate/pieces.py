"""The pieces of a step the rules share: routing groups and targets of a legacy ``next``, the tasks of
a ``tool`` (single, list, label map), and small helpers over them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ruamel.yaml.comments import CommentedMap

from .constants import ARG_KEYS
from .report import _Refuse
from .templates import _tmpl
from .yamltree import _index


@dataclass
class _Target:
    step: str
    args: Any = None  # CommentedMap of the legacy `with` / `args`
    node: Any = None


@dataclass
class _Group:
    kind: str  # cond | default | always
    targets: list[_Target]
    when: Any = None
    set: Any = None
    line: int = 1


@dataclass
class _TaskRef:
    label: str
    body: CommentedMap
    style: str  # name | labelmap | single


def _task_items(tool: Any) -> list[_TaskRef] | None:
    if isinstance(tool, dict):
        if "kind" in tool or "type" in tool:
            return [_TaskRef(str(tool.get("name") or ""), tool, "single")]
        if len(tool) == 1 and isinstance(next(iter(tool.values())), dict):
            ((label, body),) = tool.items()
            return [_TaskRef(str(label), body, "labelmap")]
        return None
    if isinstance(tool, list):
        out = []
        for i, item in enumerate(tool):
            if not isinstance(item, dict):
                return None
            if "kind" in item or "type" in item:
                out.append(_TaskRef(str(item.get("name") or f"task_{i}"), item, "name"))
            elif len(item) == 1 and isinstance(next(iter(item.values())), dict):
                ((label, body),) = item.items()
                out.append(_TaskRef(str(label), body, "labelmap"))
            else:
                return None
        return out
    return None


def _target_args(item: dict, node: Any, key: Any) -> Any:
    present = [k for k in ARG_KEYS if k in item]
    if len(present) > 1:
        raise _Refuse(f"a routing target passes values under several keys {present}", node, key)
    args = item[present[0]] if present else None
    if args is not None and not isinstance(args, dict):
        raise _Refuse("the values a routing target passes are not a mapping", node, key)
    return args


def _raise(e: Exception) -> Any:
    raise e


def _bind_main_params(body: CommentedMap, incoming: set[str]) -> None:
    """Python ``main(p)`` read ``p`` from values routed in (v1 `with`); give it ``input: {p: "{{ p }}"}``."""
    if body.get("kind") != "python" or not isinstance(body.get("code"), str):
        return
    inputs = body.get("input") if isinstance(body.get("input"), dict) else {}
    missing = [p for p in _main_params(body["code"]) if p in incoming and p not in inputs and p not in body]
    if not missing:
        return
    if "input" not in body:
        body.insert(_index(body, "code"), "input", CommentedMap())
    for p in missing:
        body["input"][p] = _tmpl(p)


def _main_params(code: str) -> list[str]:
    import ast

    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "main":
            return [a.arg for a in node.args.args + node.args.kwonlyargs]
    return []
