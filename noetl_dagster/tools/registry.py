"""Tool-kind registry.

A tool kind is a callable ``(inputs: dict, ctx: ToolContext) -> result``. It
returns the task's result or raises :class:`ToolError` (any other exception is
turned into an error outcome by the engine too). Kinds register with
:func:`register_tool` or through the ``noetl_dagster.tools`` entry-point group
(``name = "package.module:callable"``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol


class ToolError(Exception):
    """A tool failed. ``details`` become kind helpers on the outcome (``http``, ``pg``, ``py``)."""

    def __init__(
        self,
        message: str,
        *,
        kind: str = "tool_error",
        retryable: bool = False,
        code: str | int | None = None,
        details: Mapping[str, Any] | None = None,
        result: Any = None,
    ):
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.retryable = retryable
        self.code = code
        self.details = dict(details or {})
        self.result = result


class ToolContext(Protocol):
    """What a tool can see of the running execution (implemented by the engine)."""

    execution_id: str
    step: str
    task: str
    attempt: int
    spec: Mapping[str, Any]  # the task's ``spec`` (policy excluded)
    base_dir: str | None  # directory of the playbook file, for relative paths
    render_context: Mapping[str, Any]  # read-only view of the template namespaces

    def credential(self, name: str) -> dict[str, Any]: ...

    def resource(self, key: str, factory: Callable[[], Any]) -> Any:
        """A per-execution shared object (connection pools), created once."""

    def run_playbook(self, path: str, workload: Mapping[str, Any], **kw: Any) -> dict[str, Any]: ...

    def log(self, message: str) -> None: ...

    def redact(self, value: str) -> None:
        """Mark a secret value: it must never appear in events, logs or output."""


ToolFn = Callable[[dict[str, Any], ToolContext], Any]


@dataclass
class ToolKind:
    name: str
    fn: ToolFn
    # config keys the engine must not render before the call (code, nested specs)
    raw_keys: frozenset[str] = field(default_factory=frozenset)
    description: str = ""


_lock = threading.Lock()
_REGISTRY: dict[str, ToolKind] = {}
_LOADED_BUILTINS = False
_LOADED_ENTRY_POINTS = False

BUILTIN_MODULES = [
    "noetl_dagster.tools.core",
    "noetl_dagster.tools.http",
    "noetl_dagster.tools.postgres",
    "noetl_dagster.tools.duckdb_tool",
    "noetl_dagster.tools.secrets",
    "noetl_dagster.tools.storage",
    "noetl_dagster.tools.qdrant",
]


def register_tool(
    name: str, fn: ToolFn | None = None, *, raw_keys: frozenset[str] | set[str] = frozenset(), description: str = ""
):
    """Register a tool kind; usable as a decorator: ``@register_tool("echo")``."""

    def deco(f: ToolFn) -> ToolFn:
        with _lock:
            _REGISTRY[name] = ToolKind(name, f, frozenset(raw_keys), description or (f.__doc__ or "").strip())
        return f

    return deco(fn) if fn is not None else deco


def _load() -> None:
    global _LOADED_BUILTINS, _LOADED_ENTRY_POINTS
    if not _LOADED_BUILTINS:
        _LOADED_BUILTINS = True
        import importlib

        for mod in BUILTIN_MODULES:
            try:
                importlib.import_module(mod)
            except ModuleNotFoundError as e:  # a kind whose module is not written yet
                if e.name != mod:
                    raise
    if not _LOADED_ENTRY_POINTS:
        _LOADED_ENTRY_POINTS = True
        for ep in entry_points(group="noetl_dagster.tools"):
            obj = ep.load()
            if isinstance(obj, ToolKind):
                _REGISTRY.setdefault(obj.name, obj)
            elif callable(obj) and ep.name not in _REGISTRY:
                register_tool(ep.name, obj)


def get_tool(name: str) -> ToolKind | None:
    _load()
    return _REGISTRY.get(name)


def known_kinds() -> set[str]:
    _load()
    return set(_REGISTRY)
