"""The plugin API for tool kinds, in one import.

A third-party kind needs only this module and one entry point (docs/tools.md "Adding a tool kind")::

    from noetl_dagster.tools.registry import ToolConfig, ToolContext, ToolError, register_tool

    class EchoConfig(ToolConfig):
        message: str

    @register_tool("echo", config=EchoConfig)
    def echo(inputs, ctx: ToolContext):
        return {"echo": inputs["message"]}

    # pyproject.toml:  [project.entry-points."noetl_dagster.tools"]  echo = "my_pkg.echo:echo"

The catalogue lives in ``noetl_dagster.dsl.kinds`` (validation needs the names)
and the contract in ``noetl_dagster.engine.ports`` (the engine calls the kinds).
"""

from typing import TYPE_CHECKING, Any

from noetl_dagster.dsl.kinds import (
    ENTRY_POINT_GROUP,
    KindError,
    PluginLoadError,
    ToolConfigError,
    ToolFn,
    ToolKind,
    all_kinds,
    builtin_kinds,
    get_tool,
    known_kinds,
    raw_keys,
    refresh_entry_points,
    register_tool,
)
from noetl_dagster.engine.ports import ToolContext, ToolError

if TYPE_CHECKING:
    from noetl_dagster.tools.configs import ToolConfig

__all__ = [
    "ENTRY_POINT_GROUP",
    "ToolConfig",
    "KindError",
    "PluginLoadError",
    "ToolConfigError",
    "ToolContext",
    "ToolError",
    "ToolFn",
    "ToolKind",
    "all_kinds",
    "builtin_kinds",
    "get_tool",
    "known_kinds",
    "raw_keys",
    "refresh_entry_points",
    "register_tool",
]


def __getattr__(name: str) -> Any:
    """``ToolConfig`` (pydantic) on first use: the engine imports this module, a run need not define models."""
    if name == "ToolConfig":
        from noetl_dagster.tools.configs import ToolConfig  # noqa: PLC0415

        return ToolConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
