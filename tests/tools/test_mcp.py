"""kind: mcp against real MCP servers written here with the official SDK (MCPServer): over stdio
(a child process) and over streamable HTTP (uvicorn on loopback)."""

from __future__ import annotations

import socket
import sys
import textwrap
import time

import pytest

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.dsl.kinds import ToolConfigError, get_tool
from noetl_dagster.engine.ports import ToolError
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.tools.mcp import mcp_tool

SERVER = textwrap.dedent('''
    import sys
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("noetl-test")

    @app.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @app.tool()
    def lookup(city: str) -> dict:
        """Weather for a city."""
        if city == "nowhere":
            raise ValueError("unknown city: nowhere")
        return {"city": city, "temp_c": len(city) * 3}

    if __name__ == "__main__":
        if len(sys.argv) > 1:
            import uvicorn
            uvicorn.run(app.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="error")
        else:
            app.run()
''')


@pytest.fixture
def server_file(tmp_path):
    path = tmp_path / "mcp_server.py"
    path.write_text(SERVER)
    return path


def stdio(server_file, **kw):
    return {"command": sys.executable, "args": [str(server_file)], **kw}


@pytest.mark.slow  # each call starts a Python MCP server process
def test_call_and_list_over_stdio(server_file, make_ctx):
    ctx = make_ctx()
    out = mcp_tool(stdio(server_file, tool="add", arguments={"a": 2, "b": 40}), ctx)
    assert out["text"] == "42" and out["structured"] in (42, {"result": 42}) and not out["is_error"]
    out = mcp_tool(stdio(server_file, tool="lookup", arguments={"city": "Oslo"}), ctx)
    assert out["structured"] == {"city": "Oslo", "temp_c": 12}
    listed = mcp_tool(stdio(server_file, operation="list_tools"), ctx)
    assert {t["name"] for t in listed["tools"]} == {"add", "lookup"}
    assert listed["tools"][0]["input_schema"]["type"] == "object"


@pytest.mark.slow
def test_tool_failure_and_unknown_tool_are_error_outcomes(server_file, make_ctx):
    ctx = make_ctx()
    with pytest.raises(ToolError) as ei:
        mcp_tool(stdio(server_file, tool="lookup", arguments={"city": "nowhere"}), ctx)
    assert (
        ei.value.kind == "mcp_tool_error" and "lookup" in ei.value.message
    )  # the SDK hides the exception text
    assert ei.value.result["is_error"] is True
    with pytest.raises(ToolError) as ei:
        mcp_tool(stdio(server_file, tool="no_such_tool"), ctx)
    assert ei.value.kind in ("mcp_tool_error", "mcp_error")
    with pytest.raises(ToolError) as ei:
        mcp_tool({"command": "/nonexistent/mcp-server", "tool": "x"}, ctx)
    assert ei.value.kind == "connection_error" and ei.value.retryable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_streamable_http_server(server_file, make_ctx):
    import subprocess

    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(server_file), str(port)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        out = mcp_tool(
            {"url": f"http://127.0.0.1:{port}/mcp", "tool": "add", "arguments": {"a": 1, "b": 2}}, make_ctx()
        )
        assert out["text"] == "3"
    finally:
        proc.terminate()
        proc.wait(10)
    with pytest.raises(ToolError) as ei:
        mcp_tool({"url": f"http://127.0.0.1:{port}/mcp", "tool": "add", "timeout": 5}, make_ctx())
    assert ei.value.kind in ("connection_error", "timeout")


def test_bad_config_is_a_clear_validation_error(make_ctx):
    with pytest.raises(ToolConfigError, match="kind 'mcp': invalid config: arguments"):
        get_tool("mcp").check_config({"tool": "add", "arguments": [1, 2]})
    with pytest.raises(ToolError, match="give the server as url"):
        mcp_tool({"tool": "add"}, make_ctx())


@pytest.mark.slow
def test_mcp_in_a_playbook(server_file, tmp_path):
    pb = load_playbook_dict(
        {
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": {"name": "m", "path": "t/m"},
            "workflow": [
                {
                    "step": "start",
                    "tool": {
                        **stdio(server_file),
                        "kind": "mcp",
                        "tool": "add",
                        "arguments": {"a": "{{ workload.x }}", "b": 1},
                    },
                }
            ],
        }
    )
    res = run_playbook(pb, workload={"x": 41}, data_dir=tmp_path)
    assert res.status == "completed" and res.results["start"]["text"] == "42"
