"""Helpers for the engine acceptance tests: run a playbook written inline and
look at what it did through its event log (the only record that counts)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from noetl_dagster.engine.events import Event
from noetl_dagster.engine.runner import ExecutionResult, run_playbook
from noetl_dagster.storage.events import open_event_store


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


@pytest.fixture
def write_pb(tmp_path):
    """Write YAML text to a file under tmp_path (relative ``name`` may include folders)."""

    def _write(text: str, name: str = "playbook.yaml", base: Path | None = None) -> Path:
        p = (base or tmp_path) / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(dedent(text), encoding="utf-8")
        return p

    return _write


def read_events(result: ExecutionResult) -> list[Event]:
    store = open_event_store(result.event_store_url)
    try:
        return store.read(result.execution_id)
    finally:
        store.close()


@pytest.fixture
def run_pb(data_dir, write_pb):
    """Run a playbook (YAML text, a path or a Playbook) and return a :class:`Run`."""

    def _run(source: Any, workload: dict[str, Any] | None = None, name: str = "playbook.yaml", **kw: Any) -> Run:
        if isinstance(source, str) and "\n" in source:
            source = write_pb(source, name)
        result = run_playbook(source, workload, **kw)
        return Run(result, read_events(result))

    return _run
