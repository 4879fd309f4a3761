"""``kind: rhai``: NoETL's scripting kind, on the Rhai subset of ``noetl_dagster.dsl.rhai``.

Upstream's shape: ``code`` (templates rendered first, as upstream does) and ``args`` (variables of
the script); here ``input`` keys are variables too, with ``execution_id`` and ``step``. The result
is the script's last expression. ``max_operations`` (default 100,000) bounds the work: a script
that exceeds it is ``rhai_limit``; a construct outside the subset ``rhai_unsupported`` (``validate``
reports it first when the code has no templates), a run-time error ``rhai_error``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from noetl_dagster.dsl.rhai import DEFAULT_MAX_OPERATIONS, RhaiError, run
from noetl_dagster.tools.configs import ToolConfig
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool


class RhaiConfig(ToolConfig):
    code: str = Field(..., description="the Rhai script (the supported subset: docs/tools.md)")
    args: dict[str, Any] | None = Field(None, description="variables of the script")
    max_operations: int = Field(DEFAULT_MAX_OPERATIONS, ge=1, le=100_000_000, description="operation budget")


@register_tool("rhai", config=RhaiConfig, description="NoETL's Rhai scripting kind (a documented subset)")
def rhai_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    """Run a Rhai script; its last expression is the result."""
    variables: dict[str, Any] = {"execution_id": str(ctx.execution_id), "step": str(ctx.step)}
    for key in ("input", "args"):
        if isinstance(inputs.get(key), Mapping):
            variables.update(inputs[key])
    try:
        return run(str(inputs.get("code") or ""), variables,
                   max_operations=int(inputs.get("max_operations") or DEFAULT_MAX_OPERATIONS), log=ctx.log)  # fmt: skip
    except RhaiError as e:
        raise ToolError(f"rhai: {e}", kind=e.kind) from None
    except RecursionError:
        raise ToolError("rhai: the script nests too deeply", kind="rhai_limit") from None
