"""The Dagster side: the exporter sensor (cursor, lag metadata, one writer that
releases the embedded store between ticks) and the cost-rollups asset."""

from __future__ import annotations

import dagster as dg
import pytest

from analytics.store import FactsStore, close_all
from analytics.synthetic import SyntheticSpec, generate
from noetl_dagster.sensors.facts import (
    FACTS_KEY,
    RESOURCE_KEY,
    ROLLUPS_KEY,
    FactsStoreResource,
    build_facts_definitions,
)
from noetl_dagster.storage.events import SqliteEventStore


@pytest.fixture
def setup(tmp_path):
    log = SqliteEventStore(tmp_path / "events.db")
    resource = FactsStoreResource(data_dir=str(tmp_path))
    defs = build_facts_definitions(resource=resource, max_events_per_tick=300, batch_events=100)
    yield tmp_path, log, resource, defs
    log.close()
    close_all()


def _tick(defs, instance, resource, cursor=None):
    sensor = defs.resolve_sensor_def("noetl_facts_exporter")
    ctx = dg.build_sensor_context(instance=instance, resources={RESOURCE_KEY: resource}, cursor=cursor)
    return sensor(ctx)


def test_definitions_load_and_name_their_parts(setup):
    _, _, _, defs = setup
    dg.Definitions.validate_loadable(defs)
    assert defs.resolve_sensor_def("noetl_facts_exporter").name == "noetl_facts_exporter"
    assert defs.resolve_job_def("noetl_cost_rollups_job") is not None
    assert defs.resolve_schedule_def("noetl_cost_rollups_schedule").cron_schedule == "0 * * * *"
    keys = {spec.key for spec in defs.resolve_all_asset_specs()}
    assert {FACTS_KEY, ROLLUPS_KEY} <= keys


def test_sensor_exports_in_bounded_ticks_and_reports_lag(setup):
    tmp_path, log, resource, defs = setup
    events = list(generate(SyntheticSpec(executions=8, steps=3)))
    log.append(events)
    with dg.instance_for_test() as instance:
        first = _tick(defs, instance, resource)
        meta = first.asset_events[0].metadata
        assert first.cursor == "300" and meta["events_exported"].value == 300
        assert meta["lag_events"].value == len(events) - 300 and meta["lag_seconds"].value > 0
        cursor, ticks = first.cursor, 1
        while True:
            result = _tick(defs, instance, resource, cursor)
            ticks += 1
            cursor = result.cursor
            if result.asset_events[0].metadata["lag_events"].value == 0:
                break
        assert int(cursor) == len(events) and ticks == -(-len(events) // 300)
    # released after every tick: another client (the CLI, another process) can open the path
    close_all()
    store = FactsStore(f"chdb://{tmp_path / 'facts'}")
    assert store.scalar("SELECT count() FROM $db.execution_fact WHERE transition = 'requested'") == 8


def test_a_lost_dagster_cursor_does_not_double_count(setup):
    _, log, resource, defs = setup
    log.append(list(generate(SyntheticSpec(executions=4, steps=3))))
    with dg.instance_for_test() as instance:
        _tick(defs, instance, resource)
        again = _tick(defs, instance, resource, cursor=None)  # Dagster's cursor reset: the stored one rules
    assert again.asset_events[0].metadata["events_exported"].value == 0


def test_rollups_asset_materializes_cost(setup):
    _, log, resource, defs = setup
    log.append(list(generate(SyntheticSpec(executions=6, steps=3, ref_rate=1.0))))
    with dg.instance_for_test() as instance:
        _tick(defs, instance, resource)
        result = dg.materialize([defs.resolve_assets_def(ROLLUPS_KEY)], instance=instance)  # resource bound by defs
        assert result.success
        meta = result.get_asset_materialization_events()[0].materialization.metadata
    assert meta["rows"].value > 0 and meta["total_cost"].value > 0 and meta["tenants"].value == 2
