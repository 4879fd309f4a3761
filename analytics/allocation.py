"""OpenCost-style allocation from measured usage (sql/V003__allocation.sql).

``allocation_step_day`` (AggregatingMergeTree) is filled by a materialized view
as task facts arrive. Its playbook comes from the exporter's memory of the
execution's request; :func:`rebuild_allocation` recomputes the rollup exactly
from the deduplicated facts (``FINAL``, playbook from ``execution_dim``) into a
staging table and swaps it in — run by ``facts refresh``, since a batch the
exporter re-sends after a crash reaches the view twice.
"""

from __future__ import annotations

from typing import Any

from analytics.pricing import ALLOCATION_PRICES, PriceTable
from analytics.store import FactsStore

_ROLLUP_SELECT = """
SELECT _t.tenant_id, _t.project_id, if(_dim.playbook != '', _dim.playbook, _t.playbook) AS playbook, _t.step,
       toDate(_t.ts) AS day,
       toUInt64(count()), toUInt64(countIf(_t.status = 'error')), toUInt64(countIf(_t.attempt > 1)),
       sum(coalesce(_t.cpu_ms, _t.duration_ms * _t.units)) / 3.6e6, sum(_t.mem_bytes * _t.duration_ms) / 3.6e6,
       sum(_t.duration_ms) / 3.6e6, sum(_t.egress_bytes), sum(_t.net_in_bytes), sum(_t.net_out_bytes),
       sum(_t.bytes_read), sum(_t.bytes_written), sum(_t.rows_moved), sum(_t.shots), sum(_t.qpu_seconds),
       uniqState(_t.execution_id), quantilesTDigestState(0.5, 0.9, 0.99)(_t.duration_ms)
FROM $db.task_fact AS _t FINAL
LEFT JOIN $db.execution_dim AS _dim ON _dim.execution_id = _t.execution_id
GROUP BY _t.tenant_id, _t.project_id, playbook, _t.step, day
"""


def sync_price_versions(store: FactsStore, prices: PriceTable) -> int:
    """Load the price table's allocation versions (replacing what was loaded before)."""
    store.command("TRUNCATE TABLE $db.price_version")
    cols = ["version", "valid_from", "currency", *ALLOCATION_PRICES]
    rows = [
        [v["version"], v["valid_from"], prices.currency, *(v[k] for k in ALLOCATION_PRICES)]
        for v in prices.allocation
    ]
    if rows:
        store.insert_rows("price_version", rows, cols)
    return len(rows)


def rebuild_allocation(store: FactsStore) -> int:
    """Recompute ``allocation_step_day`` from the deduplicated facts; returns its row count."""
    store.command("CREATE TABLE IF NOT EXISTS $db.allocation_step_day_next AS $db.allocation_step_day")
    store.command("TRUNCATE TABLE $db.allocation_step_day_next")
    store.command("INSERT INTO $db.allocation_step_day_next " + _ROLLUP_SELECT)
    store.command("EXCHANGE TABLES $db.allocation_step_day AND $db.allocation_step_day_next")
    store.command("TRUNCATE TABLE $db.allocation_step_day_next")
    _, rows = store.query("SELECT count() FROM $db.allocation_step_day")
    return int(rows[0][0])


def allocation_totals(store: FactsStore) -> dict[str, Any]:
    """Totals over all days: usage, cost by component, idle and unallocated (for metadata and reports)."""
    cols, rows = store.query(
        "SELECT sum(cpu_core_hours), sum(ram_byte_hours), sum(egress_bytes), sum(cost), sumIf(cost, tenant = '__unallocated__'),"
        " sum(attempts), sum(failed_attempts), sum(retries), any(currency), any(price_version),"
        " sum(shots), sum(qpu_seconds), sum(quantum_cost) FROM $db.allocation_cost_day"
    )
    _, idle = store.query("SELECT sum(idle), sum(capacity_cost) FROM $db.allocation_summary_day")
    r = rows[0]
    return {
        "cpu_core_hours": float(r[0] or 0), "ram_byte_hours": float(r[1] or 0), "egress_bytes": int(r[2] or 0),
        "cost": float(r[3] or 0), "unallocated": float(r[4] or 0), "attempts": int(r[5] or 0),
        "failed_attempts": int(r[6] or 0), "retries": int(r[7] or 0), "currency": r[8] or "", "price_version": r[9] or "",
        "shots": int(r[10] or 0), "qpu_seconds": float(r[11] or 0), "quantum_cost": float(r[12] or 0),
        "idle": float(idle[0][0] or 0), "capacity_cost": float(idle[0][1] or 0),
    }  # fmt: skip
