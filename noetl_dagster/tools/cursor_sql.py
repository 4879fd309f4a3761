"""``loop.cursor`` drivers over SQL: postgres (shared queue tables) and duckdb (one process at a time).

The claim is the author's statement, as in NoETL: typically an ``UPDATE ... WHERE id IN (SELECT ...
FOR UPDATE SKIP LOCKED LIMIT {{ cursor.max_rows }}) RETURNING ...`` run in autocommit, so several
executions share one queue table and never get the same row. The statement is a template with
``cursor.owner`` (stable across resume), ``cursor.max_rows`` and ``cursor.lease_seconds``; a claim
that also takes rows still held by ``cursor.owner`` or whose lease ran out makes the loop resumable
after kill -9 (docs/dsl.md "Cursor loops"). Options:

* ``key``: the column naming a row (default ``id``; resume recognises finished rows by it)
* ``ack``: statement run once a row's iteration is recorded, bound to the row (``%(id)s`` /
  ``$id``); without it the claim itself must make rows done
* ``fail``: statement run when a row's iteration failed (e.g. back to pending, attempts + 1)
* ``heartbeat``: statement extending the lease, bound to ``keys`` (a list) and ``owner``
* ``database`` (duckdb): the database file
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from noetl_dagster.engine.ports import CursorRequest, CursorRow, CursorSource
from noetl_dagster.tools.registry import ToolError
from noetl_dagster.util.extras import require


class _SqlCursor(CursorSource):
    kind = "sql"

    def __init__(self, req: CursorRequest):
        self.req = req
        self.opts = dict(req.options or {})
        self.key_col = str(self.opts.get("key") or "id")
        self._lock = threading.Lock()  # the slot and its heartbeat share one connection

    # the dialect: run one statement, rows as dicts
    def _run(self, sql: str, params: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _key(self, row: Mapping[str, Any]) -> str:
        if self.key_col in row:
            return str(row[self.key_col])
        return json.dumps(row, sort_keys=True, default=str)

    def claim(self, max_rows: int) -> list[CursorRow]:
        with self._lock:
            rows = self._run(self.req.claim, None)
        # every returned row is claimed (the statement holds the LIMIT): none may be dropped
        return [CursorRow(self._key(r), r) for r in rows]

    def ack(self, rows: Sequence[CursorRow]) -> None:
        self._each(self.opts.get("ack"), rows)

    def fail(self, rows: Sequence[CursorRow], error: Mapping[str, Any] | None) -> None:
        self._each(self.opts.get("fail"), rows)

    def heartbeat(self, rows: Sequence[CursorRow]) -> None:
        sql = self.opts.get("heartbeat")
        if sql:
            keys = [r.value.get(self.key_col) for r in rows if isinstance(r.value, Mapping)]
            with self._lock:
                self._run(str(sql), {"keys": keys, "owner": self.req.owner})

    def _each(self, sql: Any, rows: Sequence[CursorRow]) -> None:
        if not sql:
            return
        with self._lock:
            for r in rows:
                params = dict(r.value) if isinstance(r.value, Mapping) else {"value": r.value}
                self._run(str(sql), {**params, "owner": self.req.owner})


class PostgresCursor(_SqlCursor):
    kind = "postgres"

    def __init__(self, req: CursorRequest):
        super().__init__(req)
        import psycopg
        from psycopg.rows import dict_row

        from noetl_dagster.tools.postgres import conninfo_from

        auth = req.auth or self.opts.get("dsn") or self.opts.get("connection_string")
        conninfo, self.label = conninfo_from(auth, _CredentialsOnly(req))
        try:
            self._conn = psycopg.connect(conninfo, autocommit=True, row_factory=dict_row, connect_timeout=10)
        except psycopg.Error as e:
            raise ToolError(
                f"cursor postgres ({self.label}): cannot connect: {e}", kind="connection_error"
            ) from None
        self._psycopg = psycopg

    def _run(self, sql: str, params: Any) -> list[dict[str, Any]]:
        try:
            with self._conn.cursor() as cur:
                cur.execute(sql, _only_used(sql, params, "%({})s"), prepare=False)
                return [dict(r) for r in cur.fetchall()] if cur.description else []
        except self._psycopg.Error as e:
            raise ToolError(
                f"cursor postgres ({self.label}): {type(e).__name__}: {e}".strip(), kind="cursor_error"
            ) from None

    def close(self) -> None:
        self._conn.close()


class DuckdbCursor(_SqlCursor):
    kind = "duckdb"

    def __init__(self, req: CursorRequest):
        super().__init__(req)
        duckdb = require("duckdb", "a DuckDB cursor")

        from noetl_dagster.tools.duckdb_tool import connect

        db = self.opts.get("database") or self.opts.get("path") or req.auth or ":memory:"
        base = req.sandbox_dir or req.base_dir  # a generated playbook's files are in its own directory
        if db != ":memory:" and not Path(str(db)).is_absolute() and base:
            db = str(Path(base) / str(db))
        if req.sandbox_dir:
            Path(req.sandbox_dir).mkdir(parents=True, exist_ok=True)
        self._duckdb = duckdb
        try:
            self._conn = connect(str(db), req.sandbox_dir)
        except duckdb.Error as e:
            raise ToolError(f"cursor duckdb: cannot open {db}: {e}", kind="connection_error") from None

    def _run(self, sql: str, params: Any) -> list[dict[str, Any]]:
        try:
            cur = self._conn.execute(sql, _only_used(sql, params, "${}"))
            if cur.description is None:
                return []
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]
        except self._duckdb.Error as e:
            raise ToolError(f"cursor duckdb: {type(e).__name__}: {e}", kind="cursor_error") from None

    def close(self) -> None:
        self._conn.close()


def _only_used(sql: str, params: Any, style: str) -> Any:
    """Bind only the parameters the statement names (drivers reject unused named parameters)."""
    if not isinstance(params, Mapping):
        return params
    used = {k: v for k, v in params.items() if style.format(k) in sql}
    return used or None


class _CredentialsOnly:
    """The slice of ToolContext that ``conninfo_from`` needs."""

    def __init__(self, req: CursorRequest):
        self._req = req

    def credential(self, name: str) -> dict[str, Any]:
        return self._req.credential(name)

    def redact(self, value: str) -> None:  # named credentials are redacted by the keychain
        pass
