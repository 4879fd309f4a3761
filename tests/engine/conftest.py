"""Helpers for the engine acceptance tests: run a playbook written inline and
look at what it did through its event log (the only record that counts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from engine_helpers import Run, dedent, read_events

from noetl_dagster.runners.local import run_playbook


@pytest.fixture
def write_pb(tmp_path):
    """Write YAML text to a file under tmp_path (relative ``name`` may include folders)."""

    def _write(text: str, name: str = "playbook.yaml", base: Path | None = None) -> Path:
        p = (base or tmp_path) / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(dedent(text), encoding="utf-8")
        return p

    return _write


@pytest.fixture
def run_pb(data_dir, write_pb):
    """Run a playbook (YAML text, a path or a Playbook) and return a :class:`Run`."""

    def _run(
        source: Any, workload: dict[str, Any] | None = None, name: str = "playbook.yaml", **kw: Any
    ) -> Run:
        if isinstance(source, str) and "\n" in source:
            source = write_pb(source, name)
        result = run_playbook(source, workload, **kw)
        return Run(result, read_events(result))

    return _run
