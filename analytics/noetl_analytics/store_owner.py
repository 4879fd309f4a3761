"""Who holds the embedded facts store: an owner file beside the chdb path.

chdb allows one process per path. The process that opens a path takes an
exclusive ``flock`` on ``<path>.owner`` and writes there its pid, what it is
(``dashboard serve``, ``facts export``, a Dagster export run), since when, and,
for a long-lived owner, the loopback endpoint and token through which other
processes hand it their exports (:mod:`noetl_analytics.export_handoff`). The
kernel drops the lock when the process dies, so a file left by a dead process
is taken over; anyone else gets :class:`StoreHeld`, naming the holder.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_kind: str | None = None


def set_process_kind(kind: str) -> None:
    """Name this process in the owner file (e.g. ``dashboard serve``)."""
    global _kind
    _kind = kind


@contextmanager
def acting_as(kind: str | None) -> Iterator[None]:
    """Name this process ``kind`` for a while (a Dagster run inside a longer-lived process)."""
    global _kind
    before = _kind
    _kind = kind or before
    try:
        yield
    finally:
        _kind = before


def process_kind() -> str:
    if _kind:
        return _kind
    # e.g. "noetl-dagster facts export" from `python -m noetl_dagster.commands.main facts export`
    program = Path(sys.argv[0] or "python").name
    if "noetl_dagster" in sys.argv[0] or program == "noetl-dagster":
        program = "noetl-dagster"
    return " ".join([program, *(a for a in sys.argv[1:3] if not a.startswith("-"))])


@dataclass(frozen=True)
class Holder:
    pid: int
    kind: str
    since: str
    endpoint: str | None = None  # http://127.0.0.1:PORT of a long-lived owner taking exports
    token: str | None = None

    def describe(self) -> str:
        return f"pid {self.pid} ({self.kind}, since {self.since})"


class StoreHeld(RuntimeError):
    """Another live process holds the embedded store."""

    def __init__(self, path: str, holder: Holder | None):
        self.path, self.holder = path, holder
        who = holder.describe() if holder else "another process (its owner file is unreadable)"
        if holder and holder.endpoint:
            hint = ("it takes exports: `facts export` and the Dagster export run hand theirs to it; stop it for"
                    " other commands, or use a ClickHouse server URL")  # fmt: skip
        else:
            hint = "wait for it to finish or stop it, or use a ClickHouse server URL"
        super().__init__(f"the embedded facts store at {path} is held by {who}; {hint}")


def owner_file(path: str | os.PathLike[str]) -> Path:
    return Path(str(Path(path)) + ".owner")


def read_holder(path: str | os.PathLike[str]) -> Holder | None:
    """The live holder of ``path`` (None: nobody holds it, or the file was left by a dead process)."""
    file = owner_file(path)
    try:
        fd = os.open(file, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            for _ in range(20):  # the holder may be (re)writing it this very moment
                holder = _parse(os.pread(fd, 65536, 0))
                if holder is not None:
                    return holder
                time.sleep(0.01)
            return Holder(0, "unknown", "?")
        fcntl.flock(fd, fcntl.LOCK_UN)  # nobody holds it: a stale file
        return None
    finally:
        os.close(fd)


def _parse(raw: bytes) -> Holder | None:
    try:
        data: dict[str, Any] = json.loads(raw)
        return Holder(int(data["pid"]), str(data["kind"]), str(data["since"]), data.get("endpoint"),
                      data.get("token"))  # fmt: skip
    except (ValueError, KeyError, TypeError):
        return None  # being written: the caller asks again


class OwnerLock:
    """This process's hold on one chdb path (the flock lives as long as the open file)."""

    def __init__(self, path: str, fd: int, holder: Holder):
        self.path, self._fd, self.holder = path, fd, holder

    @classmethod
    def try_take(cls, path: str) -> OwnerLock | None:
        file = owner_file(path)
        file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        since = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        lock = cls(path, fd, Holder(os.getpid(), process_kind(), since))
        lock._write()
        return lock

    def publish(self, endpoint: str | None, token: str | None) -> None:
        """Announce (or withdraw, with None) the endpoint that takes other processes' exports."""
        h = self.holder
        self.holder = Holder(h.pid, h.kind, h.since, endpoint, token)
        self._write()

    def _write(self) -> None:
        os.fchmod(self._fd, 0o600)  # the token in it lets its reader write facts
        raw = json.dumps({k: v for k, v in asdict(self.holder).items() if v is not None}).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, raw, 0)
        os.fsync(self._fd)

    def release(self) -> None:
        if self._fd < 0:
            return
        try:
            os.ftruncate(self._fd, 0)  # the file stays (unlinking it would race a new taker)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = -1


def take(path: str, wait_seconds: float) -> OwnerLock:
    """Hold ``path`` or raise :class:`StoreHeld`; waits for a short-lived holder (an export),
    not for one that serves (it holds the path until stopped)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        lock = OwnerLock.try_take(path)
        if lock is not None:
            return lock
        holder = read_holder(path)
        if holder is not None and (holder.endpoint or time.monotonic() >= deadline):
            raise StoreHeld(path, holder)
        if holder is None and time.monotonic() >= deadline + 5:  # let go between two reads, never ours
            raise StoreHeld(path, None)
        time.sleep(0.1)
