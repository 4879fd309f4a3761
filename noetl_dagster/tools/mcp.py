"""``kind: mcp``: call a Model Context Protocol server's tools with the official ``mcp`` SDK.

The server is reached over **stdio** (``command`` + ``args``, ``env``, ``cwd``: the server is a child
process started for the call) or **streamable HTTP** (``url`` | ``endpoint`` | ``server_url``, with
``headers`` and ``auth`` — a bearer credential). ``operation`` is ``call_tool`` (default when ``tool``
is given) or ``list_tools``.

Result of ``call_tool``: ``{tool, content: [...], text, structured, is_error}`` — ``text`` joins the text
blocks, ``structured`` is the tool's structured output (or ``text`` parsed as JSON when it is JSON). A tool
that reports ``isError`` is the error outcome ``mcp_tool_error`` with that result attached; a server that
cannot be started or reached is ``connection_error`` (retryable), a protocol error ``mcp_error`` with the
JSON-RPC code. ``list_tools``: ``{tools: [{name, description, input_schema}]}``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from contextlib import asynccontextmanager, nullcontext
from typing import Any, Literal

import anyio
from pydantic import Field

from noetl_dagster.tools.configs import ToolConfig
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool
from noetl_dagster.util.jsonutil import plain


class McpConfig(ToolConfig):
    operation: Literal["call_tool", "list_tools"] | None = Field(
        None, description="call_tool (default) | list_tools"
    )
    tool: str | None = Field(None, description="the MCP tool to call")
    tool_name: str | None = Field(None, description="alias of tool")
    arguments: dict[str, Any] | None = Field(None, description="the tool's arguments")
    url: str | None = Field(None, description="streamable-HTTP endpoint, e.g. http://host:8000/mcp")
    endpoint: str | None = Field(None, description="alias of url")
    server_url: str | None = Field(None, description="alias of url")
    headers: dict[str, str] | None = Field(None, description="HTTP headers")
    auth: str | dict[str, Any] | None = Field(None, description="credential with a bearer token / api_key")
    command: str | None = Field(None, description="stdio server: the program to start")
    args: list[str] | None = Field(None, description="stdio server: its arguments")
    env: dict[str, str] | None = Field(None, description="stdio server: extra environment")
    cwd: str | None = Field(None, description="stdio server: working directory")
    timeout: float | None = Field(None, gt=0, description="seconds for the whole call (default 60)")


def _headers(inputs: Mapping[str, Any], ctx: ToolContext) -> dict[str, str]:
    headers = {str(k): str(v) for k, v in (inputs.get("headers") or {}).items()}
    auth = inputs.get("auth")
    record = (
        ctx.credential(auth)
        if isinstance(auth, str) and auth
        else (dict(auth) if isinstance(auth, Mapping) else {})
    )
    token = record.get("token") or record.get("access_token") or record.get("api_key")
    if token:
        ctx.redact(str(token))
        headers.setdefault("Authorization", f"Bearer {token}")
    return headers


@asynccontextmanager
async def _session(inputs: Mapping[str, Any], ctx: ToolContext):
    from mcp import ClientSession  # noqa: PLC0415

    url = inputs.get("url") or inputs.get("endpoint") or inputs.get("server_url")
    if url:
        import httpx  # noqa: PLC0415
        from mcp.client import streamable_http  # noqa: PLC0415

        client = getattr(streamable_http, "streamable_http_client", None)
        async with httpx.AsyncClient(
            headers=_headers(inputs, ctx), timeout=float(inputs.get("timeout") or 60)
        ) as http:
            async with client(str(url), http_client=http) as streams:
                read, write = streams[0], streams[1]
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    yield session
        return
    from mcp import StdioServerParameters  # noqa: PLC0415
    from mcp.client.stdio import stdio_client  # noqa: PLC0415

    argv = [str(inputs["command"]), *(str(a) for a in inputs.get("args") or [])]
    declared = {str(k): str(v) for k, v in (inputs.get("env") or {}).items()}
    env = {"PATH": os.environ.get("PATH", ""), **declared}
    cwd = inputs.get("cwd") or None
    from noetl_dagster.tools import sandbox  # noqa: PLC0415

    scratch = sandbox.task_scratch(ctx, "mcp")
    with sandbox.task_egress(ctx) if scratch is not None else nullcontext() as proxy:
        if scratch is not None:  # a generated playbook's server runs in the OS sandbox (tools/sandbox.py)
            box = sandbox.task_command(ctx, argv, scratch, env=declared, proxy_socket=proxy)
            argv, env, cwd = box.argv, box.env, box.cwd
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=cwd)
        with open(os.devnull, "w") as errlog:  # the server's stderr is not ours to print
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    yield session


def _attr(obj: Any, *names: str) -> Any:
    """An SDK model field by its 2.x (snake_case) or 1.x (camelCase) name."""
    for n in names:
        if hasattr(obj, n):
            return getattr(obj, n)
    return None


def _content(block: Any) -> dict[str, Any]:
    return plain(block.model_dump(mode="json", exclude_none=True, by_alias=True))


async def _call(inputs: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    op = inputs.get("operation") or ("call_tool" if (inputs.get("tool") or inputs.get("tool_name")) else None)
    async with _session(inputs, ctx) as session:
        if op == "list_tools":
            listed = await session.list_tools()
            return {
                "tools": [
                    {
                        "name": t.name,
                        "description": t.description,
                        "input_schema": plain(_attr(t, "input_schema", "inputSchema")),
                    }
                    for t in listed.tools
                ]
            }
        name = str(inputs.get("tool") or inputs.get("tool_name"))
        res = await session.call_tool(name, dict(inputs.get("arguments") or {}))
    content = [_content(b) for b in getattr(res, "content", None) or []]
    text = "\n".join(b.get("text", "") for b in content if b.get("type") == "text")
    structured = _attr(res, "structured_content", "structuredContent")
    if structured is None and text:
        try:
            structured = json.loads(text)
        except ValueError:
            structured = None
    out = {
        "tool": name,
        "content": content,
        "text": text,
        "structured": plain(structured),
        "is_error": bool(_attr(res, "is_error", "isError")),
    }
    if out["is_error"]:
        raise ToolError(f"mcp: tool {name!r} failed: {text[:300]}", kind="mcp_tool_error", result=out)
    return out


def _unwrap(e: BaseException) -> BaseException:
    while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
        e = e.exceptions[0]
    return e


@register_tool(
    "mcp", config=McpConfig, description="Call a Model Context Protocol server's tools (official mcp SDK)"
)
def mcp_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    """Call an MCP server's tool (stdio or streamable HTTP), or list its tools."""
    has_server = (
        inputs.get("url") or inputs.get("endpoint") or inputs.get("server_url") or inputs.get("command")
    )
    if not has_server:
        raise ToolError(
            "mcp: give the server as url: (streamable HTTP) or command: (+ args, stdio)", kind="config_error"
        )
    if inputs.get("operation") != "list_tools" and not (inputs.get("tool") or inputs.get("tool_name")):
        raise ToolError("mcp: tool: is required (or operation: list_tools)", kind="config_error")
    where = inputs.get("url") or inputs.get("endpoint") or inputs.get("server_url") or inputs.get("command")
    timeout = float(inputs.get("timeout") or 60)

    async def main() -> dict[str, Any]:
        with anyio.fail_after(timeout):
            return await _call(inputs, ctx)

    try:
        return anyio.run(main)
    except ToolError:
        raise
    except BaseException as exc:  # noqa: BLE001 - the SDK raises through task groups
        e = _unwrap(exc)
        if isinstance(e, ToolError):
            raise e from None
        if isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        if isinstance(e, TimeoutError):
            raise ToolError(
                f"mcp: {where}: no answer within {timeout:g}s", kind="timeout", retryable=True
            ) from None
        code = getattr(getattr(e, "error", None), "code", None)
        if code is not None:
            raise ToolError(f"mcp: {where}: {e}", kind="mcp_error", code=code) from None
        if isinstance(e, OSError | ConnectionError) or type(e).__name__ in (
            "ConnectError",
            "HTTPStatusError",
        ):
            raise ToolError(
                f"mcp: cannot reach {where}: {e}", kind="connection_error", retryable=True
            ) from None
        raise ToolError(f"mcp: {where}: {type(e).__name__}: {e}", kind="mcp_error") from None


register_tool(
    "agent", mcp_tool, config=McpConfig, description="NoETL's agent kind, served by an MCP server's tools"
)
