"""Quantum jobs on disk: one JSON file per job under ``<data_dir>/quantum/jobs``.

Every provider's submit writes the job record here, so ``status``/``result``/``cancel`` find a job by
its id alone — from another task, another execution or another process after a restart. Writes are
atomic (temp file + rename); per-backend state (the emulator's queue and call counter) is updated
under an exclusive file lock, so parallel iterations and several processes agree.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from noetl_dagster.tools.registry import ToolError

TERMINAL = frozenset({"done", "failed", "cancelled"})
STATES = ("queued", "running", "done", "failed", "cancelled")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_locks_guard = threading.Lock()
_locks: dict[str, threading.Lock] = {}


def _thread_lock(path: Path) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(str(path), threading.Lock())


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JobStore:
    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        self.jobs = self.root / "jobs"

    def path(self, job_id: str) -> Path:
        if not _JOB_ID.match(job_id):
            raise ToolError(f"quantum: malformed job_id {job_id!r}", kind="config_error", code="bad_job_id")
        return self.jobs / f"{job_id}.json"

    def save(self, record: dict[str, Any]) -> None:
        self.jobs.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.path(record["job_id"]), record)

    def load(self, job_id: str) -> dict[str, Any]:
        p = self.path(job_id)
        try:
            return json.loads(p.read_text())
        except FileNotFoundError:
            raise ToolError(
                f"quantum: no job {job_id!r} in {self.jobs}", kind="not_found", code="unknown_job"
            ) from None

    def records(self) -> Iterator[dict[str, Any]]:
        if not self.jobs.is_dir():
            return
        for p in sorted(self.jobs.glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                yield json.loads(p.read_text())

    @contextlib.contextmanager
    def _flock(self, lock_path: Path) -> Iterator[None]:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with _thread_lock(lock_path), open(lock_path, "a+") as lf:
            fcntl.flock(lf, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lf, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def locked_state(self, name: str) -> Iterator[dict[str, Any]]:
        """A small JSON state file handed out for update and written back, under an exclusive lock."""
        path = self.root / f"{name}.json"
        with self._flock(self.root / f"{name}.lock"):
            state = json.loads(path.read_text()) if path.exists() else {}
            yield state
            _atomic_write(path, state)

    def update(self, job_id: str, change: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        """Read-modify-write one job record under its lock (``change`` returns the new record)."""
        with self._flock(self.jobs / f"{job_id}.lock"):
            record = self.load(job_id)
            before = json.dumps(record, sort_keys=True)
            new = change(record)
            if json.dumps(new, sort_keys=True) != before:
                self.save(new)
            return new


def _atomic_write(path: Path, value: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(value, f, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def now() -> float:
    return time.time()
