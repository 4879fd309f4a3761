"""The Dagster side: the exporter sensor only looks at the event log's position and
launches the export job (the chdb work runs in that run, never in the sensor tick); the
``noetl/facts`` asset exports in bounded runs with cursor and lag metadata, one writer,
releasing the embedded store after each run; the cost-rollups asset."""

from __future__ import annotations

import dagster as dg
import pytest

from noetl_analytics.store import FactsStore, close_all
from noetl_analytics.synthetic import SyntheticSpec, generate
from noetl_dagster.sensors.facts import (
    EXPORT_JOB,
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


def _export(defs, instance):
    result = defs.resolve_job_def(EXPORT_JOB).execute_in_process(instance=instance)
    assert result.success
    return result.get_asset_materialization_events()[0].materialization.metadata


def test_definitions_load_and_name_their_parts(setup):
    _, _, _, defs = setup
    dg.Definitions.validate_loadable(defs)
    assert defs.resolve_sensor_def("noetl_facts_exporter").name == "noetl_facts_exporter"
    assert defs.resolve_job_def("noetl_cost_rollups_job") is not None
    assert defs.resolve_job_def(EXPORT_JOB) is not None
    assert defs.resolve_schedule_def("noetl_cost_rollups_schedule").cron_schedule == "0 * * * *"
    keys = {spec.key for spec in defs.resolve_all_asset_specs()}
    assert {FACTS_KEY, ROLLUPS_KEY} <= keys


def test_the_sensor_launches_a_run_and_never_opens_the_facts_store(setup):
    tmp_path, log, resource, defs = setup
    with dg.instance_for_test() as instance:
        assert isinstance(_tick(defs, instance, resource), dg.SkipReason)  # empty log
        events = list(generate(SyntheticSpec(executions=2, steps=3)))
        log.append(events)
        tick = _tick(defs, instance, resource)
        (req,) = tick.run_requests
        assert req.run_key == f"facts-export-{len(events)}" and tick.cursor == str(len(events))
        assert isinstance(_tick(defs, instance, resource, tick.cursor), dg.SkipReason)  # nothing new
    assert not (tmp_path / "facts").exists()  # no chdb in the tick


def test_export_runs_are_bounded_and_report_lag(setup):
    tmp_path, log, resource, defs = setup
    events = list(generate(SyntheticSpec(executions=8, steps=3)))
    log.append(events)
    with dg.instance_for_test() as instance:
        meta = _export(defs, instance)
        assert meta["cursor"].value == 300 and meta["events_exported"].value == 300
        assert meta["lag_events"].value == len(events) - 300 and meta["lag_seconds"].value > 0
        runs = 1
        while meta["lag_events"].value:
            meta = _export(defs, instance)
            runs += 1
        assert meta["cursor"].value == len(events) and runs == -(-len(events) // 300)
        again = _export(defs, instance)  # a re-run exports nothing twice (the stored cursor rules)
        assert again["events_exported"].value == 0
    # released after every run: another client (the CLI, another process) can open the path
    close_all()
    store = FactsStore(f"chdb://{tmp_path / 'facts'}")
    assert store.scalar("SELECT count() FROM $db.execution_fact WHERE transition = 'requested'") == 8


def test_rollups_asset_materializes_cost(setup):
    _, log, resource, defs = setup
    log.append(list(generate(SyntheticSpec(executions=6, steps=3, ref_rate=1.0))))
    with dg.instance_for_test() as instance:
        _export(defs, instance)
        result = dg.materialize(
            [defs.resolve_assets_def(ROLLUPS_KEY)], instance=instance
        )  # resource bound by defs
        assert result.success
        meta = result.get_asset_materialization_events()[0].materialization.metadata
    assert meta["rows"].value > 0 and meta["total_cost"].value > 0 and meta["tenants"].value == 2


def test_rollup_job_reports_insights_metrics_and_one_asset_per_rollup_table(setup):
    from noetl_dagster.sensors.facts import ROLLUP_PREFIX, ROLLUP_TABLES

    _, log, resource, defs = setup
    log.append(list(generate(SyntheticSpec(executions=6, steps=3, ref_rate=1.0))))
    with dg.instance_for_test() as instance:
        _export(defs, instance)
        result = defs.resolve_job_def("noetl_cost_rollups_job").execute_in_process(instance=instance)
        assert result.success
        mats = {
            e.materialization.asset_key.to_user_string(): e.materialization.metadata
            for e in result.get_asset_materialization_events()
        }
    meta = mats[ROLLUPS_KEY.to_user_string()]
    # numeric keys (Dagster+ Insights custom metrics are numeric asset metadata)
    assert meta["noetl/cpu_core_hours"].value > 0 and meta["noetl/attempts"].value > 0
    assert meta["noetl/cost"].value > 0 and meta["noetl/price_version"].value == "2026-01"
    assert 0 <= meta["noetl/idle"].value <= meta["noetl/capacity_cost"].value
    for table in ROLLUP_TABLES:
        assert mats["/".join([*ROLLUP_PREFIX, table])]["rows"].value >= 0
    assert mats["/".join([*ROLLUP_PREFIX, "allocation_step_day"])]["rows"].value > 0
