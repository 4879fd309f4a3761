"""Bulk paths of ``kind: postgres``: ``batch`` (one statement, many parameter sets) and ``copy``.

``batch: [params, params, …]`` with one statement in ``command`` runs ``executemany`` — psycopg
sends every parameter set in pipeline mode (one network round trip for the lot, the statement
prepared once), inside one transaction: a failing row rolls the whole batch back. The result is
``{rows, row_count, columns}`` like any call: ``row_count`` the rows affected in total, ``rows``
what a ``RETURNING`` clause returned, in order.

``copy: {table, columns, rows}`` streams ``rows`` (lists in ``columns`` order, or mappings keyed
by column name; ``columns`` defaults to the first mapping's keys) with ``COPY … FROM STDIN``
(text format, psycopg's row writer): the fastest way into a table. ``table`` may be
``schema.table``; a dict value goes in as ``jsonb``, a list as an array (as with ``params``).
One transaction.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import dict_row
from psycopg.types.json import JsonbDumper

from noetl_dagster.tools.registry import ToolError
from noetl_dagster.util.jsonutil import plain

_RETURNING = re.compile(r"\breturning\b", re.I)


def set_search_path(cur: psycopg.Cursor, schema: Any) -> None:
    """``SET LOCAL search_path`` for the running transaction (identifiers quoted)."""
    cur.execute(
        pgsql.SQL("SET LOCAL search_path TO {}").format(
            pgsql.SQL(", ").join(pgsql.Identifier(s.strip()) for s in str(schema).split(","))
        )
    )


def run_batch(conn: psycopg.Connection, statements: Sequence[str], batch: Any, schema: Any) -> dict[str, Any]:
    if len(statements) != 1:
        raise ToolError(
            f"postgres: 'batch' takes exactly one statement, got {len(statements)}", kind="config_error"
        )
    if not isinstance(batch, Sequence) or isinstance(batch, (str, bytes)):
        raise ToolError(
            f"postgres: 'batch' must be a list of params, got {type(batch).__name__}", kind="config_error"
        )
    for i, p in enumerate(batch):
        if not isinstance(p, (Mapping, list, tuple)):
            raise ToolError(
                f"postgres: batch[{i}] must be a list or a mapping, got {type(p).__name__}",
                kind="config_error",
            )
    stmt = statements[0]
    returning = bool(_RETURNING.search(stmt))
    rows: list[Any] = []
    columns: list[str] = []
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        if schema:
            set_search_path(cur, schema)
        if not batch:
            return {"rows": [], "row_count": 0, "columns": []}
        cur.executemany(stmt, batch, returning=returning)  # pipeline mode: one round trip for the lot
        affected = max(cur.rowcount, 0)
        if returning:
            affected = 0
            while True:
                if cur.description is not None:
                    columns = columns or [c.name for c in cur.description]
                    got = cur.fetchall()
                    rows.extend(got)
                    affected += len(got)
                if not cur.nextset():
                    break
    return {"rows": plain(rows), "row_count": affected, "columns": columns}


def run_copy(conn: psycopg.Connection, spec: Any, schema: Any) -> dict[str, Any]:
    if not isinstance(spec, Mapping):
        raise ToolError("postgres: 'copy' must be a mapping {table, columns, rows}", kind="config_error")
    table, rows, columns = spec.get("table"), spec.get("rows"), spec.get("columns")
    if not isinstance(table, str) or not table.strip():
        raise ToolError("postgres: 'copy.table' is required", kind="config_error")
    if rows is None:
        rows = []
    if not isinstance(rows, Sequence) or isinstance(rows, (str, bytes)):
        raise ToolError(
            f"postgres: 'copy.rows' must be a list, got {type(rows).__name__}", kind="config_error"
        )
    if columns is None and rows and isinstance(rows[0], Mapping):
        columns = list(rows[0].keys())
    if columns is not None and (not isinstance(columns, Sequence) or isinstance(columns, str)
                                or not all(isinstance(c, str) for c in columns)):  # fmt: skip
        raise ToolError("postgres: 'copy.columns' must be a list of column names", kind="config_error")
    target = pgsql.Identifier(*[p.strip() for p in table.split(".")])
    stmt = (
        pgsql.SQL("COPY {} FROM STDIN").format(target)
        if not columns
        else pgsql.SQL("COPY {} ({}) FROM STDIN").format(
            target, pgsql.SQL(", ").join(pgsql.Identifier(c) for c in columns)
        )
    )
    n = 0
    with conn.transaction(), conn.cursor() as cur:
        if schema:
            set_search_path(cur, schema)
        # a dict value goes in as jsonb: psycopg adapts it per value, no Python pass over the rows
        # (this cursor's adapters only; the pooled connection's stay as they are)
        cur.adapters.register_dumper(dict, JsonbDumper)
        with cur.copy(stmt) as copy:
            write = copy.write_row
            for row in rows:
                t = type(row)
                if t is list or t is tuple:
                    write(row)
                elif isinstance(row, Mapping):
                    if not columns:
                        raise ToolError(
                            "postgres: 'copy.columns' is required for rows of mappings", kind="config_error"
                        )
                    write([row.get(c) for c in columns])
                elif isinstance(row, (list, tuple)):
                    write(row)
                else:
                    raise ToolError(
                        f"postgres: copy.rows[{n}] must be a list or a mapping", kind="config_error"
                    )
                n += 1
    return {"rows": [], "row_count": n, "columns": []}
