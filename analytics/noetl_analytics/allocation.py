"""OpenCost-style allocation views over the priced table (sql/V006__one_price_path.sql).

``allocation_cost_day`` pivots ``cost_line_day`` by component next to the usage
counters of ``allocation_step_day``; ``allocation_summary_day`` reports per day
what tenants carry, what nobody carries, storage, capacity and idle. Both are
built by :mod:`noetl_analytics.rollups` from the deduplicated facts.
"""

from __future__ import annotations

from typing import Any

from noetl_analytics.pricing import PriceTable
from noetl_analytics.rollups import loaded_prices, refresh_rollups, sync_prices
from noetl_analytics.store import FactsStore


def sync_price_versions(store: FactsStore, prices: PriceTable) -> int:
    """Load the price table (every version); returns how many versions it has."""
    sync_prices(store, prices)
    return len(prices.versions)


def rebuild_allocation(store: FactsStore) -> int:
    """Rebuild the priced table and the counters with the loaded prices; returns the counters' row count."""
    refresh_rollups(store, loaded_prices(store))
    return int(store.scalar("SELECT count() FROM $db.allocation_step_day FINAL") or 0)


def allocation_totals(store: FactsStore) -> dict[str, Any]:
    """Totals over all days: usage, cost by component, idle and unallocated (for metadata and reports)."""
    _, rows = store.query(
        "SELECT sum(cpu_core_hours), sum(ram_byte_hours), sum(egress_bytes), sum(cost),"
        " sumIf(cost, tenant = '__unallocated__'), sum(attempts), sum(failed_attempts), sum(retries),"
        " any(currency), anyIf(price_version, price_version != ''), sum(shots), sum(qpu_seconds), sum(quantum_cost),"
        " sum(gpu_hours), sum(gpu_cost), sum(platform_cost), sum(idle_cost) FROM $db.allocation_cost_day"
    )
    capacity = store.scalar("SELECT sum(capacity_cost) FROM $db.allocation_summary_day")
    r = rows[0]
    return {
        "cpu_core_hours": float(r[0] or 0), "ram_byte_hours": float(r[1] or 0), "egress_bytes": int(r[2] or 0),
        "cost": float(r[3] or 0), "unallocated": float(r[4] or 0), "attempts": int(r[5] or 0),
        "failed_attempts": int(r[6] or 0), "retries": int(r[7] or 0), "currency": r[8] or "", "price_version": r[9] or "",
        "shots": int(r[10] or 0), "qpu_seconds": float(r[11] or 0), "quantum_cost": float(r[12] or 0),
        "gpu_hours": float(r[13] or 0), "gpu_cost": float(r[14] or 0), "platform_cost": float(r[15] or 0),
        "idle": float(r[16] or 0), "capacity_cost": float(capacity or 0),
    }  # fmt: skip
