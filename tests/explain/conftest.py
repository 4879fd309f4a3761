"""Real executions for explain / diff (issue 36): local runs into a SQLite event store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from noetl_dagster.commands.main import cli
from noetl_dagster.runners.local import run_playbook

PLAYBOOKS = Path(__file__).parent / "playbooks"


@pytest.fixture
def home(tmp_path, monkeypatch):
    d = tmp_path / "noetl"
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(d))
    return d


@pytest.fixture
def run(home):
    def _run(name: str | Path, workload: dict[str, Any] | None = None, **kw: Any) -> str:
        path = name if isinstance(name, Path) else PLAYBOOKS / name
        return run_playbook(path, workload, **kw).execution_id

    return _run


@pytest.fixture
def noetl(home):
    def _cli(*args: str) -> Any:
        return CliRunner().invoke(cli, [*args, "--data-dir", str(home)], catch_exceptions=False)

    return _cli
