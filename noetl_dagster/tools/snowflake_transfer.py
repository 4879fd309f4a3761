"""``kind: snowflake_transfer``: NoETL's Snowflake <-> PostgreSQL transfer, on ``kind: transfer``.

Upstream's shape::

    kind: snowflake_transfer
    direction: sf_to_pg | pg_to_sf
    source: {query: SELECT ...}
    target: {table: schema.table}        # or query: an INSERT with placeholders
    chunk_size: 1000
    mode: append | replace | upsert
    auth: {sf: <credential>, pg: <credential>}   # also `credentials:`; a credential is a name or {key: name}

The Snowflake credential holds ``sf_account, sf_user, sf_password`` (or the connector's own names,
``private_key`` instead of a password), the Postgres one ``db_host, db_port, db_user, db_password,
db_name``, as upstream reads them. The rows move as ``kind: transfer`` moves them (Arrow batches, one
transaction on the Postgres side), so the result is transfer's: ``{direction, rows_transferred,
chunks_processed, bytes, columns, target_table, duration_ms, ...}`` with ``direction`` as written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from noetl_dagster.tools.configs import ToolConfig
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool
from noetl_dagster.tools.transfer import transfer_tool

Credential = str | dict[str, Any]


class _Aliases(BaseModel):
    model_config = ConfigDict(extra="allow")

    sf: Credential | None = Field(None, description="the Snowflake credential (name, or {key: name})")
    pg: Credential | None = Field(None, description="the PostgreSQL credential (name, or {key: name})")


class _Source(BaseModel):
    model_config = ConfigDict(extra="allow")

    query: str = Field(..., description="the SELECT run on the source side")


class _Target(BaseModel):
    model_config = ConfigDict(extra="allow")

    table: str | None = Field(None, description="target table (schema-qualified)")
    query: str | None = Field(None, description="a custom INSERT instead of table")


class SnowflakeTransferConfig(ToolConfig):
    direction: Literal["sf_to_pg", "pg_to_sf"] = Field(..., description="sf_to_pg | pg_to_sf")
    source: _Source = Field(..., description="{query}")
    target: _Target = Field(..., description="{table} or {query}")
    chunk_size: int = Field(1000, ge=1, le=1_000_000, description="rows per batch")
    mode: Literal["append", "replace", "upsert"] = Field("append", description="append | replace | upsert")
    auth: _Aliases | None = Field(None, description="{sf: credential, pg: credential}")
    credentials: _Aliases | None = Field(None, description="alias of auth (upstream's docstring spelling)")


def _credential(value: Any, alias: str) -> Any:
    if isinstance(value, Mapping) and isinstance(value.get("key"), str) and len(value) == 1:
        return value["key"]  # upstream's {key: name}
    if value in (None, "", {}):
        raise ToolError(f"snowflake_transfer: auth.{alias} (the {'Snowflake' if alias == 'sf' else 'PostgreSQL'} "
                        "credential) is required", kind="config_error")  # fmt: skip
    return value


def transfer_config(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The ``kind: transfer`` config that does what this ``snowflake_transfer`` config asks."""
    direction = inputs.get("direction")
    if direction not in ("sf_to_pg", "pg_to_sf"):
        raise ToolError(f"snowflake_transfer: direction must be sf_to_pg or pg_to_sf, not {direction!r}",
                        kind="config_error")  # fmt: skip
    aliases = inputs.get("auth") or inputs.get("credentials") or {}
    if not isinstance(aliases, Mapping):
        raise ToolError(
            "snowflake_transfer: auth must be {sf: credential, pg: credential}", kind="config_error"
        )
    sf, pg = _credential(aliases.get("sf"), "sf"), _credential(aliases.get("pg"), "pg")
    src, tgt = dict(inputs.get("source") or {}), dict(inputs.get("target") or {})
    if not src.get("query"):
        raise ToolError("snowflake_transfer: source.query is required", kind="config_error")
    if not (tgt.get("table") or tgt.get("query")):
        raise ToolError("snowflake_transfer: target.table (or target.query) is required", kind="config_error")
    s_type, t_type = ("snowflake", "postgres") if direction == "sf_to_pg" else ("postgres", "snowflake")
    s_auth, t_auth = (sf, pg) if direction == "sf_to_pg" else (pg, sf)
    return {
        "source": {**src, "type": s_type, "auth": s_auth},
        "target": {**tgt, "type": t_type, "auth": t_auth},
        "chunk_size": int(inputs.get("chunk_size") or 1000),
        "mode": str(inputs.get("mode") or "append"),
    }


@register_tool("snowflake_transfer", config=SnowflakeTransferConfig,
               description="NoETL's Snowflake <-> PostgreSQL transfer (direction sf_to_pg | pg_to_sf)")  # fmt: skip
def snowflake_transfer_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    """Move a query's rows between Snowflake and PostgreSQL (upstream's snowflake_transfer)."""
    out = transfer_tool(transfer_config(inputs), ctx)
    if isinstance(out, dict):
        out["direction"] = inputs["direction"]
    return out
