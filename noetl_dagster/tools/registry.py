"""The plugin API for tool kinds, in one import.

A third-party kind needs only this module::

    from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool

    @register_tool("echo")
    def echo(inputs, ctx: ToolContext):
        return inputs

The catalogue lives in ``noetl_dagster.dsl.kinds`` (validation needs the names)
and the contract in ``noetl_dagster.engine.ports`` (the engine calls the kinds).
"""

from noetl_dagster.dsl.kinds import (
    BUILTIN_KINDS,
    BUILTIN_MODULES,
    ToolFn,
    ToolKind,
    get_tool,
    known_kinds,
    raw_keys,
    register_tool,
)
from noetl_dagster.engine.ports import ToolContext, ToolError

__all__ = [
    "BUILTIN_KINDS",
    "BUILTIN_MODULES",
    "ToolContext",
    "ToolError",
    "ToolFn",
    "ToolKind",
    "get_tool",
    "known_kinds",
    "raw_keys",
    "register_tool",
]
