"""`noetl-dagster worker` and `NOETL_TOOL_DISPATCH`: bad input is one line on stderr, exit 2, no traceback.

Run in a subprocess: what a user sees."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("", "analytics", "lineage", "registry_service")),
}


def _cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", *args], capture_output=True,
                          text=True, env={**ENV, **(env or {})}, cwd=cwd, timeout=60)  # fmt: skip


def _one_line_error(p: subprocess.CompletedProcess, pattern: str) -> None:
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    assert pattern in lines[0]
    assert "Traceback" not in p.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "url, says",
    [("foo://127.0.0.1:4222", "use nats://host:port"), ("nats://", "use nats://host:port"),
     ("nats://127.0.0.1:notaport", "use nats://host:port")],
)  # fmt: skip
def test_a_bad_nats_url_is_one_line(url, says, tmp_path):
    _one_line_error(_cli("worker", "--nats", url, cwd=tmp_path), says)


def test_a_nats_server_that_is_down_is_one_line(tmp_path):
    port = _free_port()  # nothing listens there
    p = _cli("worker", "--nats", f"nats://127.0.0.1:{port}", cwd=tmp_path)
    _one_line_error(p, f"cannot reach NATS at 127.0.0.1:{port}")


def test_a_bad_shard_is_one_line(tmp_path):
    _one_line_error(_cli("worker", "--shard", "shard-7", cwd=tmp_path), "--shard 'shard-7'")


def test_a_bad_region_is_one_line(tmp_path):
    _one_line_error(_cli("worker", "--region", "us.west", cwd=tmp_path), "region 'us.west'")


def test_a_bad_dispatch_url_fails_the_run_in_one_line(tmp_path):
    pb = tmp_path / "pb.yaml"
    pb.write_text("apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: p, path: t/p}\n"
                  "workflow:\n  - step: start\n    tool: {kind: noop}\n")  # fmt: skip
    p = _cli("run", str(pb), env={"NOETL_TOOL_DISPATCH": "http://127.0.0.1:4222", "NOETL_DAGSTER_HOME": str(tmp_path)},
             cwd=tmp_path)  # fmt: skip
    _one_line_error(p, "tool dispatch URL 'http://127.0.0.1:4222'")
