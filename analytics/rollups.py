"""Refresh the tenant-cost rollups.

``refresh_rollups`` loads the price table into ClickHouse, rebuilds
``tenant_cost_fact`` from the priced ``cost_lines`` view into a staging table
and swaps it in with ``EXCHANGE TABLES`` (readers never see a half-built
table). The views ``cost_by_tenant_day`` / ``cost_by_project_day`` /
``cost_by_playbook_day`` read the swapped-in table.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from analytics.allocation import rebuild_allocation, sync_price_versions
from analytics.pricing import PriceTable
from analytics.store import FactsStore

_COST_COLUMNS = (
    "tenant_id, project_id, playbook, day, category, item, unit, quantity, unit_price, amount, currency, refreshed_at"
)


@dataclass(frozen=True)
class RollupReport:
    rows: int
    total: float
    currency: str
    tenants: int
    refreshed_at: datetime
    prices: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "total": round(self.total, 6),
            "currency": self.currency,
            "tenants": self.tenants,
            "refreshed_at": self.refreshed_at.isoformat(),
            "prices": self.prices,
        }


def sync_prices(store: FactsStore, prices: PriceTable) -> None:
    store.command("TRUNCATE TABLE $db.price")
    store.insert_rows("price", prices.rows(), ["category", "item", "unit", "price", "multiplier", "currency"])
    store.command("TRUNCATE TABLE $db.worker_class_map")
    store.insert_rows(
        "worker_class_map", sorted([k, v] for k, v in prices.worker_class_by_kind.items()), ["kind", "worker_class"]
    )


def refresh_rollups(store: FactsStore, prices: PriceTable | None = None) -> RollupReport:
    prices = prices or PriceTable.load()
    sync_prices(store, prices)
    now = datetime.now(UTC)
    store.command("CREATE TABLE IF NOT EXISTS $db.tenant_cost_fact_next AS $db.tenant_cost_fact")
    store.command("TRUNCATE TABLE $db.tenant_cost_fact_next")
    store.command(
        f"INSERT INTO $db.tenant_cost_fact_next ({_COST_COLUMNS})"
        " SELECT tenant_id, project_id, playbook, day, category, item, unit, quantity, unit_price, amount,"
        " if(currency = '', {currency:String}, currency), {now:DateTime64(6, 'UTC')} FROM $db.cost_lines",
        {"currency": prices.currency, "now": now},
    )
    store.command("EXCHANGE TABLES $db.tenant_cost_fact AND $db.tenant_cost_fact_next")
    store.command("TRUNCATE TABLE $db.tenant_cost_fact_next")
    sync_price_versions(store, prices)
    rebuild_allocation(store)
    _, rows = store.query("SELECT count(), sum(amount), uniqExact(tenant_id) FROM $db.tenant_cost_fact")
    count, total, tenants = rows[0]
    return RollupReport(int(count), float(total or 0.0), prices.currency, int(tenants), now, prices.source)
