"""Facts export and cost rollups in Dagster.

    defs = dg.Definitions.merge(build_playbook_definitions(...), build_facts_definitions())

- ``noetl_facts_exporter`` (sensor): tails the NoETL event log from the cursor
  stored in the facts database, exports new events as facts, and reports what
  it did as an ``AssetObservation`` of ``noetl/facts`` (events exported, lag in
  events and seconds, cursor, rows per table). One sensor is the one writer; a
  tick that dies after inserting re-sends that batch next tick without changing
  any total (the fact tables collapse rows on ``event_id``). The embedded chdb
  store is released after each tick so the CLI can open it between ticks.
- ``noetl/cost_rollups`` (asset, on ``noetl_cost_rollups_job`` and an optional
  schedule): rebuilds ``tenant_cost_fact`` with the price table.
"""

# no `from __future__ import annotations`: Dagster reads the context/resource annotations at runtime
import os
from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
from pydantic import Field

from analytics.store import FactsStore

FACTS_KEY = dg.AssetKey(["noetl", "facts"])
ROLLUPS_KEY = dg.AssetKey(["noetl", "cost_rollups"])
GROUP = "noetl_analytics"
RESOURCE_KEY = "noetl_facts"


class FactsStoreResource(dg.ConfigurableResource):
    """The ClickHouse facts store (embedded chdb by default) and the event log it is fed from."""

    clickhouse_url: str | None = Field(
        default=None, description="chdb:///dir or http(s)://host:8123; default $NOETL_CLICKHOUSE_URL or <data_dir>/facts"
    )
    database: str | None = Field(default=None, description="ClickHouse database; default noetl")
    event_store_url: str | None = Field(default=None, description="NoETL event log; default <data_dir>/events.db")
    data_dir: str | None = Field(default=None, description="default $NOETL_DAGSTER_HOME or ./.noetl")
    prices: str | None = Field(default=None, description="price table file; default analytics/prices.yaml")

    @contextmanager
    def open(self) -> Iterator[FactsStore]:
        """The store for one tick or one run; the embedded engine is released afterwards."""
        store = FactsStore(self.clickhouse_url, data_dir=self.data_dir, database=self.database)
        try:
            yield store
        finally:
            if store.embedded:
                store.release()


def facts_resource_from_env() -> FactsStoreResource:
    return FactsStoreResource(
        clickhouse_url=os.environ.get("NOETL_CLICKHOUSE_URL") or os.environ.get("NOETL_DAGSTER_CLICKHOUSE_URL") or None,
        database=os.environ.get("NOETL_DAGSTER_FACTS_DB") or None,
        event_store_url=os.environ.get("NOETL_EVENT_STORE_URL") or os.environ.get("NOETL_DAGSTER_EVENT_STORE") or None,
        data_dir=os.environ.get("NOETL_DAGSTER_HOME") or None,
        prices=os.environ.get("NOETL_DAGSTER_PRICES") or None,
    )


def export_tick(resource: FactsStoreResource, *, max_events: int, batch_events: int) -> dict[str, object]:
    """One exporter tick (the sensor body without Dagster): returns the report as a dict."""
    from analytics.exporter import FactExporter  # noqa: PLC0415
    from noetl_dagster.storage.event_stores import open_event_store

    with resource.open() as store:
        log = open_event_store(resource.event_store_url, data_dir=resource.data_dir)
        try:
            report = FactExporter(store, log, batch_events=batch_events).export(max_events=max_events)
        finally:
            log.close()
    return report.to_dict()


def build_facts_definitions(
    *,
    resource: FactsStoreResource | None = None,
    minimum_interval_seconds: int = 30,
    max_events_per_tick: int = 100_000,
    batch_events: int = 20_000,
    rollup_cron: str | None = "0 * * * *",
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.RUNNING,
) -> dg.Definitions:
    """The facts exporter sensor, the cost-rollup asset/job/schedule and their resource."""
    if max_events_per_tick <= 0 or batch_events <= 0:
        raise ValueError("max_events_per_tick and batch_events must be positive")
    resource = resource or facts_resource_from_env()

    facts_spec = dg.AssetSpec(
        FACTS_KEY,
        group_name=GROUP,
        description="NoETL event-log facts in ClickHouse (execution, step, task, frame, resource, compute).",
        kinds={"clickhouse"},
    )

    @dg.asset(
        key=ROLLUPS_KEY,
        deps=[FACTS_KEY],
        group_name=GROUP,
        kinds={"clickhouse"},
        description="tenant_cost_fact and the cost_by_tenant/project/playbook_day views, priced with the price table.",
    )
    def noetl_cost_rollups(context: dg.AssetExecutionContext, noetl_facts: FactsStoreResource) -> dg.MaterializeResult:
        from analytics.pricing import PriceTable  # noqa: PLC0415
        from analytics.rollups import refresh_rollups  # noqa: PLC0415

        prices = PriceTable.load(noetl_facts.prices, data_dir=noetl_facts.data_dir)
        with noetl_facts.open() as store:
            report = refresh_rollups(store, prices)
        context.log.info(f"tenant_cost_fact: {report.rows} rows, {report.total:.6f} {report.currency}")
        return dg.MaterializeResult(
            metadata={
                "rows": report.rows,
                "total_cost": dg.FloatMetadataValue(report.total),
                "currency": report.currency,
                "tenants": report.tenants,
                "prices": report.prices,
            }
        )

    rollups_job = dg.define_asset_job("noetl_cost_rollups_job", selection=[ROLLUPS_KEY])

    @dg.sensor(
        name="noetl_facts_exporter",
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description="Exports new NoETL events to the ClickHouse facts store (the one writer).",
    )
    def noetl_facts_exporter(context: dg.SensorEvaluationContext, noetl_facts: FactsStoreResource) -> dg.SensorResult:
        report = export_tick(noetl_facts, max_events=max_events_per_tick, batch_events=batch_events)
        rows = report["rows"]
        assert isinstance(rows, dict)
        metadata: dict[str, object] = {
            "events_exported": report["events"],
            "cursor": report["cursor_after"],
            "lag_events": report["lag_events"],
            "lag_seconds": dg.FloatMetadataValue(float(report["lag_seconds"])),  # type: ignore[arg-type]
            "seconds": dg.FloatMetadataValue(float(report["seconds"])),  # type: ignore[arg-type]
            **{f"rows_{table}": n for table, n in rows.items()},
        }
        context.log.info(
            f"exported {report['events']} events (cursor {report['cursor_before']} -> {report['cursor_after']}),"
            f" lag {report['lag_events']} events"
        )
        return dg.SensorResult(
            cursor=str(report["cursor_after"]),
            asset_events=[dg.AssetObservation(asset_key=FACTS_KEY, metadata=metadata)],
        )

    schedules = []
    if rollup_cron:
        schedules.append(
            dg.ScheduleDefinition(name="noetl_cost_rollups_schedule", job=rollups_job, cron_schedule=rollup_cron,
                                  default_status=dg.DefaultScheduleStatus.RUNNING)
        )
    return dg.Definitions(
        assets=[facts_spec, noetl_cost_rollups],
        jobs=[rollups_job],
        sensors=[noetl_facts_exporter],
        schedules=schedules,
        resources={RESOURCE_KEY: resource},
    )
