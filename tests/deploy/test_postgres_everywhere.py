"""Postgres everywhere: the example project's executions through Dagster with the
instance (runs, event logs, schedules) on dagster-postgres, the NoETL EventStore
and the registry on the machine's real Postgres — one URL setting each."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import dagster as dg
import psycopg
import pytest

from noetl_dagster.resources.noetl import close_all_services
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.translator.runner import run_playbook_dagster

PG = "postgresql://postgres@127.0.0.1:5432"
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "example_project" / "playbooks"
PLAYBOOKS = ["hello_dagster", "countdown_cycle", "fanout_join", "admission_gate", "sales_tables", "customers_http",
             "score_customer", "customer_portfolio"]  # fmt: skip


@pytest.fixture
def pg_everywhere(tmp_path, monkeypatch):
    names = {k: f"nd_pg_{k}_{uuid.uuid4().hex[:8]}" for k in ("dagster", "events", "registry")}
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as c:
        for db in names.values():
            c.execute(f"CREATE DATABASE {db}")
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.postgres.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("DAGSTER_PG_URL", f"postgresql+psycopg2://postgres@127.0.0.1:5432/{names['dagster']}")
    monkeypatch.setenv("NOETL_EVENT_STORE_URL", f"{PG}/{names['events']}")
    monkeypatch.setenv("NOETL_REGISTRY_URL", f"{PG}/{names['registry']}")
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path / "noetl"))
    yield names, home
    close_all_services()
    from noetl_registry import client as registry_client  # noqa: PLC0415

    with registry_client._SHARED_LOCK:  # the shared registry holds pooled connections to the dropped DB
        for key in [k for k in registry_client._SHARED if names["registry"] in k]:
            close = getattr(registry_client._SHARED.pop(key), "close", None)
            if close:
                close()
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as c:
        for db in names.values():
            c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


@pytest.mark.slow
def test_example_executions_on_postgres_end_to_end(pg_everywhere, tmp_path):
    names, home = pg_everywhere
    instance = dg.DagsterInstance.from_config(str(home))
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
    assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
    results = {}
    try:
        for name in PLAYBOOKS:
            r = run_playbook_dagster(
                EXAMPLES / f"{name}.yaml",
                instance=instance,
                data_dir=tmp_path / "noetl",
                tenant="demo",
                project="examples",
            )  # the example location's scope
            results[name] = r
            assert r.status == "completed", (name, r.to_json())
        runs = instance.get_runs()
        tagged = {r.tags.get("noetl/execution_id") for r in runs}
        assert {r.execution_id for r in results.values()} <= tagged
        assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    finally:
        instance.dispose()

    # every execution's events are in the Postgres EventStore (the env URL), and equal a local run's summary
    with open_event_store(None) as store:
        assert type(store).__name__ == "PostgresEventStore"
        for r in results.values():
            evs = store.read(r.execution_id)
            assert evs[-1].name == "playbook.processed" and [e.sequence for e in evs] == list(
                range(1, len(evs) + 1)
            )
    local = run_playbook(
        EXAMPLES / "countdown_cycle.yaml",
        event_store=f"sqlite:///{tmp_path}/local.db",
        data_dir=tmp_path / "noetl-local",
    )
    assert local.runs == results["countdown_cycle"].runs and local.ctx == results["countdown_cycle"].ctx

    # the tables sales_tables stored are registered in the Postgres registry
    with psycopg.connect(f"{PG}/{names['registry']}") as c:
        uris = [row[0] for row in c.execute("SELECT uri FROM registry_resource").fetchall()]
    assert any("sales" in u for u in uris), uris
