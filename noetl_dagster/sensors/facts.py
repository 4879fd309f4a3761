"""Facts export and cost rollups in Dagster.

    defs = dg.Definitions.merge(build_playbook_definitions(...), build_facts_definitions())

- ``noetl_facts_exporter`` (sensor): cheap; reads only the event log's newest
  position and, when it grew, launches ``noetl_facts_export_job`` (run_key = that
  position; none while an export run is in progress). The heavy work (chdb,
  ClickHouse inserts) never runs in the code server's sensor tick.
- ``noetl/facts`` (asset, on ``noetl_facts_export_job``): exports new events from
  the cursor stored in the facts database (at most ``max_events_per_tick`` per
  run) and reports events exported, lag in events and seconds, cursor and rows
  per table as materialization metadata; when a ``dashboard serve`` holds the
  embedded store, the run hands its export to it (``exported_by`` names the
  process that ran it). A run that dies after inserting
  re-sends that batch next time without changing any total (the fact tables
  collapse rows on ``event_id``). The embedded chdb store is released after
  each run so the CLI can open it in between.
- ``noetl/cost_rollups`` (asset, on ``noetl_cost_rollups_job`` and an optional
  schedule): re-prices the priced table ``cost_line_day`` with the price table.
- ``noetl_cost_budgets`` (sensor, when budgets are given): month-to-date and
  forecast cost per tenant/project against monthly budgets; a crossing logs a
  warning and launches ``noetl_budget_alert_job`` tagged with the figures
  (once per budget, month and kind), which fails when the budget says
  ``action: fail``.
"""

# no `from __future__ import annotations`: Dagster reads the context/resource annotations at runtime
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field

if TYPE_CHECKING:
    from noetl_analytics.store import FactsStore

# The store (clickhouse-connect, pyarrow: ~1 s of CPU) is imported when a tick or a run opens it,
# not when a code location loads this module (every run worker does); a missing analytics extra
# still fails the import here, so example_project/definitions.py leaves the facts out.
for _module in ("clickhouse_connect", "pyarrow"):
    if find_spec(_module) is None:
        raise ImportError(f"noetl_dagster.sensors.facts needs {_module} (the analytics extra)", name=_module)

FACTS_KEY = dg.AssetKey(["noetl", "facts"])
ROLLUPS_KEY = dg.AssetKey(["noetl", "cost_rollups"])
GROUP = "noetl_analytics"
RESOURCE_KEY = "noetl_facts"
EXPORT_JOB = "noetl_facts_export_job"
BUDGET_JOB = "noetl_budget_alert_job"
UNFINISHED = [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING,
              dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]  # fmt: skip


class FactsStoreResource(dg.ConfigurableResource):
    """The ClickHouse facts store (embedded chdb by default) and the event log it is fed from."""

    clickhouse_url: str | None = Field(
        default=None,
        description="chdb:///dir or http(s)://host:8123; default $NOETL_CLICKHOUSE_URL or <data_dir>/facts",
    )
    database: str | None = Field(default=None, description="ClickHouse database; default noetl")
    event_store_url: str | None = Field(
        default=None, description="NoETL event log; default <data_dir>/events.db"
    )
    data_dir: str | None = Field(default=None, description="default $NOETL_DAGSTER_HOME or ./.noetl")
    prices: str | None = Field(
        default=None, description="price table file; default analytics/noetl_analytics/prices.yaml"
    )
    budgets: str | None = Field(
        default=None,
        description="monthly budgets file (analytics/noetl_analytics/budgets.py); none: no budget sensor",
    )

    def on_store(self, op: str, request: dict, local: "Callable[[FactsStore], Any]") -> Any:
        """``local(store)`` here, or ``op`` in the `dashboard serve` holding the embedded store."""
        from noetl_analytics.export_handoff import on_store  # noqa: PLC0415

        return on_store(op, request, local, url=self.clickhouse_url, database=self.database,
                        data_dir=self.data_dir)  # fmt: skip

    @contextmanager
    def open(self) -> "Iterator[FactsStore]":
        """The store for one tick or one run; the embedded engine is released afterwards."""
        from noetl_analytics.store import FactsStore  # noqa: PLC0415 - see the module's imports

        store = FactsStore(self.clickhouse_url, data_dir=self.data_dir, database=self.database)
        try:
            yield store
        finally:
            if store.embedded:
                store.release()


def facts_resource_from_env() -> FactsStoreResource:
    return FactsStoreResource(
        clickhouse_url=os.environ.get("NOETL_CLICKHOUSE_URL")
        or os.environ.get("NOETL_DAGSTER_CLICKHOUSE_URL")
        or None,
        database=os.environ.get("NOETL_DAGSTER_FACTS_DB") or None,
        event_store_url=os.environ.get("NOETL_EVENT_STORE_URL")
        or os.environ.get("NOETL_DAGSTER_EVENT_STORE")
        or None,
        data_dir=os.environ.get("NOETL_DAGSTER_HOME") or None,
        prices=os.environ.get("NOETL_DAGSTER_PRICES") or None,
        budgets=os.environ.get("NOETL_DAGSTER_BUDGETS") or None,
    )


def export_tick(
    resource: FactsStoreResource, *, max_events: int, batch_events: int, kind: str | None = None
) -> dict[str, object]:
    """One exporter tick (the sensor body without Dagster): returns the report as a dict. On an embedded
    store held by a `dashboard serve`, the export runs in that process (``exported_by`` names it)."""
    from noetl_analytics.export_handoff import export_facts  # noqa: PLC0415
    from noetl_analytics.pricing import PriceTable  # noqa: PLC0415
    from noetl_analytics.store_owner import acting_as  # noqa: PLC0415

    prices = PriceTable.load(resource.prices, data_dir=resource.data_dir)
    with acting_as(kind):  # what another process's error names while this run holds the store
        return export_facts(resource.clickhouse_url, database=resource.database,
                            events_url=resource.event_store_url, data_dir=resource.data_dir, prices=prices,
                            batch_events=batch_events, max_events=max_events)  # fmt: skip


# one catalog asset per rollup table/view the dashboards read (materialized after noetl/cost_rollups)
ROLLUP_PREFIX = ["noetl", "rollups"]
ROLLUP_TABLES = {
    "cost_line_day": "The priced table every cost view reads: tenant / project / playbook / step / day / category / item.",
    "tenant_cost_fact": "View: cost_line_day per tenant / project / playbook / day / category / item.",
    "allocation_step_day": "Usage counters per tenant / project / playbook / step / day (rebuilt per day from FINAL facts).",
    "allocation_cost_day": "View: allocation_step_day priced by the price version valid on each day.",
    "storage_cost_day": "View: storage byte-hours of stored results per day, priced.",
    "allocation_summary_day": "View: allocated, unallocated, storage, capacity and idle cost per day.",
}


def insights_metadata(alloc: dict[str, object]) -> dict[str, object]:
    """Numeric metadata in the shape Dagster+ Insights custom metrics read (one numeric key each)."""
    out: dict[str, object] = {}
    for key in (
        "cpu_core_hours",
        "ram_byte_hours",
        "gpu_hours",
        "cost",
        "gpu_cost",
        "platform_cost",
        "idle",
        "unallocated",
        "capacity_cost",
    ):
        out[f"noetl/{key}"] = dg.FloatMetadataValue(float(alloc.get(key) or 0))  # type: ignore[arg-type]
    for key in ("egress_bytes", "attempts", "failed_attempts", "retries"):
        out[f"noetl/{key}"] = dg.IntMetadataValue(int(alloc.get(key) or 0))  # type: ignore[call-overload]
    out["noetl/price_version"] = str(alloc.get("price_version") or "")
    return out


def _retag_runs(context: Any, facts: FactsStoreResource, prices: Any) -> list[str]:
    """Re-tag the instance's runs priced by another table; a failure is logged, never fails the rollups."""
    from noetl_dagster.resources.run_costs import reprice_run_tags  # noqa: PLC0415
    from noetl_dagster.storage.event_stores import open_event_store  # noqa: PLC0415

    try:
        log = open_event_store(facts.event_store_url, data_dir=facts.data_dir)
        try:
            return reprice_run_tags(context.instance, log, prices)
        finally:
            log.close()
    except Exception as e:  # noqa: BLE001 - tags are informational
        context.log.warning(f"run cost tags not refreshed: {e}")
        return []


def build_facts_definitions(
    *,
    resource: FactsStoreResource | None = None,
    minimum_interval_seconds: int = 30,
    max_events_per_tick: int = 100_000,
    batch_events: int = 20_000,
    rollup_cron: str | None = "0 * * * *",
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.RUNNING,
    budget_interval_seconds: int = 300,
) -> dg.Definitions:
    """The facts exporter sensor, the cost-rollup asset/job/schedule and their resource."""
    if max_events_per_tick <= 0 or batch_events <= 0:
        raise ValueError("max_events_per_tick and batch_events must be positive")
    resource = resource or facts_resource_from_env()

    @dg.asset(
        key=ROLLUPS_KEY,
        deps=[FACTS_KEY],
        group_name=GROUP,
        kinds={"clickhouse"},
        description="cost_line_day (the priced table every cost view reads), re-priced with the price table.",
    )
    def noetl_cost_rollups(
        context: dg.AssetExecutionContext, noetl_facts: FactsStoreResource
    ) -> dg.MaterializeResult:
        from noetl_analytics.export_handoff import price_file, refresh_into  # noqa: PLC0415
        from noetl_analytics.pricing import PriceTable  # noqa: PLC0415

        prices = PriceTable.load(noetl_facts.prices, data_dir=noetl_facts.data_dir)
        request = {"prices": price_file(prices)}
        done = noetl_facts.on_store("refresh", request, lambda store: refresh_into(store, request))
        report, alloc = done["report"], done["totals"]
        context.log.info(
            f"cost_line_day: {report['rows']} cost lines, {report['total']:.6f} {report['currency']}"
        )
        if done.get("priced_before") != prices.fingerprint():  # a repricing: the runs' cost tags follow
            retagged = _retag_runs(context, noetl_facts, prices)  # (resources/run_costs.py)
            context.log.info(f"repriced: cost tags of {len(retagged)} run(s) refreshed")
        return dg.MaterializeResult(
            metadata={
                "rows": report["rows"],
                "total_cost": dg.FloatMetadataValue(float(report["total"])),
                "currency": report["currency"],
                "tenants": report["tenants"],
                "prices": report["prices"],
                **insights_metadata(alloc),
            }
        )

    @dg.multi_asset(
        specs=[
            dg.AssetSpec(
                ROLLUP_PREFIX + [t], deps=[ROLLUPS_KEY], group_name=GROUP, kinds={"clickhouse"}, description=d
            )
            for t, d in ROLLUP_TABLES.items()
        ],
        name="noetl_rollup_tables",
        can_subset=False,
    )
    def noetl_rollup_tables(context: dg.AssetExecutionContext, noetl_facts: FactsStoreResource):
        from noetl_analytics.export_handoff import query_into  # noqa: PLC0415

        counts = " UNION ALL ".join(f"SELECT '{t}', count() FROM $db.{t}" for t in ROLLUP_TABLES)
        request = {"sql": counts}
        rows = noetl_facts.on_store("query", request, lambda store: query_into(store, request))["rows"]
        for table, n in rows:
            yield dg.MaterializeResult(
                asset_key=dg.AssetKey(ROLLUP_PREFIX + [table]), metadata={"rows": int(n)}
            )

    rollups_job = dg.define_asset_job(
        "noetl_cost_rollups_job",
        selection=dg.AssetSelection.assets(ROLLUPS_KEY, *[ROLLUP_PREFIX + [t] for t in ROLLUP_TABLES]),
    )

    @dg.asset(
        key=FACTS_KEY,
        group_name=GROUP,
        kinds={"clickhouse"},
        description="NoETL event-log facts in ClickHouse (execution, step, task, frame, resource, compute). "
        "Materialized by noetl_facts_export_job, which noetl_facts_exporter launches when the log grew.",
    )
    def noetl_facts(
        context: dg.AssetExecutionContext, noetl_facts: FactsStoreResource
    ) -> dg.MaterializeResult:
        origin = context.run.remote_job_origin
        where = f", code location {origin.location_name}" if origin is not None else ""
        report = export_tick(noetl_facts, max_events=max_events_per_tick, batch_events=batch_events,
                             kind=f"Dagster run {context.run.run_id} of {EXPORT_JOB}{where}")  # fmt: skip
        rows = report["rows"]
        assert isinstance(rows, dict)
        context.log.info(
            f"exported {report['events']} events (cursor {report['cursor_before']} -> {report['cursor_after']}),"
            f" lag {report['lag_events']} events, by {report['exported_by']}"
        )
        return dg.MaterializeResult(
            metadata={
                "events_exported": report["events"],
                "cursor": report["cursor_after"],
                "lag_events": report["lag_events"],
                "lag_seconds": dg.FloatMetadataValue(float(report["lag_seconds"])),  # type: ignore[arg-type]
                "seconds": dg.FloatMetadataValue(float(report["seconds"])),  # type: ignore[arg-type]
                "exported_by": str(report["exported_by"]),
                **{f"rows_{table}": n for table, n in rows.items()},
            }
        )

    export_job = dg.define_asset_job(EXPORT_JOB, selection=[FACTS_KEY], tags={"noetl/facts": "export"})

    @dg.sensor(
        name="noetl_facts_exporter",
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        job=export_job,
        description="Launches noetl_facts_export_job when the NoETL event log grew (the export runs in its "
        "own run, never in the code server); one export run at a time.",
    )
    def noetl_facts_exporter(context: dg.SensorEvaluationContext, noetl_facts: FactsStoreResource):
        from noetl_dagster.storage.event_stores import open_event_store  # noqa: PLC0415

        log = open_event_store(noetl_facts.event_store_url, data_dir=noetl_facts.data_dir)
        try:
            last = log.tail_last()
        finally:
            log.close()
        seen = int(context.cursor or 0)
        if last <= seen:
            return dg.SkipReason(f"no new events (log at {last})")
        active = context.instance.get_run_records(
            dg.RunsFilter(job_name=EXPORT_JOB, statuses=UNFINISHED), limit=1
        )
        if active:  # the one writer: the next tick asks again
            return dg.SkipReason(
                f"export run {active[0].dagster_run.run_id} still in progress (log at {last})"
            )
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(run_key=f"facts-export-{last}", tags={"noetl/log_position": str(last)})
            ],
            cursor=str(last),
        )

    sensors = [noetl_facts_exporter]
    jobs = [rollups_job, export_job]
    if resource.budgets:
        budget_job, budget_sensor = _budget_definitions(budget_interval_seconds, default_status)
        jobs.append(budget_job)
        sensors.append(budget_sensor)
    schedules = []
    if rollup_cron:
        schedules.append(
            dg.ScheduleDefinition(
                name="noetl_cost_rollups_schedule",
                job=rollups_job,
                cron_schedule=rollup_cron,
                default_status=dg.DefaultScheduleStatus.RUNNING,
            )
        )
    return dg.Definitions(
        assets=[noetl_facts, noetl_cost_rollups, noetl_rollup_tables],
        jobs=jobs,
        sensors=sensors,
        schedules=schedules,
        resources={RESOURCE_KEY: resource},
    )


def _budget_definitions(
    interval: int, default_status: dg.DefaultSensorStatus
) -> tuple[dg.JobDefinition, dg.SensorDefinition]:
    @dg.op(name="noetl_budget_alert")
    def noetl_budget_alert(context: dg.OpExecutionContext) -> None:
        tags = context.run.tags
        message = tags.get("noetl/budget_message") or f"budget {tags.get('noetl/budget')} crossed"
        if tags.get("noetl/budget_action") == "fail":
            raise dg.Failure(
                description=message, metadata={k: v for k, v in tags.items() if k.startswith("noetl/budget")}
            )
        context.log.warning(message)

    @dg.job(name=BUDGET_JOB, tags={"noetl/facts": "budget"})
    def budget_job() -> None:
        noetl_budget_alert()

    @dg.sensor(
        name="noetl_cost_budgets",
        minimum_interval_seconds=interval,
        default_status=default_status,
        job=budget_job,
        description="Month-to-date and forecast cost per tenant/project against the monthly budgets: a crossing"
        " logs a warning and launches noetl_budget_alert_job (tagged; it fails for `action: fail`), once per"
        " budget, month and kind.",
    )
    def noetl_cost_budgets(context: dg.SensorEvaluationContext, noetl_facts: FactsStoreResource):
        from noetl_analytics.export_handoff import budgets_into  # noqa: PLC0415
        from noetl_analytics.store import FactsStoreError  # noqa: PLC0415

        budgets = noetl_facts.budgets or ""
        request = {"budgets": str(Path(budgets).resolve()) if budgets else ""}
        try:  # while a `dashboard serve` holds the embedded store, it evaluates them
            statuses = noetl_facts.on_store("budgets", request, lambda store: budgets_into(store, request))
        except FactsStoreError as e:  # an embedded store held by an export run: the next tick asks again
            return dg.SkipReason(f"facts store busy: {e}")
        requests = []
        for st in statuses:
            if st["crossed"] is None:
                continue
            context.log.warning(st["message"])
            tags = {**st["tags"], "noetl/budget_message": st["message"]}
            requests.append(
                dg.RunRequest(run_key=f"budget-{st['name']}-{st['month']}-{st['crossed']}", tags=tags)
            )
        if not requests:
            return dg.SkipReason(f"{len(statuses)} budget(s) within limits")
        return dg.SensorResult(run_requests=requests)

    return budget_job, noetl_cost_budgets
