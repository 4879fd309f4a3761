"""Helpers of the cursor-loop tests: the CLI in a subprocess, waiting, and kill -9 + resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def cli(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "noetl_dagster.commands.main", *args], env=env or dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def wait(cond, timeout: float = 60) -> None:
    t0 = time.time()
    while not cond():
        assert time.time() - t0 < timeout, "timed out"
        time.sleep(0.1)


def resume_last(data: Path) -> dict:
    """``resume`` the newest execution in ``data`` (the one a SIGKILL interrupted); its --json output."""
    cmd = [sys.executable, "-m", "noetl_dagster.commands.main"]
    ex = subprocess.run(
        [*cmd, "executions", "--data-dir", str(data), "--json"], capture_output=True, text=True, timeout=60
    )
    eid = json.loads(ex.stdout)[0]["execution_id"]
    res = subprocess.run(
        [*cmd, "resume", eid, "--data-dir", str(data), "--json"], capture_output=True, text=True, timeout=240
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)
