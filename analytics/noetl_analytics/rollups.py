"""Build the priced table ``cost_line_day`` (and the usage counters ``allocation_step_day``).

Both are rebuilt from the deduplicated facts (``FINAL``), never summed from
inserts, so a re-sent event cannot count twice:

- :func:`build_days` recomputes the rows of some days (ReplacingMergeTree: the
  new rows replace the old ones of the same key). The exporter calls it for
  the days each batch touched, *before* it stores the cursor: a crash before
  the cursor moves re-sends the batch, which recomputes the same days again.
- :func:`refresh_rollups` loads the price table and rebuilds every day into
  staging tables swapped in with ``EXCHANGE TABLES`` (``facts refresh``, the
  Dagster asset ``noetl/cost_rollups``): a changed price file re-prices history.

Idle capacity and the cost of shared tenants are rows of their own
(``category`` ``idle`` / ``shared``), distributed over the day's tenants by
the price file's ``distribution`` rule (proportional, even, unallocated).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from noetl_analytics.pricing import CLASS_CATEGORIES, PriceTable
from noetl_analytics.store import FactsStore

IDLE_TENANT = "__idle__"
_COLS = (
    "day, tenant_id, project_id, playbook, step, category, item, unit, quantity, used, requested, unit_price,"
    " amount, currency, price_version, built_at"
)
_CLASS = "('" + "', '".join(CLASS_CATEGORIES) + "')"

# usage lines (storage: the first line per (execution, key), usage_lines.BilledRefs) -> priced per
# tenant / project / playbook / step / day
_PRICED = f"""
SELECT _u.day, _u.tenant_id, _u.project_id, if(_dim.playbook = '', '(unknown)', _dim.playbook) AS playbook,
       _u.step, _u.category, _u.item, any(_u.unit), sum(_u.quantity), sum(_u.used), sum(_u.requested),
       any(if(_p.item != '', _p.price * _p.multiplier, _d.price * _d.multiplier)) AS unit_price,
       sum(_u.quantity) * unit_price, {{currency:String}}, any(_v.version), {{now:DateTime64(6, 'UTC')}}
FROM
(
    SELECT toDate(ts) AS day, tenant_id, project_id, execution_id, step, category, unit, quantity, used, requested,
           if(item != '', item, if(category IN {_CLASS} AND _map.worker_class != '', _map.worker_class, 'default')) AS item,
           1 AS k
    FROM $db.usage_fact AS _x FINAL
    LEFT JOIN $db.worker_class_map AS _map ON _map.kind = _x.kind
    WHERE `key` = '' AND __DAYS__
    UNION ALL
    SELECT day, tenant_id, project_id, execution_id, step, 'storage', unit, quantity, used, requested, item, 1
    FROM
    (
        SELECT execution_id, `key`, toDate(min(ts)) AS day, argMin(tenant_id, ts) AS tenant_id,
               argMin(project_id, ts) AS project_id, argMin(step, ts) AS step, argMin(unit, ts) AS unit,
               argMin(quantity, ts) AS quantity, argMin(used, ts) AS used, argMin(requested, ts) AS requested,
               argMin(item, ts) AS item
        FROM $db.usage_fact FINAL
        WHERE `key` != ''
        GROUP BY execution_id, `key`
    )
    WHERE __STORAGE_DAYS__
) AS _u
LEFT JOIN $db.execution_dim AS _dim ON _dim.execution_id = _u.execution_id
ASOF LEFT JOIN $db.price_version AS _v ON _u.k = _v.k AND _u.day >= _v.valid_from
LEFT JOIN $db.price_line AS _p ON _p.version = _v.version AND _p.category = _u.category AND _p.item = _u.item
LEFT JOIN (SELECT * FROM $db.price_line WHERE item = 'default') AS _d
    ON _d.version = _v.version AND _d.category = _u.category
GROUP BY _u.day, _u.tenant_id, _u.project_id, playbook, _u.step, _u.category, _u.item
"""

_COUNTERS = """
SELECT _t.tenant_id, _t.project_id, if(_dim.playbook = '', '(unknown)', _dim.playbook) AS playbook, _t.step,
       toDate(_t.ts) AS day,
       toUInt64(count()), toUInt64(countIf(_t.status = 'error')), toUInt64(countIf(_t.attempt > 1)),
       sum(coalesce(_t.cpu_ms, _t.duration_ms * _t.units)) / 3.6e6, sum(_t.mem_bytes * _t.duration_ms) / 3.6e6,
       sum(_t.duration_ms) / 3.6e6, sum(_t.egress_bytes), sum(_t.net_in_bytes), sum(_t.net_out_bytes),
       sum(_t.bytes_read), sum(_t.bytes_written), sum(_t.rows_moved), sum(_t.shots), sum(_t.qpu_seconds),
       uniqExact(_t.execution_id), quantilesTDigest(0.5, 0.9, 0.99)(_t.duration_ms), {now:DateTime64(6, 'UTC')}
FROM $db.task_fact AS _t FINAL
LEFT JOIN $db.execution_dim AS _dim ON _dim.execution_id = _t.execution_id
WHERE __DAYS__
GROUP BY _t.tenant_id, _t.project_id, playbook, _t.step, day
"""


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
            "total": round(self.total, 9),
            "currency": self.currency,
            "tenants": self.tenants,
            "refreshed_at": self.refreshed_at.isoformat(),
            "prices": self.prices,
        }


def sync_prices(store: FactsStore, prices: PriceTable) -> None:
    """Load the price table: its lines, versions, worker-class map, and which file it was."""
    for table in ("price_line", "price_version", "worker_class_map"):
        store.command(f"TRUNCATE TABLE $db.{table}")
    store.insert_rows(
        "price_line", prices.price_rows(),
        ["version", "valid_from", "category", "item", "unit", "price", "multiplier", "currency"],
    )  # fmt: skip
    store.insert_rows(
        "price_version", prices.version_rows(),
        ["version", "valid_from", "currency", "cpu_core_hour", "ram_gb_hour", "egress_gb", "storage_gb_hour",
         "capacity_cores", "capacity_ram_gb", "shot", "qpu_second", "capacity_gpus", "gpu_hour", "capacity_cost_day"],
    )  # fmt: skip
    store.insert_rows(
        "worker_class_map",
        sorted([k, v] for k, v in prices.worker_class_by_kind.items()),
        ["kind", "worker_class"],
    )
    store.insert_rows(
        "price_meta",
        [
            [
                prices.fingerprint(),
                prices.source,
                prices.currency,
                json.dumps(prices.distribution),
                datetime.now(UTC),
            ]
        ],
        ["fingerprint", "source", "currency", "distribution", "loaded_at"],
    )


def loaded_fingerprint(store: FactsStore) -> str:
    return str(store.scalar("SELECT argMax(fingerprint, loaded_at) FROM $db.price_meta") or "")


def _days_filter(column: str, days: Iterable[date] | None) -> str:
    if days is None:
        return "1 = 1"
    listed = ", ".join(f"toDate('{d.isoformat()}')" for d in sorted(set(days)))
    return f"toDate({column}) IN ({listed})" if listed else "0 = 1"


def build_days(store: FactsStore, prices: PriceTable, days: Iterable[date] | None = None, *,
               suffix: str = "") -> None:  # fmt: skip
    """Recompute cost_line_day and allocation_step_day (``suffix``: their staging copies) for ``days``
    (None: every day) from the deduplicated facts, priced by the loaded price table."""
    days = None if days is None else sorted(set(days))
    if days is not None and not days:
        return
    now = datetime.now(UTC)
    params = {"currency": prices.currency, "now": now}
    store.command(
        f"INSERT INTO $db.cost_line_day{suffix} ({_COLS})"
        + _PRICED.replace("__DAYS__", _days_filter("ts", days)).replace(
            "__STORAGE_DAYS__", _days_filter("day", days)
        ),
        params,
    )
    store.command(
        f"INSERT INTO $db.allocation_step_day{suffix} "
        + _COUNTERS.replace("__DAYS__", _days_filter("_t.ts", days)),
        {"now": now},
    )
    _distribute(store, prices, days, suffix, now)


def _weights(costs: dict[str, float], rule: str) -> dict[str, float]:
    if rule == "even":
        return {t: 1.0 / len(costs) for t in costs} if costs else {}
    total = sum(v for v in costs.values() if v > 0)
    if total <= 0:
        return _weights(costs, "even")
    return {t: max(v, 0.0) / total for t, v in costs.items()}


def elapsed_fraction(day: date, now: datetime) -> float:
    """The part of UTC ``day`` that has passed at ``now``: today's idle is the capacity of the hours
    so far, not of the whole 24 h (else a tenant running early in the day pays for the rest of it).
    For today ``now`` is the day's last task fact, so a refresh of the same facts prices the same."""
    start = datetime.combine(day, datetime.min.time(), tzinfo=UTC)
    return min(max((now.astimezone(UTC) - start).total_seconds() / 86400, 0.0), 1.0)


def _distribute(
    store: FactsStore, prices: PriceTable, days: list[date] | None, suffix: str, now: datetime
) -> None:
    """Idle capacity and shared tenants' cost of each day, as rows on the day's tenants (or kept apart)."""
    rule_idle = prices.distribution.get("idle", "proportional")
    rule_shared = prices.distribution.get("shared", "proportional")
    shared = set(prices.distribution.get("shared_tenants") or [])
    _, rows = store.query(
        f"SELECT day, tenant_id, sum(amount), sumIf(amount, category IN ('compute', 'ram', 'gpu', 'platform'))"
        f" FROM $db.cost_line_day{suffix} FINAL WHERE category NOT IN ('idle', 'shared') AND {_days_filter('day', days)}"
        " GROUP BY day, tenant_id"
    )
    by_day: dict[date, dict[str, tuple[float, float]]] = defaultdict(dict)
    for day, tenant, amount, used in rows:
        by_day[day][tenant] = (float(amount or 0), float(used or 0))
    out: list[list[Any]] = []

    def row(day: date, tenant: str, category: str, item: str, amount: float, version: str, unit: str = "",
            quantity: float = 0.0) -> None:  # fmt: skip
        out.append([day, tenant, "", "", "", category, item, unit, quantity, 0.0, 0.0, 0.0, amount, prices.currency,
                    version, now])  # fmt: skip

    today = now.astimezone(UTC).date()
    last = store.scalar(
        "SELECT max(ts) FROM $db.task_fact FINAL WHERE toDate(ts) = {d:Date}", {"d": today}
    ) if today in by_day else None  # fmt: skip
    for day, tenants in sorted(by_day.items()):
        v = prices.version_on(day)
        version = v.version if v else ""
        own = {t: a for t, (a, _) in tenants.items() if t and t != IDLE_TENANT and t not in shared}
        covered = elapsed_fraction(
            day, min(now, last.replace(tzinfo=UTC)) if day == today and last and last.year > 1970 else now
        )
        capacity = (v.capacity_cost_day() if v else 0.0) * covered
        idle = max(capacity - sum(u for _, u in tenants.values()), 0.0)
        kept = idle
        if rule_idle != "unallocated" and own and idle > 0:
            for t, w in _weights(own, rule_idle).items():
                row(day, t, "idle", "cluster", idle * w, version)
            kept = 0.0
        # always written (replaces an earlier build's row); its quantity is the part of the day the
        # capacity covers, so allocation_summary_day prices today's capacity over the same hours as idle
        row(day, IDLE_TENANT, "idle", "cluster", kept, version, "day", covered)
        for s in sorted(shared & set(tenants)):
            amount = tenants[s][0]
            if rule_shared == "unallocated" or not own or amount == 0:
                row(day, s, "shared", "distributed", 0.0, version)
                continue
            row(day, s, "shared", "distributed", -amount, version)
            for t, w in _weights(own, rule_shared).items():
                row(day, t, "shared", s, amount * w, version)
    if out:
        store.insert_rows(f"cost_line_day{suffix}", out, [c.strip() for c in _COLS.split(",")])


def refresh_rollups(store: FactsStore, prices: PriceTable | None = None) -> RollupReport:
    """Load ``prices`` and rebuild every day of the priced table; swap it in atomically."""
    prices = prices or PriceTable.load()
    sync_prices(store, prices)
    for table in ("cost_line_day", "allocation_step_day"):
        store.command(f"CREATE TABLE IF NOT EXISTS $db.{table}_next AS $db.{table}")
        store.command(f"TRUNCATE TABLE $db.{table}_next")
    build_days(store, prices, None, suffix="_next")
    for table in ("cost_line_day", "allocation_step_day"):
        store.command(f"EXCHANGE TABLES $db.{table} AND $db.{table}_next")
        store.command(f"TRUNCATE TABLE $db.{table}_next")
    return report(store, prices)


def report(store: FactsStore, prices: PriceTable) -> RollupReport:
    _, rows = store.query(
        "SELECT count(), sum(amount), uniqExactIf(tenant_id, tenant_id != '__idle__') FROM $db.tenant_cost_fact"
    )
    count, total, tenants = rows[0]
    return RollupReport(
        int(count), float(total or 0.0), prices.currency, int(tenants), datetime.now(UTC), prices.source
    )


def ensure_prices(store: FactsStore, prices: PriceTable | None = None) -> None:
    """A store that never loaded a price table loads ``prices`` (default: the packaged/configured one)
    and prices what it holds; one that did keeps its table until ``facts refresh``."""
    if not loaded_fingerprint(store):
        refresh_rollups(store, prices or PriceTable.load())


def loaded_prices(store: FactsStore, fallback: PriceTable | None = None) -> PriceTable:
    """The price table the store was priced with, rebuilt from its loaded rows (for incremental builds)."""
    from noetl_analytics.pricing import PriceVersion  # noqa: PLC0415

    _, meta = store.query(
        "SELECT argMax(currency, loaded_at), argMax(distribution, loaded_at), argMax(source, loaded_at) FROM $db.price_meta"
    )
    currency, distribution, source = meta[0]
    base = fallback or PriceTable()
    _, lines = store.query(
        "SELECT version, valid_from, category, item, price, multiplier FROM $db.price_line"
    )
    _, caps = store.query(
        "SELECT version, valid_from, capacity_cores, capacity_ram_gb, capacity_gpus FROM $db.price_version"
    )
    _, wmap = store.query("SELECT kind, worker_class FROM $db.worker_class_map")
    versions = []
    for name, valid_from, cores, ram, gpus in caps:
        prices: dict[str, dict[str, float]] = defaultdict(dict)
        months = 1.0
        for v, _, cat, item, price, mult in lines:
            if v == name:
                prices[cat][item] = float(price)
                if cat == "storage":
                    months = float(mult)
        versions.append(PriceVersion(name, valid_from, dict(prices), months,
                                     {"cores": float(cores), "ram_gb": float(ram), "gpus": float(gpus)}))  # fmt: skip
    return PriceTable(
        currency or base.currency, tuple(versions), dict(wmap),
        json.loads(distribution) if distribution else dict(base.distribution), source or base.source,
    )  # fmt: skip
