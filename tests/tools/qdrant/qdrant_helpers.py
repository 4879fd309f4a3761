"""Helpers for the Qdrant tests (imported by conftest.py and the tests)."""

from __future__ import annotations

from typing import Any

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.storage.event_stores import open_event_store


class Run:
    def __init__(self, result):
        self.result = result
        store = open_event_store(result.event_store_url)
        try:
            self.events = store.read(result.execution_id)
        finally:
            store.close()

    @property
    def status(self) -> str:
        return self.result.status

    @property
    def results(self) -> dict[str, Any]:
        return self.result.results

    def task_done(self, step: str) -> list:
        return [e for e in self.events if e.name == "task.done" and e.step == step]

    def error(self, step: str) -> dict[str, Any]:
        """The error of the step's last task outcome."""
        return self.task_done(step)[-1].data["outcome"]["error"]


def playbook(steps: list[dict[str, Any]], workload: dict[str, Any] | None = None, name: str = "qdrant_test"):
    """A playbook whose steps run in the given order (each routes to the next)."""
    workflow = []
    for i, step in enumerate(steps):
        step = dict(step)
        if i + 1 < len(steps) and "next" not in step:
            step["next"] = {"arcs": [{"step": steps[i + 1]["step"]}]}
        workflow.append(step)
    return load_playbook_dict({
        "apiVersion": "noetl.io/v2",
        "kind": "Playbook",
        "metadata": {"name": name, "path": f"tests/tools/qdrant/{name}"},
        "workload": workload or {},
        "workflow": workflow,
    })  # fmt: skip


def qstep(step: str, **config: Any) -> dict[str, Any]:
    return {"step": step, "tool": {"kind": "qdrant", **config}}
