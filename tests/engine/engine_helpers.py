"""Shared helpers for the engine tests (imported by conftest.py and the tests)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from noetl_dagster.engine.events import Event
from noetl_dagster.runners.local import ExecutionResult
from noetl_dagster.storage.event_stores import open_event_store


@dataclass
class Run:
    result: ExecutionResult
    events: list[Event]

    @property
    def status(self) -> str:
        return self.result.status

    @property
    def ctx(self) -> dict[str, Any]:
        return self.result.ctx

    @property
    def results(self) -> dict[str, Any]:
        return self.result.results

    @property
    def runs(self) -> dict[str, int]:
        return self.result.runs

    def named(self, name: str, step: str | None = None) -> list[Event]:
        return [e for e in self.events if e.name == name and (step is None or e.step == step)]

    def started_steps(self) -> list[str]:
        """Steps in the order they started (one entry per activation)."""
        return [e.step for e in self.events if e.name == "step.started"]

    def index(self, name: str, step: str) -> list[int]:
        return [i for i, e in enumerate(self.events) if e.name == name and e.step == step]

    def task_done(self, step: str, task: str | None = None) -> list[Event]:
        return [e for e in self.named("task.done", step) if task is None or e.data.get("task") == task]


def ts(ev: Event) -> float:
    return datetime.fromisoformat(ev.timestamp).timestamp()


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def read_events(result: ExecutionResult) -> list[Event]:
    store = open_event_store(result.event_store_url)
    try:
        return store.read(result.execution_id)
    finally:
        store.close()
