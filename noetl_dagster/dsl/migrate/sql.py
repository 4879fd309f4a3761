"""SQL text the storage rules need: counting statements (legacy postgres results were keyed per
statement) and the INSERT / upsert statement a postgres or duckdb ``save`` / ``sink`` becomes."""

from __future__ import annotations

from typing import Any

from noetl_dagster.util.sql import split_sql

from .constants import _IDENT
from .report import _Refuse


def _count_statements(sql: str) -> int:
    """Statements in a SQL text (top-level `;`, quotes and comments respected)."""
    return len(split_sql(sql)) or 1


def _insert_sql(table: str, cols: list[Any], mode: str, keys: Any, kind: str, s: Any, key: str) -> str:
    names = [str(c) for c in cols]
    bad = [c for c in names if not _IDENT.match(c)]
    if bad:
        raise _Refuse(f"sink columns {bad} are not plain names", s, key)
    if mode not in ("insert", "append", "upsert", "merge"):
        raise _Refuse(f"sink mode {mode!r} has no counterpart (insert / upsert)", s, key)
    ph = [f"%({c})s" if kind == "postgres" else f"${c}" for c in names]
    sql = f"INSERT INTO {table} ({', '.join(names)})\nVALUES ({', '.join(ph)})"
    if mode in ("upsert", "merge"):
        key_list = [str(k) for k in (keys if isinstance(keys, list) else [keys])] if keys else []
        if not key_list:
            raise _Refuse("an upsert sink without `key`", s, key)
        if any(not _IDENT.match(k) for k in key_list):
            raise _Refuse(f"sink keys {key_list} are not plain names", s, key)
        rest = [c for c in names if c not in key_list]
        if rest:
            sets = ",\n  ".join(f"{c} = EXCLUDED.{c}" for c in rest)
            sql += f"\nON CONFLICT ({', '.join(key_list)}) DO UPDATE SET\n  {sets}"
        else:
            sql += f"\nON CONFLICT ({', '.join(key_list)}) DO NOTHING"
    return sql + ";\n"
