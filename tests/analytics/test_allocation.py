"""Allocation from measured usage (issue 18.2) on real runs: the exporter rebuilds the usage counters of
the days it exported from the deduplicated facts, a full rebuild agrees with it, the versioned price
table prices each day by its own version, idle and unallocated are reported."""

from __future__ import annotations

import pytest

from noetl_analytics.allocation import allocation_totals, rebuild_allocation, sync_price_versions
from noetl_analytics.exporter import FactExporter
from noetl_analytics.pricing import PriceConfigError, PriceTable
from noetl_analytics.rollups import refresh_rollups
from noetl_dagster.storage.events import SqliteEventStore

SUMS = "SELECT sum(attempts), round(sum(cpu_core_hours), 9), sum(egress_bytes), sum(bytes_written) FROM $db.allocation_step_day"


@pytest.fixture
def exported(real_runs, facts_store):
    _, url, _ = real_runs
    log = SqliteEventStore(url.removeprefix("sqlite:///"))
    try:
        FactExporter(facts_store, log).export()
    finally:
        log.close()
    return facts_store


def test_usage_lands_in_task_fact_and_the_rollup(exported):
    store = exported
    _, rows = store.query(
        "SELECT count(), countIf(cpu_ms > 0), countIf(playbook != ''), sum(bytes_written) FROM $db.task_fact"
    )
    attempts, with_cpu, with_playbook, written = rows[0]
    assert attempts > 10 and with_cpu == attempts and with_playbook == attempts
    assert written > 0  # offloaded results were measured
    _, mv = store.query(SUMS)
    assert mv[0][0] == attempts
    rebuild_allocation(store)
    _, exact = store.query(SUMS)
    assert exact == mv  # the per-batch rebuild and the full rebuild agree


def test_versioned_prices_idle_and_unallocated(exported):
    store = exported
    _, days = store.query("SELECT min(toDate(ts)), max(toDate(ts)) FROM $db.task_fact")
    day = days[0][1]
    prices = PriceTable.from_dict(
        {
            "currency": "EUR",
            "allocation": [
                {"version": "old", "valid_from": "2000-01-01", "cpu_core_hour": 1.0, "capacity_cores": 1},
                {
                    "version": "new",
                    "valid_from": str(day),
                    "cpu_core_hour": 10.0,
                    "capacity_cores": 1,
                    "storage_gb_month": 1.0,
                },
            ],
        }
    )
    refresh_rollups(store, prices)
    _, rows = store.query(
        "SELECT price_version, round(sum(cpu_cost) / sum(cpu_core_hours), 6) FROM $db.allocation_cost_day"
        " WHERE cpu_core_hours > 0 AND day = {d:Date} GROUP BY price_version",
        {"d": day},
    )
    assert rows == [("new", 10.0)]
    totals = allocation_totals(store)
    assert totals["currency"] == "EUR" and totals["cost"] > 0
    # one provisioned core for a day costs 240; the runs used far less: almost all of it is idle
    assert 0 < totals["idle"] <= totals["capacity_cost"]
    assert totals["unallocated"] == 0  # every run had a tenant
    assert sync_price_versions(store, prices) == 2
    # stored results are billed once, at creation, per GB-month
    _, st = store.query(
        "SELECT sum(gb_months), sum(cost) FROM $db.storage_cost_day WHERE day = {d:Date}", {"d": day}
    )
    assert st[0][0] > 0 and st[0][1] == pytest.approx(st[0][0] * 1.0)
    _, summary = store.query(
        "SELECT storage_cost FROM $db.allocation_summary_day WHERE day = {d:Date}", {"d": day}
    )
    assert summary[0][0] == pytest.approx(st[0][1])


def test_bad_allocation_prices_are_one_line_errors():
    with pytest.raises(PriceConfigError, match=r"versions\[0\]: cpu_core_hour must be a non-negative number"):
        PriceTable.from_dict({"allocation": {"cpu_core_hour": -1}})
    with pytest.raises(PriceConfigError, match="valid_from must be a date"):
        PriceTable.from_dict({"allocation": [{"valid_from": "soon"}]})
