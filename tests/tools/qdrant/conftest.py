"""Qdrant test fixtures: a private NOETL_DAGSTER_HOME and playbooks run by the real engine."""

from __future__ import annotations

import pytest
from qdrant_helpers import Run, playbook

from noetl_dagster.runners.local import run_playbook
from noetl_dagster.tools import qdrant as q


@pytest.fixture
def home(tmp_path, monkeypatch):
    d = tmp_path / "home"
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(d))
    return d


@pytest.fixture(autouse=True)
def _release_clients():
    """Each test's local storage paths are closed after it (one client per path per process)."""
    yield
    q.release_all()


@pytest.fixture
def run(home):
    def _run(steps, workload=None, **kw):
        return Run(run_playbook(playbook(steps, workload), data_dir=home, **kw))

    return _run
