"""Replay: rebuild an execution's state from its events alone."""

from __future__ import annotations

from typing import Any

from noetl_dagster.engine.ports import EventStore, ResultOffloader
from noetl_dagster.engine.state import ExecutionState, fold
from noetl_dagster.util.jsonutil import plain


def replay(store: EventStore, execution_id: str, offloader: ResultOffloader | None = None) -> ExecutionState:
    events = store.read(execution_id)
    if not events:
        raise KeyError(f"no events for execution {execution_id}")
    return fold(events, offloader.resolve if offloader else None)


def diff_snapshots(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """Keys whose values differ after a JSON round trip (what the log can carry)."""
    e, a = plain(expected), plain(actual)
    return [k for k in sorted(set(e) | set(a)) if e.get(k) != a.get(k)]


def verify(store: EventStore, execution_id: str, expected: dict[str, Any]) -> list[str]:
    """Replay ``execution_id`` and list the state keys that differ from ``expected``."""
    return diff_snapshots(expected, replay(store, execution_id).snapshot())
