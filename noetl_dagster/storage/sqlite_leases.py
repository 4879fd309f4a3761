"""Leases of the SQLite event store: one process runs (or resumes) an execution at a time."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from typing import Any

from noetl_dagster.engine.ports import ExecutionLeased
from noetl_dagster.util.lazylog import LazyLogger
from noetl_dagster.util.procs import pid_alive

log = LazyLogger("noetl_dagster.storage")
LEASE_TTL = float(os.environ.get("NOETL_LEASE_TTL", "60"))


def _hostname() -> str:
    """``socket.gethostname()`` without importing socket (its enums cost a cached run ~1 %, issue 35):
    on POSIX gethostname(2) is uname's nodename."""
    if hasattr(os, "uname"):
        return os.uname().nodename
    import socket

    return socket.gethostname()


class SqliteLeases:
    """``acquire_lease``/``release_lease`` over the store's ``noetl_lease`` table and connection."""

    _lock: Any
    _conn: sqlite3.Connection
    _leases: dict[str, tuple[str, threading.Event]]

    def acquire_lease(self, execution_id: str) -> None:
        """A row in ``noetl_lease``: live while its holder renews it (every TTL/3) and, on this host,
        while its process exists; a holder killed with SIGKILL leaves a stale row that is taken over."""
        host, pid, now = _hostname(), os.getpid(), time.time()
        owner = f"{host}:{pid}:{id(self)}"
        with self._lock:
            c = self._conn
            c.execute("BEGIN IMMEDIATE")
            try:
                row = c.execute(
                    "SELECT owner, host, pid, expires_at FROM noetl_lease WHERE execution_id = ?",
                    (execution_id,),
                ).fetchone()
                if row and row[0] != owner:
                    same_host_dead = row[1] == host and not pid_alive(int(row[2]))
                    if not same_host_dead and row[3] > now:
                        raise ExecutionLeased(
                            f"execution {execution_id} is leased by another process (a run or resume of it is in progress)"
                            f" (pid {row[2]} on {row[1]}); its lease expires in {row[3] - now:.0f}s"
                        )
                c.execute(
                    "INSERT INTO noetl_lease (execution_id, owner, host, pid, expires_at) VALUES (?,?,?,?,?)"
                    " ON CONFLICT(execution_id) DO UPDATE SET owner = excluded.owner, host = excluded.host,"
                    " pid = excluded.pid, expires_at = excluded.expires_at",
                    (execution_id, owner, host, pid, now + LEASE_TTL),
                )
                c.execute("COMMIT")
            except BaseException:
                if c.in_transaction:
                    c.execute("ROLLBACK")
                raise
        stop = threading.Event()
        self._leases[execution_id] = (owner, stop)

        def renew() -> None:
            while not stop.wait(LEASE_TTL / 3):
                try:
                    with self._lock:
                        self._conn.execute(
                            "UPDATE noetl_lease SET expires_at = ? WHERE execution_id = ? AND owner = ?",
                            (time.time() + LEASE_TTL, execution_id, owner),
                        )
                except sqlite3.Error:
                    return

        threading.Thread(target=renew, name=f"noetl-lease-{execution_id}", daemon=True).start()

    def release_lease(self, execution_id: str) -> None:
        held = self._leases.pop(execution_id, None)
        if not held:
            return
        owner, stop = held
        stop.set()
        with self._lock:
            try:
                self._conn.execute(
                    "DELETE FROM noetl_lease WHERE execution_id = ? AND owner = ?", (execution_id, owner)
                )
            except (
                sqlite3.OperationalError
            ):  # a full disk: the row stays, and is taken over once this process is gone
                log.info("could not release the lease of execution %s", execution_id)
