"""Chargeback export in the FinOps FOCUS column format (FinOps Open Cost and Usage Specification 1.0).

One FOCUS row per row of the priced table ``cost_line_day`` (tenant / project /
playbook / step / day / category / item), so the export totals what every
other view totals. Mapping: the tenant is the billing account, the project the
sub-account, the playbook (and step) the resource; the charge period is the
UTC day, the billing period its month. Prices are list prices without
discounts or commitments, so ``BilledCost`` = ``EffectiveCost`` = ``ListCost``
= ``ContractedCost``. Idle capacity and shared-tenant redistribution keep their
own rows (``ChargeDescription`` says which) with ``ChargeCategory`` ``Adjustment``
("charges the provider applies that do not fall into other category values",
FOCUS 1.2 columns/chargecategory.md): they are cost moved between accounts by the
allocation rule, not metered usage, so they carry no pricing quantity or unit price.
``noetl_analytics.focus_rules`` checks an export against the FOCUS 1.2 rules.
"""

from __future__ import annotations

import csv
import json
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa

from noetl_analytics.dashboard_access import TenantScope, Viewer
from noetl_analytics.store import FactsStore

PROVIDER = "NoETL"
# FOCUS 1.2 columns (names as the specification spells them), in the order they are written
COLUMNS: list[tuple[str, pa.DataType]] = [
    ("BilledCost", pa.float64()),
    ("BillingAccountId", pa.string()),
    ("BillingAccountName", pa.string()),
    ("BillingAccountType", pa.string()),
    ("BillingCurrency", pa.string()),
    ("BillingPeriodEnd", pa.timestamp("s", tz="UTC")),
    ("BillingPeriodStart", pa.timestamp("s", tz="UTC")),
    ("ChargeCategory", pa.string()),
    ("ChargeClass", pa.string()),
    ("ChargeDescription", pa.string()),
    ("ChargeFrequency", pa.string()),
    ("ChargePeriodEnd", pa.timestamp("s", tz="UTC")),
    ("ChargePeriodStart", pa.timestamp("s", tz="UTC")),
    ("ConsumedQuantity", pa.float64()),
    ("ConsumedUnit", pa.string()),
    ("ContractedCost", pa.float64()),
    ("ContractedUnitPrice", pa.float64()),
    ("EffectiveCost", pa.float64()),
    ("InvoiceId", pa.string()),
    ("InvoiceIssuerName", pa.string()),
    ("ListCost", pa.float64()),
    ("ListUnitPrice", pa.float64()),
    ("PricingCategory", pa.string()),
    ("PricingCurrency", pa.string()),
    ("PricingQuantity", pa.float64()),
    ("PricingUnit", pa.string()),
    ("ProviderName", pa.string()),
    ("PublisherName", pa.string()),
    ("RegionId", pa.string()),
    ("RegionName", pa.string()),
    ("ResourceId", pa.string()),
    ("ResourceName", pa.string()),
    ("ResourceType", pa.string()),
    ("ServiceCategory", pa.string()),
    ("ServiceName", pa.string()),
    ("ServiceSubcategory", pa.string()),
    ("SkuId", pa.string()),
    ("SkuMeter", pa.string()),
    ("SkuPriceDetails", pa.string()),
    ("SkuPriceId", pa.string()),
    ("SubAccountId", pa.string()),
    ("SubAccountName", pa.string()),
    ("SubAccountType", pa.string()),
    ("Tags", pa.string()),
]
# FOCUS ServiceCategory (an allowed value) of each cost category
_SERVICE = {
    "compute": "Compute", "ram": "Compute", "gpu": "Compute", "platform": "Compute", "idle": "Compute",
    "storage": "Storage", "egress": "Networking", "call": "Integration", "quantum": "Compute", "shared": "Other",
}  # fmt: skip
# FOCUS ServiceSubcategory (columns/servicesubcategory.md: one of the allowed values, its parent the
# row's ServiceCategory): task CPU, RAM and GPU are compute the user never provisions; the engine's own
# CPU and idle capacity are neither, so "Other (Compute)"
_SUBCATEGORY = {
    "compute": "Serverless Compute", "ram": "Serverless Compute", "gpu": "Serverless Compute",
    "platform": "Other (Compute)", "idle": "Other (Compute)", "quantum": "Quantum Compute",
    "storage": "Object Storage", "egress": "Network Connectivity", "call": "Other (Integration)",
    "shared": "Other (Other)",
}  # fmt: skip
# the price file's units (engine/usage_lines.UNITS; quantum: the item) in the FOCUS UnitFormat
# (attributes/unit_format.md): "<singular-unit>-<plural-time-units>", "<plural-units>"
FOCUS_UNITS = {
    "core_hour": "Core-Hours", "gb_hour": "GB-Hours", "gpu_hour": "GPU-Hours", "gb": "GB",
    "gb_month": "GB-Months", "call": "Requests", "shot": "Shots", "qpu_second": "QPU-Seconds",
}  # fmt: skip
FORMATS = ("csv", "parquet")


def focus_unit(unit: str) -> str:
    """A price-file unit in the FOCUS UnitFormat (an unknown one is capitalized as a count noun)."""
    return FOCUS_UNITS.get(unit) or "".join(p.capitalize() for p in unit.split("_")) + "s"


def sku_price_details(category: str, item: str, storage_months: float) -> str:
    """SkuPriceDetails (columns/skupricedetails.md, KeyValueFormat): the SKU price's stable properties,
    provider-defined keys prefixed ``x_``; no amounts, currency or dates."""
    details: dict[str, Any] = {"x_ServiceComponent": category, "x_Item": item}
    if category in ("compute", "ram", "platform"):
        details["x_WorkerClass"] = item
    if category == "storage":
        details["x_StorageMonthsBilled"] = storage_months  # billed once, at creation, for this many months
    return json.dumps(details, sort_keys=True)


class FocusExportError(ValueError):
    """Bad export arguments (one line for the CLI)."""


def _ts(d: date) -> datetime:
    return datetime.combine(d, time(), tzinfo=UTC)


def _month(d: date) -> tuple[datetime, datetime]:
    start = d.replace(day=1)
    end = (start + timedelta(days=32)).replace(day=1)
    return _ts(start), _ts(end)


def focus_table(store: FactsStore, start: date | None = None, end: date | None = None, *,
                viewer: Viewer) -> pa.Table:  # fmt: skip
    """The FOCUS rows of the priced table from ``start`` to ``end`` (inclusive days) that ``viewer``
    may see (the dashboards' tenancy gate: one tenant's, or ``Viewer.everyone()``'s: all, idle and
    shared rows included)."""
    if start and end and start > end:
        raise FocusExportError(f"--start {start} is after --end {end}")
    where = ["NOT (category IN ('idle', 'shared') AND amount = 0)"]
    params: dict[str, Any] = {}
    if start:
        where.append("day >= {start:Date}")
        params["start"] = start
    if end:
        where.append("day <= {end:Date}")
        params["end"] = end
    where.append("$scope(tenant_id, project_id)")
    _, rows = TenantScope(store, viewer).query(
        "SELECT day, tenant_id, project_id, playbook, step, category, item, unit, quantity, used, unit_price, amount,"
        " currency, price_version FROM $db.cost_line_day FINAL WHERE "
        + " AND ".join(where)
        + " ORDER BY day, tenant_id, project_id, playbook, step, category, item",
        params,
    )
    # billed units per quantity (storage: months retained): the row's unit price is price x months
    # per GB, FOCUS wants the price per PricingUnit (GB-month) and the quantity in GB-months
    mult = {(v, c, i): float(m) for v, c, i, m in store.query(
        "SELECT version, category, item, any(multiplier) FROM $db.price_line GROUP BY version, category, item"
    )[1]}  # fmt: skip
    cols: dict[str, list[Any]] = {name: [] for name, _ in COLUMNS}
    for (
        day,
        ten,
        project,
        playbook,
        step,
        category,
        item,
        unit,
        qty,
        used,
        price,
        amount,
        currency,
        version,
    ) in rows:
        tenant_id = ten or "__unallocated__"
        bp_start, bp_end = _month(day)
        resource = "/".join(p for p in (tenant_id, project, playbook, step) if p) or tenant_id
        if category == "idle":
            desc = "idle provisioned capacity" + ("" if ten == "__idle__" else f" distributed to {tenant_id}")
        elif category == "shared":
            desc = (
                f"cost of shared tenant {item} distributed"
                if item != "distributed"
                else "shared cost given to other tenants"
            )
        else:
            desc = f"{category} {item} ({unit})"
        usage = category not in ("idle", "shared") and bool(unit)
        m = mult.get((version, category, item), mult.get((version, category, "default"), 1.0)) or 1.0
        if m != 1.0:
            qty, used, price = float(qty) * m, float(used or qty) * m, float(price) / m
        charge = "Usage" if usage and amount >= 0 else ("Credit" if usage else "Adjustment")
        values = {
            "BilledCost": float(amount), "BillingAccountId": tenant_id, "BillingAccountName": tenant_id,
            "BillingAccountType": "Tenant", "InvoiceId": None, "PricingCurrency": currency,
            "SkuMeter": category, "SubAccountType": "Project" if project else None,
            "BillingCurrency": currency, "BillingPeriodEnd": bp_end, "BillingPeriodStart": bp_start,
            "ChargeCategory": charge, "ChargeClass": None, "ChargeDescription": desc,
            "ChargeFrequency": "Usage-Based", "ChargePeriodEnd": _ts(day + timedelta(days=1)),
            "ChargePeriodStart": _ts(day), "ConsumedQuantity": float(used or qty) if charge == "Usage" else None,
            "ConsumedUnit": focus_unit(unit) if charge == "Usage" else None, "ContractedCost": float(amount), "ContractedUnitPrice": float(price) if usage else None,
            "EffectiveCost": float(amount), "InvoiceIssuerName": PROVIDER, "ListCost": float(amount),
            "ListUnitPrice": float(price) if usage else None, "PricingCategory": "Standard" if usage else None,
            "PricingQuantity": float(qty) if usage else None, "PricingUnit": focus_unit(unit) if usage else None, "ProviderName": PROVIDER,
            "PublisherName": PROVIDER, "RegionId": item if category == "egress" else None,
            "RegionName": item if category == "egress" else None, "ResourceId": resource,
            "ResourceName": playbook or tenant_id, "ResourceType": "step" if step else ("playbook" if playbook else "tenant"),
            "ServiceCategory": _SERVICE.get(category, "Other"), "ServiceName": f"NoETL {category}",
            "ServiceSubcategory": _SUBCATEGORY.get(category, "Other (Other)"),
            "SkuId": f"{category}/{item}", "SkuPriceId": f"{version}:{category}/{item}" if version else None,
            "SkuPriceDetails": sku_price_details(category, item, m) if version else None,
            "SubAccountId": project or None, "SubAccountName": project or None,
            "Tags": json.dumps({"noetl/step": step, "noetl/playbook": playbook, "noetl/price_version": version}, sort_keys=True),
        }  # fmt: skip
        for name, _ in COLUMNS:
            cols[name].append(values[name])
    return pa.Table.from_arrays([pa.array(cols[n], t) for n, t in COLUMNS], names=[n for n, _ in COLUMNS])


def write_focus(table: pa.Table, out: str | Path, fmt: str | None = None) -> Path:
    """Write ``table`` as CSV or Parquet (``fmt``, else from the file suffix)."""
    path = Path(out)
    if path.is_dir():
        raise FocusExportError(f"{path} is a directory: give a file name")
    fmt = (fmt or path.suffix.lstrip(".")).lower()
    if fmt not in FORMATS:
        raise FocusExportError(
            f"unknown export format {fmt!r}: use --format csv or parquet (or a .csv/.parquet file)"
        )
    if not path.parent.is_dir():
        raise FocusExportError(f"directory {path.parent} does not exist")
    tmp = path.with_name(path.name + ".tmp")
    try:
        if fmt == "csv":
            _write_csv(table, tmp)
        else:
            import pyarrow.parquet as pq  # noqa: PLC0415

            pq.write_table(table, tmp)
        tmp.replace(path)  # nothing half-written under the final name
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise FocusExportError(f"cannot write {path}: {e.strerror or e}") from e
    return path


def _cell(value: Any) -> Any:
    """FOCUS 1.2 text formats: date-times 'YYYY-MM-DDTHH:mm:ssZ' (attributes/datetime_format.md),
    decimals without exponent (pyarrow writes '2026-12-01 00:00:00Z' and '2.1e-09')."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, float):
        text = format(Decimal(repr(value)), "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    return "" if value is None else value


def _write_csv(table: pa.Table, path: Path) -> None:
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(table.column_names)
        for row in table.to_pylist():
            out.writerow([_cell(v) for v in row.values()])
