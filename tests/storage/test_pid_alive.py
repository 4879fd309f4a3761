"""Lease owners and warm run workers are judged alive by one helper; a zombie counts as gone."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from noetl_dagster.util.procs import pid_alive


def test_running_exited_unreaped_and_reaped_processes():
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 30
    while time.time() < deadline:  # exited, not yet waited for: a zombie
        with open(f"/proc/{child.pid}/stat", encoding="ascii") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.02)
    assert not pid_alive(child.pid)  # the lease store's old check said alive until the parent reaped it
    child.wait()
    assert not pid_alive(child.pid)
