"""Fixtures for the facts tests: a chdb facts store per test (chdb hosts one
engine per process, so each test releases it), and one event log of real
executions (the example playbooks + this folder's playbooks, two tenants)."""

from __future__ import annotations

from pathlib import Path

import pytest

from noetl_analytics.store import FactsStore, close_all
from noetl_dagster.commands.facts_demo import example_playbooks, run_playbooks
from noetl_dagster.storage.events import SqliteEventStore

HERE = Path(__file__).parent
TENANTS = (("acme", "sales"), ("globex", "research"))


@pytest.fixture
def facts_store(tmp_path):
    store = FactsStore(f"chdb://{tmp_path / 'facts'}")
    yield store
    close_all()


@pytest.fixture(scope="session")
def real_runs(tmp_path_factory):
    """(data_dir, event log URL, run results) for every example playbook and the fixtures here."""
    data_dir = tmp_path_factory.mktemp("facts_runs")
    log = SqliteEventStore(data_dir / "events.db")
    playbooks = example_playbooks() + sorted((HERE / "playbooks").glob("*.yaml"))
    results = run_playbooks(playbooks, data_dir, tenants=TENANTS, event_store=log)
    errors = [(p.name, r) for p, _, _, r in results if isinstance(r, Exception)]
    assert not errors, errors
    url = log.url
    log.close()
    return data_dir, url, results
