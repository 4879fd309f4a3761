"""FOCUS 1.2 leftovers of issue 43: PricingUnit/ConsumedUnit in the spec's UnitFormat, ServiceSubcategory
from its allowed values under its one parent ServiceCategory, SkuPriceDetails in the KeyValueFormat with
FOCUS-defined or ``x_`` keys (FOCUS_Spec v1.2: attributes/unit_format.md, key_value_format.md,
columns/servicesubcategory.md, skupricedetails.md); the checker enforces each, the export passes."""

from __future__ import annotations

import json

import pytest

from noetl_analytics.dashboard_access import Viewer
from noetl_analytics.facts import FactWriter
from noetl_analytics.focus import focus_table
from noetl_analytics.focus_rules import PARENT, check_rows, check_table, unit_errors
from noetl_analytics.pricing import PriceTable
from noetl_analytics.rollups import refresh_rollups
from noetl_analytics.store import FactsStore, close_all
from noetl_dagster.engine.events import Event

DAY = "2026-03-10"
TS = f"{DAY}T10:00:00+00:00"
REF = {"$ref": {"uri": "s3://b/r.json", "store": "file", "format": "json", "size": 10**9, "checksum": "c"}}


def _events() -> list[Event]:
    usage = {"cpu_s": 36.0, "maxrss_bytes": 2 * 10**9, "egress_bytes": 10**9, "shots": 100}
    done = {"status": "ok", "result": REF, "meta": {"attempt": 1, "duration_ms": 1000, "usage": usage}}
    http = {"status": "ok", "result": {}, "meta": {"attempt": 1, "duration_ms": 1, "usage": {"cpu_s": 0.1}}}
    return [
        Event("playbook.execution.requested", "exe-1", {"playbook": "pb"}, tenant_id="acme", timestamp=TS),
        Event("task.done", "exe-1", {"task": "t", "kind": "python", "outcome": done}, step="s",
              step_run_id="r1", attempt=1, tenant_id="acme", timestamp=TS),
        Event("task.done", "exe-1", {"task": "h", "kind": "http", "outcome": http}, step="h",
              step_run_id="r2", attempt=1, tenant_id="acme", timestamp=TS),
        Event("workflow.finished", "exe-1", {"status": "completed", "platform": {"cpu_s": 7.2}},
              tenant_id="acme", timestamp=TS),
    ]  # fmt: skip


PRICES = {
    "versions": [
        {"version": "u", "valid_from": "2026-01-01", "cpu_core_hour": 0.03, "ram_gb_hour": 0.004, "egress_gb": 0.09,
         "storage": {"file": 0.02}, "storage_months": 3, "call": {"http": 0.0000004},
         "quantum": {"shot": 0.0009, "qpu_second": 1.6}, "capacity_cores": 2}
    ]
}  # fmt: skip


@pytest.fixture
def rows(tmp_path):
    s = FactsStore(f"chdb://{tmp_path / 'facts'}")
    try:
        FactWriter(s).write(_events())
        refresh_rollups(s, PriceTable.from_dict(PRICES))
        table = focus_table(s, viewer=Viewer.everyone())
        yield table, table.to_pylist()
    finally:
        close_all()


def test_units_subcategories_and_sku_price_details_follow_focus(rows):
    table, rs = rows
    by_meter = {r["SkuMeter"]: r for r in rs if r["ChargeCategory"] == "Usage"}
    assert {m: r["PricingUnit"] for m, r in by_meter.items()} == {
        "compute": "Core-Hours", "egress": "GB", "storage": "GB-Months",
        "call": "Requests", "platform": "Core-Hours", "quantum": "Shots",
    }  # fmt: skip
    assert all(r["ConsumedUnit"] == r["PricingUnit"] for r in by_meter.values())
    for r in rs:
        assert PARENT[r["ServiceSubcategory"]] == r["ServiceCategory"]
        if r["SkuPriceId"]:
            details = json.loads(r["SkuPriceDetails"])
            assert all(k.startswith("x_") for k in details)
            assert not any(isinstance(v, (dict, list)) for v in details.values())
        else:
            assert r["SkuPriceDetails"] is None
    assert json.loads(by_meter["storage"]["SkuPriceDetails"])["x_StorageMonthsBilled"] == 3
    assert by_meter["quantum"]["ServiceSubcategory"] == "Quantum Compute"
    assert check_table(table) == []


def test_the_checker_enforces_each_rule(rows):
    table, rs = rows
    cols = table.column_names
    usage = next(r for r in rs if r["SkuMeter"] == "compute")

    def errors(**change: object) -> list[str]:
        return check_rows(cols, [{**usage, **change}], text=False)

    assert errors() == []
    assert errors(PricingUnit="core_hour") and "UnitFormat" in errors(PricingUnit="core_hour")[0]
    assert errors(ConsumedUnit="Gigabytes")
    assert "not an allowed value" in errors(ServiceSubcategory="Batch")[0]
    assert "belongs to 'Storage'" in errors(ServiceSubcategory="Object Storage")[0]
    assert "is null" in errors(ServiceSubcategory=None)[0]
    assert "neither FOCUS-defined" in errors(SkuPriceDetails='{"Item": "default"}')[0]
    assert "duplicate keys" in errors(SkuPriceDetails='{"x_a": 1, "x_a": 2}')[0]
    assert "object or array" in errors(SkuPriceDetails='{"x_a": [1]}')[0]
    assert "type FOCUS defines" in errors(SkuPriceDetails='{"CoreCount": "4"}')[0]
    assert "SkuPriceId is null" in errors(SkuPriceId=None)[0]
    missing = check_rows([c for c in cols if c != "SkuPriceDetails"], [], text=False)
    assert missing == ["missing column SkuPriceDetails (FOCUS: MUST be present when the provider publishes"
                       " price lists (the price file is one))"]  # fmt: skip


@pytest.mark.parametrize("unit", ["GB", "GB-Hours", "GB/Hour", "1000 Requests", "Units/3 Months", "KiB"])
def test_unit_format_accepts_the_specs_examples(unit):
    assert unit_errors(unit) == []


@pytest.mark.parametrize(
    "unit", ["gb_month", "gigabyte-seconds", "GB-Hour", "GBs", "Terabytes", "GB per hour"]
)
def test_unit_format_refuses(unit):
    assert unit_errors(unit)
