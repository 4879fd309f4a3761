"""The ``loop.cursor`` drivers by kind (``Services.cursor_sources``); each imports its client lazily."""

from __future__ import annotations

from noetl_dagster.engine.ports import CursorOpener, CursorRequest, CursorSource


def _postgres(req: CursorRequest) -> CursorSource:
    from noetl_dagster.tools.cursor_sql import PostgresCursor

    return PostgresCursor(req)


def _duckdb(req: CursorRequest) -> CursorSource:
    from noetl_dagster.tools.cursor_sql import DuckdbCursor

    return DuckdbCursor(req)


def _nats_stream(req: CursorRequest) -> CursorSource:
    from noetl_dagster.tools.cursor_nats import NatsStreamCursor

    return NatsStreamCursor(req)


def default_cursor_sources() -> dict[str, CursorOpener]:
    return {"postgres": _postgres, "duckdb": _duckdb, "nats_stream": _nats_stream}
