"""Execution leases on Postgres, shared by the Postgres event store and the NATS store's projection
database: a session advisory lock per execution, each on a connection of its own, so the server
drops a lease when its holder's connection goes away (a resume killed with SIGKILL leaves none)."""

from __future__ import annotations

import zlib

import psycopg

from noetl_dagster.engine.ports import ExecutionLeased


def lock_key(schema: str, purpose: str) -> int:
    # advisory lock keys are bigint; a stable 32-bit hash of schema + purpose is enough
    return zlib.crc32(f"noetl:{schema}:{purpose}".encode())


class AdvisoryLeases:
    def __init__(self, conninfo: str, schema: str):
        self._conninfo = conninfo
        self._schema = schema
        self._held: dict[str, psycopg.Connection] = {}

    def acquire(self, execution_id: str) -> None:
        conn = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=10)
        got = conn.execute(
            "SELECT pg_try_advisory_lock(%s)", (lock_key(self._schema, f"lease:{execution_id}"),)
        ).fetchone()
        if not (got and got[0]):
            conn.close()
            raise ExecutionLeased(
                f"execution {execution_id} is leased by another process (a run or resume of it is in progress)"
            )
        self._held[execution_id] = conn

    def release(self, execution_id: str) -> None:
        conn = self._held.pop(execution_id, None)
        if conn is not None:
            conn.close()

    def release_all(self) -> None:
        for execution_id in list(self._held):
            self.release(execution_id)
