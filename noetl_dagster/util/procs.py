"""Process helpers shared by the stores and the run launcher."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` (on this host) still runs: it exists and is not a zombie (a process
    that has exited but whose parent has not reaped it holds no lease and runs no work)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no procfs (macOS): kill(0) said it exists
