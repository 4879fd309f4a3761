"""Tool-kind registry.

A tool kind is a callable ``(inputs: dict, ctx: ToolContext) -> result``. It
returns the task's result or raises :class:`ToolError` (any other exception is
turned into an error outcome by the engine too). Kinds register with
:func:`register_tool` or through the ``noetl_dagster.tools`` entry-point group
(``name = "package.module:callable"``).
"""

from __future__ import annotations

import importlib
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

# Built-in kinds by name -> (module that registers them, raw keys). Modules are imported on
# first use only, so validating or running a playbook never pays for kinds it does not use.
BUILTIN_KINDS: dict[str, tuple[str, frozenset[str]]] = {
    "noop": ("noetl_dagster.tools.core", frozenset()),
    "workbook": ("noetl_dagster.tools.core", frozenset()),
    "playbook": ("noetl_dagster.tools.core", frozenset()),
    "python": ("noetl_dagster.tools.core", frozenset({"code", "code_b64", "code_base64"})),
    "http": ("noetl_dagster.tools.http", frozenset()),
    "postgres": ("noetl_dagster.tools.postgres", frozenset()),
    "duckdb": ("noetl_dagster.tools.duckdb_tool", frozenset()),
    "secrets": ("noetl_dagster.tools.secrets", frozenset()),
    "parquet": ("noetl_dagster.tools.storage", frozenset()),
    "arrow": ("noetl_dagster.tools.storage", frozenset()),
    "iceberg": ("noetl_dagster.tools.storage", frozenset()),
    "qdrant": ("noetl_dagster.tools.qdrant", frozenset()),
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
