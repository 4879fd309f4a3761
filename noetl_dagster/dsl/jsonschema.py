"""A JSON Schema (draft-07, the YAML editor extensions' dialect) of the playbooks this project accepts.

Editors use it to complete and flag keys as they type (``noetl-dagster schema``; the example project
maps ``playbooks/**/*.yaml`` to it in ``.vscode/settings.json``). Each tool kind's typed config comes
from its pydantic model (``register_tool(config=...)``), selected by ``kind`` with ``if``/``then``. The
schema holds what ``validate`` checks structurally — required keys, shapes, known kinds, the legacy keys
it refuses — and leaves to ``validate`` what needs the whole document (arc targets, graphs, templates).
A value typed as a number, a boolean, an enum or a mapping may also be a template (``{{ … }}``), which
the engine renders before the kind's model checks it.
"""

from __future__ import annotations

import copy
from typing import Any

from noetl_dagster.dsl.kinds import UNOFFERED_KINDS, get_tool, known_kinds
from noetl_dagster.dsl.parse import API_VERSION, LEGACY_STEP_KEYS

SCHEMA_ID = "https://noetl-dagster.dev/schema/playbook.schema.json"
TEMPLATE = {"type": "string", "pattern": r"\{\{|\{%", "description": "a template, rendered at run time"}
_ANY_MAP = {"type": "object"}


def _templated(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` or a template string (a plain string schema already takes templates)."""
    if schema.get("type") == "string" and "enum" not in schema and "const" not in schema:
        return schema
    return {
        "anyOf": [schema, TEMPLATE],
        **({"description": schema["description"]} if "description" in schema else {}),
    }


def _relax(schema: dict[str, Any]) -> dict[str, Any]:
    """Every property of every object (nested definitions too) may be a template."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict):
                for k, v in props.items():
                    walk(v)
                    props[k] = _templated(v) if isinstance(v, dict) else v
            for key, v in node.items():
                if key != "properties":
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    return schema


def _kind_config(kind: str, definitions: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON Schema of ``kind``'s config model (its nested models hoisted into ``definitions``)."""
    tk = get_tool(kind)
    model = getattr(tk, "config", None) if tk is not None else None
    if model is None:
        return None
    schema = model.model_json_schema(ref_template=f"#/definitions/{kind}.{{model}}")
    for name, sub in (schema.pop("$defs", None) or {}).items():
        definitions[f"{kind}.{name}"] = _relax(sub)
    schema.pop("title", None)
    schema["properties"] = {k: v for k, v in (schema.get("properties") or {}).items()
                            if k not in ("kind", "spec", "set", "loop", "desc", "pure")}  # fmt: skip
    return _relax(schema)


_ITERATOR = {
    "properties": {
        "collection": {"description": "the list to iterate (or a template)"},
        "element": {
            "type": "string",
            "description": "the element's name in the task's templates (default item)",
        },
        "mode": _templated({"enum": ["sequential", "async", "parallel"]}),
        "max_in_flight": _templated({"type": "integer", "minimum": 1}),
        "task": {"$ref": "#/definitions/task", "description": "the task run once per element"},
    },
    "required": ["collection", "task"],
}
_PLAYBOOKS = {
    "properties": {
        "playbooks": {
            "type": "array",
            "minItems": 1,
            "items": {
                "anyOf": [
                    {"type": "string"},
                    {
                        "type": "object",
                        "required": ["path"],
                        "additionalProperties": False,
                        "properties": {
                            "path": {"type": "string"},
                            "input": _ANY_MAP,
                            "args": _ANY_MAP,
                            "return_step": {"type": "string"},
                            "name": {"type": "string"},
                        },
                    },
                ]
            },  # fmt: skip
        },
        "mode": {"enum": ["sequential", "async", "parallel"]},
    },
    "required": ["playbooks"],
}


def _task_schema(kinds: list[str], definitions: dict[str, Any]) -> dict[str, Any]:
    per_kind = []
    for kind in kinds:
        if kind == "iterator":
            cfg: dict[str, Any] | None = _ITERATOR
        elif kind == "playbooks":
            cfg = _PLAYBOOKS
        else:
            cfg = _kind_config(kind, definitions)
        if cfg:
            definitions[f"config.{kind}"] = cfg
            per_kind.append({"if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
                             "then": {"$ref": f"#/definitions/config.{kind}"}})  # fmt: skip
    return {
        "type": "object",
        "required": ["kind"],
        "properties": {
            "kind": {"enum": kinds, "description": "the tool kind (`noetl-dagster tools list`)"},
            "name": {"type": "string"},
            "desc": {"type": "string"},
            "pure": {
                "type": "boolean",
                "description": "python/duckdb: the code has no effect outside the "
                "execution (no durability barrier before it)",
            },
            "spec": {"type": "object", "description": "runtime knobs and `policy.rules`"},
            "set": {"$ref": "#/definitions/set"},
            "loop": {"$ref": "#/definitions/loop"},
            "retry": {
                "not": {"type": "object"},
                "description": "legacy: use spec.policy.rules `do: retry` (migrate)",
            },
        },
        "allOf": per_kind,
    }


def playbook_schema() -> dict[str, Any]:
    """The schema (a fresh dict) of a ``noetl.io/v2`` playbook with every kind known here."""
    kinds = sorted((known_kinds() | {"iterator", "playbooks"}) - set(UNOFFERED_KINDS))
    definitions: dict[str, Any] = {
        "set": {
            "type": "object",
            "description": "writes: ctx.<key>, iter.<key> (on arcs: step.<key>, the token)",
            "propertyNames": {"not": {"pattern": "^workload(\\.|$)"}},
        },  # fmt: skip
        "loop": {
            "type": "object",
            "properties": {
                "in": {"description": "the list (or a template)"},
                "iterator": {"type": "string"},
                "spec": {
                    "type": "object",
                    "properties": {"mode": _templated({"enum": ["sequential", "parallel", "cursor"]})},
                },
                "cursor": {"type": "object"},
            },
            "anyOf": [{"required": ["in", "iterator"]}, {"required": ["cursor"]}],
        },
    }
    definitions["task"] = _task_schema(kinds, definitions)
    definitions["pipeline"] = {
        "anyOf": [
            {"$ref": "#/definitions/task"},
            {
                "type": "array",
                "items": {
                    "anyOf": [
                        {"$ref": "#/definitions/task"},
                        {
                            "type": "object",
                            "minProperties": 1,
                            "maxProperties": 1,
                            "additionalProperties": {"$ref": "#/definitions/task"},
                        },
                    ]
                },
            },  # fmt: skip
            {
                "type": "object",
                "minProperties": 1,
                "maxProperties": 1,
                "not": {"required": ["kind"]},
                "additionalProperties": {"$ref": "#/definitions/task"},
            },  # fmt: skip
        ],
    }
    definitions["arc"] = {
        "type": "object",
        "required": ["step"],
        "properties": {
            "step": {"type": "string"},
            "when": {"type": ["string", "boolean"]},
            "set": {"$ref": "#/definitions/set"},
            "args": {"type": "object", "description": "deprecated: use set: {step.<key>: …}"},
            "spec": {"type": "object"},
        },
    }
    definitions["next"] = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "mode": {"enum": ["exclusive", "inclusive"]},
                    "on_no_match": {"enum": ["quiet", "complete"]},
                },
            },  # fmt: skip
            "arcs": {"type": "array", "items": {"$ref": "#/definitions/arc"}},
        },
    }
    definitions["step"] = {
        "type": "object",
        "required": ["step"],
        "anyOf": [{"required": ["tool"]}, {"required": ["next"]}],
        "properties": {
            "step": {"type": "string", "minLength": 1},
            "desc": {"type": "string"},
            "tool": {"$ref": "#/definitions/pipeline"},
            "next": {"$ref": "#/definitions/next"},
            "loop": {"$ref": "#/definitions/loop"},
            "input": {"type": "object"},
            "args": {"type": "object", "description": "deprecated: use input"},
            "set": {"$ref": "#/definitions/set"},
            "spec": {"type": "object"},
            "outputs": {"type": "array"},
            "when": False,
            **dict.fromkeys(LEGACY_STEP_KEYS, False),  # legacy constructs: `noetl-dagster migrate`
        },
    }
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": SCHEMA_ID,
        "title": "noetl-dagster playbook",
        "description": f"A NoETL playbook ({API_VERSION}) as noetl-dagster runs it",
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "workflow"],
        "properties": {
            "apiVersion": {"const": API_VERSION},
            "kind": {"const": "Playbook"},
            "metadata": {
                "type": "object",
                "required": ["name", "path"],
                "properties": {"name": {"type": "string"}, "path": {"type": "string"}},
            },  # fmt: skip
            "workload": {"type": "object"},
            "keychain": {"type": "array", "items": {"type": "object", "required": ["name"]}},
            "executor": {"type": "object"},
            "workbook": {"type": "array", "items": {"type": "object", "required": ["name"]}},
            "workflow": {"type": "array", "minItems": 1, "items": {"$ref": "#/definitions/step"}},
            "vars": False,
        },
        "definitions": definitions,
    }
