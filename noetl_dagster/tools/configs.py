"""Typed config models of the built-in tool kinds (``noetl-dagster tools list`` shows their schemas).

The engine validates a task's rendered config against its kind's model before the call. The
models type what the tools read and allow other keys (``input``, NoETL's aliases, keys a later
NoETL version adds): a tool still reports its own semantic errors (a missing ``url``) as before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field


class ToolConfig(BaseModel):
    """Base of every kind's config: extra keys allowed, ``input`` is the step/task input."""

    # defer_build: a kind's validator is built at its first call (or schema), not when this module
    # is imported; a run of one kind builds one model, not all fifteen (issue 35)
    model_config = ConfigDict(extra="allow", populate_by_name=True, defer_build=True)

    input: Any = Field(None, description="the step/task input (NoETL `input`, legacy `args`)")


def _f(description: str, default: Any = None) -> Any:
    return Field(default, description=description)


Auth = str | dict[str, Any] | None
Sql = str | list[str] | None
Params = list[Any] | dict[str, Any] | None


class NoopConfig(ToolConfig):
    result: Any = _f("returned as the task's result (default {status: noop})")


class WorkbookConfig(ToolConfig):
    name: str | None = _f("the workbook entry to run")


class PlaybookConfig(ToolConfig):
    path: str | None = _f("catalog path or file of the sub-playbook")
    catalog_path: str | None = _f("alias of path")
    definition: Any = _f("an inline sub-playbook (not rendered)")
    payload: Any = _f("the child's workload (alias of input)")
    return_step: str | None = _f("the step whose result is returned")
    result_step: str | None = _f("alias of return_step")
    credentials: list[Any] | None = _f("credentials the child may read")
    registry: str | None = _f("resource registry URL for noetl:// paths")
    api_key: str | None = _f("registry API key")


class PythonConfig(ToolConfig):
    code: str | None = _f(
        "Python source (not rendered); `result`, main(...) or a top-level return is the result"
    )
    code_b64: str | None = _f("base64 of the code")
    code_base64: str | None = _f("alias of code_b64")
    script: Any = _f("a script file or {uri|path|source} to load the code from")
    libs: Any = _f("imports made available to the code ({alias: module})")


# The other built-in kinds' models live in tools/kind_configs.py and are defined at the first use of
# one (issue 35: a run of core kinds defines 5 models, not 16); imported by name, so the import graph
# has no configs <-> kind_configs cycle.
_MORE = frozenset(
    {
        "HttpConfig",
        "PostgresConfig",
        "DuckdbConfig",
        "DucklakeConfig",
        "SecretsConfig",
        "StorageConfig",
        "QdrantConfig",
        "QuantumConfig",
        "FlowInputConfig",
        "FlowGuardConfig",
        "ResourceConfig",
    }
)

if TYPE_CHECKING:
    from noetl_dagster.tools.kind_configs import (  # noqa: F401 - the lazily resolved names, for type checkers
        DuckdbConfig,
        DucklakeConfig,
        FlowGuardConfig,
        FlowInputConfig,
        HttpConfig,
        PostgresConfig,
        QdrantConfig,
        QuantumConfig,
        ResourceConfig,
        SecretsConfig,
        StorageConfig,
    )


def __getattr__(name: str) -> Any:
    if name in _MORE:
        return getattr(importlib.import_module("noetl_dagster.tools.kind_configs"), name)
    raise AttributeError(f"module 'noetl_dagster.tools.configs' has no attribute {name!r}")
