"""Fixtures for the lineage tests: one event log of real executions (every example
playbook and the facts fixtures: offloaded results, a registry table written and
read, a loop, a failing playbook), for two tenants; and the offline validator."""

from __future__ import annotations

from pathlib import Path

import pytest

from noetl_dagster.commands.facts_demo import example_playbooks, run_playbooks
from noetl_dagster.storage.events import SqliteEventStore
from noetl_lineage.validate import LineageValidator

FIXTURES = Path(__file__).resolve().parents[1] / "analytics" / "playbooks"
TENANTS = (("acme", "sales"),)  # one tenant is enough here; the facts tests cover two


@pytest.fixture(scope="session")
def validator():
    return LineageValidator()


@pytest.fixture(scope="session")
def lineage_runs(tmp_path_factory):
    """(data_dir, events in append order, run results)."""
    data_dir = tmp_path_factory.mktemp("lineage_runs")
    log = SqliteEventStore(data_dir / "events.db")
    results = run_playbooks(
        example_playbooks() + sorted(FIXTURES.glob("*.yaml")), data_dir, tenants=TENANTS, event_store=log
    )
    errors = [(p.name, r) for p, _, _, r in results if isinstance(r, Exception)]
    assert not errors, errors
    events = [s.event for s in log.iter_all()]
    log.close()
    return data_dir, events, results
