"""The tool-kind catalogue: which ``kind:`` names exist and how to load them.

A tool kind is a callable ``(inputs: dict, ctx: ToolContext) -> result`` (see
``noetl_dagster.engine.ports``). Kinds register with :func:`register_tool` or
through the ``noetl_dagster.tools`` entry-point group (``name =
"package.module:callable"``). Validation asks this catalogue for names and raw
keys without importing any tool module; the engine asks it for the callable.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

ToolFn = Callable[[dict[str, Any], Any], Any]  # (inputs, engine.ports.ToolContext) -> result


@dataclass
class ToolKind:
    name: str
    fn: ToolFn
    # config keys the engine must not render before the call (code, nested specs)
    raw_keys: frozenset[str] = field(default_factory=frozenset)
    description: str = ""


_lock = threading.Lock()
_REGISTRY: dict[str, ToolKind] = {}

# Built-in kinds by name -> (module that registers them, raw keys). Modules are imported on
# first use only, so validating or running a playbook never pays for kinds it does not use.
BUILTIN_KINDS: dict[str, tuple[str, frozenset[str]]] = {
    "noop": ("noetl_dagster.tools.core", frozenset()),
    "workbook": ("noetl_dagster.tools.core", frozenset()),
    "playbook": ("noetl_dagster.tools.core", frozenset({"definition"})),  # an inline child: its templates are its own
    "python": ("noetl_dagster.tools.core", frozenset({"code", "code_b64", "code_base64"})),
    "http": ("noetl_dagster.tools.http", frozenset()),
    "postgres": ("noetl_dagster.tools.postgres", frozenset()),
    "duckdb": ("noetl_dagster.tools.duckdb_tool", frozenset()),
    "secrets": ("noetl_dagster.tools.secrets", frozenset()),
    "parquet": ("noetl_dagster.tools.storage", frozenset()),
    "arrow": ("noetl_dagster.tools.storage", frozenset()),
    "iceberg": ("noetl_dagster.tools.storage", frozenset()),
    "qdrant": ("noetl_dagster.tools.qdrant", frozenset()),
    "quantum": ("noetl_dagster.tools.quantum", frozenset()),
    # the kinds compiled flows use (dsl/flow)
    "flow_input": ("noetl_dagster.tools.flow", frozenset({"literal", "literal_b64"})),
    "flow_guard": ("noetl_dagster.tools.flow", frozenset()),
    "resource": ("noetl_dagster.tools.flow", frozenset()),
}
BUILTIN_MODULES = sorted({m for m, _ in BUILTIN_KINDS.values()})
_ENTRY_POINTS: dict[str, Any] | None = None


def register_tool(
    name: str, fn: ToolFn | None = None, *, raw_keys: frozenset[str] | set[str] = frozenset(), description: str = ""
):
    """Register a tool kind; usable as a decorator: ``@register_tool("echo")``."""

    def deco(f: ToolFn) -> ToolFn:
        with _lock:
            _REGISTRY[name] = ToolKind(name, f, frozenset(raw_keys), description or (f.__doc__ or "").strip())
        return f

    return deco(fn) if fn is not None else deco


def _entry_points() -> dict[str, Any]:
    global _ENTRY_POINTS
    if _ENTRY_POINTS is None:
        _ENTRY_POINTS = {ep.name: ep for ep in entry_points(group="noetl_dagster.tools")}
    return _ENTRY_POINTS


def get_tool(name: str) -> ToolKind | None:
    """The kind's implementation, importing its module on first use."""
    tk = _REGISTRY.get(name)
    if tk is not None:
        return tk
    if name in BUILTIN_KINDS:
        importlib.import_module(BUILTIN_KINDS[name][0])
        return _REGISTRY.get(name)
    ep = _entry_points().get(name)
    if ep is not None:
        obj = ep.load()  # importing the module may register the kind itself (with its raw keys)
        if name not in _REGISTRY:
            if isinstance(obj, ToolKind):
                _REGISTRY[name] = obj
            elif callable(obj):
                register_tool(name, obj)
        return _REGISTRY.get(name)
    return None


def known_kinds() -> set[str]:
    """Every kind name that can be used, without importing any tool module."""
    return set(BUILTIN_KINDS) | set(_REGISTRY) | set(_entry_points())


def raw_keys(name: str) -> frozenset[str]:
    """Config keys a kind takes verbatim (never rendered); built-ins answer without an import."""
    if name in _REGISTRY:
        return _REGISTRY[name].raw_keys
    if name in BUILTIN_KINDS:
        return BUILTIN_KINDS[name][1]
    tk = get_tool(name)
    return tk.raw_keys if tk else frozenset()
