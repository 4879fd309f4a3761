"""Walk NoETL's playbook JSON schema (tests/engine/data/noetl_playbook.schema.json) key by key and
build, for one key, a small playbook that sets it (helpers for test_noetl_schema_keys)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from noetl_dagster.dsl.files import check_file_with_warnings

SCHEMA = Path(__file__).parent / "data" / "noetl_playbook.schema.json"
ITEM = 0  # a list position in a key path


def _ref(node: dict[str, Any]) -> tuple[str | None, bool]:
    """(the $defs name a property leads to, whether through a list)."""
    options = node.get("anyOf", [node])
    for o in options:
        if "$ref" in o:
            return o["$ref"].rsplit("/", 1)[1], False
        items = o.get("items")
        if o.get("type") == "array" and isinstance(items, dict) and "$ref" in items:
            return items["$ref"].rsplit("/", 1)[1], True
    return None, False


def _sample(node: dict[str, Any]) -> Any:
    """A schema-valid value for a leaf property."""
    if node.get("default") is not None:
        return node["default"]
    for o in node.get("anyOf", [node]):
        if "enum" in o:
            return o["enum"][0]
        t = o.get("type")
        if t in ("string", "boolean", "integer", "number", "object", "array"):
            return {"string": "x", "boolean": True, "integer": 1, "number": 1.5, "object": {}, "array": []}[t]
    return "x"


def schema_keys() -> list[tuple[tuple[Any, ...], Any]]:
    """(key path, sample value) for every property of every definition, each definition walked once
    from the first place it is reached (so ToolSpec is walked under workflow[0].tool)."""
    schema = json.loads(SCHEMA.read_text())
    defs = schema["$defs"]
    out: list[tuple[tuple[Any, ...], Any]] = []
    seen: set[str] = set()

    def walk(props: dict[str, Any], prefix: tuple[Any, ...]) -> None:
        for key, node in props.items():
            path = (*prefix, key)
            name, listed = _ref(node)
            out.append((path, ([] if listed else {}) if name else _sample(node)))
            if name and name not in seen:
                seen.add(name)
                walk(defs[name].get("properties", {}), (*path, ITEM) if listed else path)

    walk(schema["properties"], ())
    return out


def dotted(path: tuple[Any, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else ("." if i else "") + p for i, p in enumerate(path))


BASE = {
    "apiVersion": "noetl.io/v2",
    "kind": "Playbook",
    "metadata": {"name": "schema_key", "path": "t/schema_key"},
    "workflow": [
        {
            "step": "start",
            "tool": {"kind": "python", "code": "result = 1"},
            "next": {"arcs": [{"step": "end"}]},
        },
        {"step": "end", "tool": {"kind": "python", "code": "result = 2"}},
    ],
}
LOOP_IN = {"in": "{{ [1] }}", "iterator": "x"}
LOOP_CURSOR = {
    "cursor": {"kind": "postgres", "auth": "pg", "claim": "select 1"},
    "iterator": "x",
    "spec": {"mode": "cursor"},
}


def sample_playbook(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """BASE with ``path`` set to ``value`` (intermediate mappings created; a loop gets a valid source)."""
    doc = copy.deepcopy(BASE)
    if path[:3] == ("workflow", ITEM, "loop") and len(path) > 3:
        doc["workflow"][0]["loop"] = copy.deepcopy(
            LOOP_CURSOR if "cursor" in path or "frame" in path else LOOP_IN
        )
    if path[0] == "workbook":
        doc["workbook"] = [{"name": "w", "tool": {"kind": "python", "code": "result = 1"}}]
    node: Any = doc
    for part, nxt in zip(path[:-1], path[1:], strict=False):
        if isinstance(part, int):
            node = node[part]
            continue
        if not isinstance(node.get(part), (dict, list)):
            node[part] = [] if isinstance(nxt, int) else {}
        node = node[part]
        if isinstance(nxt, int) and not node:
            node.append({})
    node[path[-1]] = value
    return doc


def issues_for(doc: dict[str, Any], tmp: Path) -> tuple[list[Any], list[Any]]:
    p = tmp / "schema_key.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    _, issues, warnings = check_file_with_warnings(p)
    return issues, warnings
