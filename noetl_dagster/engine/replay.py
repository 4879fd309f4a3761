"""Replay: rebuild an execution's state from its events alone, once its hash chain verifies."""

from __future__ import annotations

from typing import Any

from noetl_dagster.engine.chain import ChainReport, check_chain
from noetl_dagster.engine.events import Event
from noetl_dagster.engine.ports import EventStore, ResultOffloader
from noetl_dagster.engine.state import ExecutionState, fold
from noetl_dagster.util.jsonutil import plain


def verify_chain(store: EventStore, execution_id: str) -> tuple[ChainReport, list[Event]]:
    """The execution's chain as stored (engine/chain.py) and its events; KeyError if it has none."""
    entries = store.read_chained(execution_id)
    if not entries:
        raise KeyError(f"no events for execution {execution_id}")
    return check_chain(execution_id, entries), [e for _s, e, _h in entries if e is not None]


def verified_events(store: EventStore, execution_id: str) -> list[Event]:
    """The execution's events, refused (ChainBroken, naming the first bad sequence) when its log was
    altered: every replay and resume reads through here."""
    report, events = verify_chain(store, execution_id)
    report.raise_if_broken()
    return events


def replay(store: EventStore, execution_id: str, offloader: ResultOffloader | None = None) -> ExecutionState:
    return fold(verified_events(store, execution_id), offloader.resolve if offloader else None)


def diff_snapshots(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """Keys whose values differ after a JSON round trip (what the log can carry)."""
    e, a = plain(expected), plain(actual)
    return [k for k in sorted(set(e) | set(a)) if e.get(k) != a.get(k)]


def verify(store: EventStore, execution_id: str, expected: dict[str, Any]) -> list[str]:
    """Replay ``execution_id`` and list the state keys that differ from ``expected``."""
    return diff_snapshots(expected, replay(store, execution_id).snapshot())
