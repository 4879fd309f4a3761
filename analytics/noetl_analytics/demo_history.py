"""SYNTHETIC demo history for the cost dashboard (issue 18.4): N days of task facts for
several tenants, generated inside ClickHouse with ``numbers()``.

Every tenant id starts with ``synthetic-`` and the project is ``demo``, so the rows are
never mistaken for measured usage (the dashboard shows a banner when it sees them;
``DELETE ... WHERE startsWith(tenant_id, 'synthetic-')`` removes them). Trends are
built in: each tenant grows at its own rate, weekends are quieter, one tenant has a
failure spike in the middle of the period.
"""

from __future__ import annotations

from noetl_analytics.store import FactsStore

TENANTS = ("synthetic-acme", "synthetic-globex", "synthetic-initech", "synthetic-umbrella")

_INSERT = """INSERT INTO $db.task_fact (event_id, ts, tenant_id, project_id, execution_id, step, step_run_id,
    task_run_id, task, kind, attempt, status, duration_ms, playbook, cpu_ms, mem_bytes, mem_peak_bytes, bytes_read,
    bytes_written, net_in_bytes, net_out_bytes, egress_bytes, rows_moved, units, error_kind)
SELECT concat('synthetic-', toString(number)), ts, tenant, 'demo', concat(tenant, '-x', toString(intDiv(number, 6))),
    concat('step_', toString(number % 5)), toString(intDiv(number, 2)), toString(number), 'task',
    ['python', 'http', 'duckdb', 'postgres', 'shell'][1 + number % 5],
    1 + (cityHash64(number, 9) % 100 < 4), if(failed, 'error', 'ok'), duration,
    concat('playbooks/', ['orders', 'billing', 'etl_daily', 'ml_features', 'reports', 'sync'][1 + (cityHash64(intDiv(number, 6), 8) % (3 + t))]),
    duration * (0.2 + (cityHash64(number, 1) % 70) / 100), cityHash64(number, 2) % (50000000 * (1 + t)), 400000000,
    cityHash64(number, 3) % 5000000, cityHash64(number, 4) % 8000000, cityHash64(number, 5) % 200000,
    cityHash64(number, 6) % 50000, if(number % 5 = 1, cityHash64(number, 6) % 2000000, 0),
    cityHash64(number, 7) % 20000, 1, if(failed, 'timeout', '')
FROM
(
    SELECT number, number % {tenants:UInt8} AS t, [{tenant_list:String}][1 + t] AS tenant,
        intDiv(number, {per_day:UInt64}) AS d,
        toDateTime64(today() - {days:UInt16} + d, 6, 'UTC') + toIntervalSecond(cityHash64(number) % 86400) AS ts,
        -- growth per tenant, quieter weekends (rows are dropped, not shrunk)
        cityHash64(number, 10) % 1000 < 1000 * (0.45 + 0.5 * d / {days:UInt16} * (1 + t) / {tenants:UInt8})
            * if(toDayOfWeek(ts) >= 6, 0.5, 1) AS keep,
        (t = 2 AND abs(toInt32(d) - intDiv({days:UInt16}, 2)) <= 1 AND number % 4 = 0) OR cityHash64(number, 11) % 100 < 2 AS failed,
        50 + (cityHash64(number, 12) % 20000) / 10.0 * (1 + t) AS duration
    FROM numbers({rows:UInt64})
)
WHERE keep"""

# what the facts writer derives from each attempt: the request row naming the playbook, and the
# priced usage lines (analytics/noetl_analytics/pricing.py usage_lines: CPU, RAM, egress, call)
_DERIVED = (
    """INSERT INTO $db.execution_fact (event_id, ts, tenant_id, project_id, execution_id, playbook, playbook_name,
    transition, status)
SELECT concat('synthetic-request-', execution_id), min(ts), any(tenant_id), any(project_id), execution_id,
    any(playbook), any(playbook), 'requested', 'requested'
FROM $db.task_fact WHERE startsWith(tenant_id, {prefix:String}) GROUP BY execution_id""",
    """INSERT INTO $db.usage_fact (event_id, ordinal, ts, tenant_id, project_id, execution_id, step, kind, category,
    item, unit, quantity, used, requested)
SELECT event_id, _l.1, ts, tenant_id, project_id, execution_id, step, kind, _l.2, _l.3, _l.4, _l.5, _l.5, 0
FROM $db.task_fact
ARRAY JOIN [
    (0, 'compute', '', 'core_hour', coalesce(cpu_ms, duration_ms * units) / 3.6e6),
    (1, 'ram', '', 'gb_hour', mem_bytes * duration_ms / 3.6e6 / 1e9),
    (2, 'egress', 'default', 'gb', egress_bytes / 1e9),
    (3, 'call', kind, 'call', 1)
] AS _l
WHERE startsWith(tenant_id, {prefix:String}) AND (_l.5 > 0 OR _l.2 = 'call')""",
)


def derive_usage(store: FactsStore, tenant_prefix: str) -> None:
    """Request rows and usage lines of task facts inserted directly (tenants starting with the prefix);
    re-deriving earlier rows is harmless: they are keyed on event_id."""
    for derived in _DERIVED:
        store.command(derived, {"prefix": tenant_prefix})


def generate_history(
    store: FactsStore, *, days: int = 30, per_day: int = 4000, tenants: int = len(TENANTS)
) -> int:
    """Insert ``days`` x ``per_day`` candidate SYNTHETIC task attempts (about 60 % kept); returns rows added."""
    if not 1 <= tenants <= len(TENANTS) or days <= 0 or per_day <= 0:
        raise ValueError(f"days and per_day must be positive and tenants 1..{len(TENANTS)}")
    _, before = store.query("SELECT count() FROM $db.task_fact WHERE startsWith(tenant_id, 'synthetic-')")
    tenant_list = ", ".join(f"'{t}'" for t in TENANTS[:tenants])
    sql = _INSERT.replace("{tenant_list:String}", tenant_list)
    store.command(sql, {"tenants": tenants, "per_day": per_day, "days": days, "rows": days * per_day})
    derive_usage(store, "synthetic-")
    _, after = store.query("SELECT count() FROM $db.task_fact WHERE startsWith(tenant_id, 'synthetic-')")
    return int(after[0][0]) - int(before[0][0])
