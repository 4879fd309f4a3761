"""FinOps features (issue 30.4): idle and shared cost distributed by a configurable rule, monthly
budgets with a Dagster sensor (real instance, build_sensor_context) and an alert run that warns or
fails, and the FOCUS chargeback export (CSV and Parquet) with its errors."""

from __future__ import annotations

import json
import re
from datetime import UTC, date, datetime
from pathlib import Path

import dagster as dg
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from noetl_analytics.allocation import allocation_totals
from noetl_analytics.budgets import Budget, BudgetConfigError, evaluate, load_budgets
from noetl_analytics.dashboard import render_dashboard
from noetl_analytics.dashboard_access import Viewer
from noetl_analytics.facts import FactWriter
from noetl_analytics.focus import COLUMNS, focus_table
from noetl_analytics.focus_rules import check_csv, check_table
from noetl_analytics.pricing import PriceConfigError, PriceTable
from noetl_analytics.rollups import elapsed_fraction, refresh_rollups
from noetl_analytics.store import FactsStore, close_all
from noetl_dagster.commands.main import cli
from noetl_dagster.engine.events import Event
from noetl_dagster.sensors.facts import BUDGET_JOB, RESOURCE_KEY, FactsStoreResource, build_facts_definitions

DAY = "2026-03-10"
CAPACITY_CORES = 1  # one core-day at 3.6 per core-hour = 86.4


def _events(ts: str) -> list[Event]:
    """CPU-seconds: acme 10, globex 30, platform-team (a shared tenant) 20, on one day; 1 CPU-second = 0.001."""
    out = []
    for tenant, cpu_s in (("acme", 10.0), ("globex", 30.0), ("platform-team", 20.0)):
        eid = f"exe-{tenant}"
        outcome = {"status": "ok", "meta": {"attempt": 1, "duration_ms": 1000, "usage": {"cpu_s": cpu_s}}}
        out += [
            Event("playbook.execution.requested", eid, {"playbook": f"pb/{tenant}"}, tenant_id=tenant, project_id="p",
                  timestamp=ts),
            Event("task.done", eid, {"task": "t", "kind": "python", "outcome": outcome}, step="s", step_run_id=eid,
                  attempt=1, tenant_id=tenant, project_id="p", timestamp=ts),
        ]  # fmt: skip
    return out


def _prices(idle: str, shared: str) -> PriceTable:
    return PriceTable.from_dict({
        "distribution": {"idle": idle, "shared": shared, "shared_tenants": ["platform-team"]},
        "versions": [{"version": "d", "valid_from": "2026-01-01", "compute": 3.6, "capacity": {"cores": CAPACITY_CORES}}],
    })  # fmt: skip


def _by_tenant(store: FactsStore) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for tenant, category, amount in store.query(
        "SELECT tenant_id, category, sum(amount) FROM $db.tenant_cost_fact GROUP BY tenant_id, category"
    )[1]:
        out.setdefault(tenant, {})[category] = amount
    return out


@pytest.fixture
def store(tmp_path):
    s = FactsStore(f"chdb://{tmp_path / 'facts'}")
    FactWriter(s).write(_events(f"{DAY}T10:00:00+00:00"))
    yield s
    close_all()


def test_idle_and_shared_cost_distribution_rules(store):
    direct = {"acme": 0.010, "globex": 0.030, "platform-team": 0.020}
    idle = 86.4 - sum(direct.values())
    totals = []

    refresh_rollups(store, _prices("proportional", "proportional"))
    t = _by_tenant(store)
    # idle over the non-shared tenants by their own cost (1 : 3); the shared tenant's cost likewise
    assert t["acme"]["idle"] == pytest.approx(idle * 0.25) and t["globex"]["idle"] == pytest.approx(
        idle * 0.75
    )
    assert t["acme"]["shared"] == pytest.approx(0.020 * 0.25) and t["globex"]["shared"] == pytest.approx(
        0.020 * 0.75
    )
    assert t["platform-team"]["shared"] == pytest.approx(-0.020)  # its cost went to the others
    assert sum(t["platform-team"].values()) == pytest.approx(0) and "__idle__" not in t
    totals.append(sum(sum(c.values()) for c in t.values()))

    refresh_rollups(store, _prices("even", "even"))
    t = _by_tenant(store)
    assert t["acme"]["idle"] == pytest.approx(idle / 2) == t["globex"]["idle"]
    assert t["acme"]["shared"] == pytest.approx(0.010) == t["globex"]["shared"]
    totals.append(sum(sum(c.values()) for c in t.values()))

    refresh_rollups(store, _prices("unallocated", "unallocated"))
    t = _by_tenant(store)
    assert t["__idle__"] == {"idle": pytest.approx(idle)}
    assert "idle" not in t["acme"] and "shared" not in t["acme"]
    assert t["platform-team"] == {"compute": pytest.approx(0.020), "call": 0.0}
    totals.append(sum(sum(c.values()) for c in t.values()))
    # the Totals tile says how much of the cost is idle capacity (labelled, not hidden in the total)
    dash = render_dashboard(store, store_dir := Path(store.url[len("chdb://") :]).parent / "dash",
                            viewer=Viewer.everyone())  # fmt: skip
    summary = next(p for p in dash.panels if p.panel.key == "summary")
    tile = dict(zip(summary.columns, summary.rows[0], strict=True))
    assert tile["cost_of_which_idle"] == pytest.approx(idle) and tile["cost"] == pytest.approx(86.4)
    assert "cost_of_which_idle" in (store_dir / "index.html").read_text()
    # a rule moves cost between tenants, never creates or loses any
    assert totals == pytest.approx([sum(direct.values()) + idle] * 3)
    # the summary view: idle per day whatever the rule
    _, rows = store.query("SELECT round(idle, 9), round(capacity_cost, 9) FROM $db.allocation_summary_day")
    assert rows == [(round(idle, 9), 86.4)]


def test_todays_idle_is_the_capacity_of_the_hours_so_far(tmp_path):
    # 0.060 of compute today; capacity 86.4 a day: idle is the part of the day up to its last task
    # minus the usage, not the whole 24 h (an early tenant paid for the rest of the day under
    # idle: proportional); refreshing the same facts later prices the same
    s = FactsStore(f"chdb://{tmp_path / 'facts'}")
    try:
        last = datetime.now(UTC)
        FactWriter(s).write(_events(last.isoformat()))
        expected = max(86.4 * elapsed_fraction(last.date(), last) - 0.060, 0.0)
        idle = []
        for _ in range(2):
            refresh_rollups(s, _prices("unallocated", "unallocated"))
            idle.append(s.scalar("SELECT sum(amount) FROM $db.cost_line_day FINAL WHERE category = 'idle'"))
        assert idle == pytest.approx([expected] * 2, abs=1e-6)
    finally:
        close_all()
    assert elapsed_fraction(date(2026, 3, 10), datetime(2026, 3, 10, 6, tzinfo=UTC)) == 0.25


def test_todays_summary_prices_capacity_over_the_same_hours_as_its_idle(tmp_path):
    # allocation_summary_day showed today's capacity for the whole 24 h beside idle for the hours so
    # far: capacity - idle was not the usage and idle_share was understated
    s = FactsStore(f"chdb://{tmp_path / 'facts'}")
    try:
        last = datetime.now(UTC)
        FactWriter(s).write(_events(last.isoformat()))
        refresh_rollups(s, _prices("unallocated", "unallocated"))
        _, rows = s.query("SELECT capacity_cost, idle, idle_share FROM $db.allocation_summary_day")
        [(capacity, idle, share)] = rows
        assert capacity == pytest.approx(86.4 * elapsed_fraction(last.date(), last), abs=1e-5)
        if capacity > 0.060:  # past the day's first seconds: what is not idle is the usage
            assert capacity - idle == pytest.approx(0.060, abs=1e-9) and share == pytest.approx(
                idle / capacity
            )
        totals = allocation_totals(s)
        assert totals["capacity_cost"] == pytest.approx(capacity) and totals["idle"] <= capacity
    finally:
        close_all()
    assert elapsed_fraction(date(2026, 3, 9), datetime(2026, 3, 10, 6, tzinfo=UTC)) == 1.0
    assert elapsed_fraction(date(2026, 3, 11), datetime(2026, 3, 10, 6, tzinfo=UTC)) == 0.0


def test_a_price_per_gib_is_charged_per_gib(tmp_path):
    # egress 0.09 per GiB (units: {egress: GiB}): 1 GiB sent costs 0.09, not 0.09 x 1.0737 (bytes / 1e9)
    s = FactsStore(f"chdb://{tmp_path / 'facts'}")
    outcome = {"status": "ok", "meta": {"attempt": 1, "duration_ms": 1, "usage": {"egress_bytes": 2**30}}}
    events = [Event("task.done", "exe-1", {"task": "t", "kind": "python", "outcome": outcome}, step="s",
                    step_run_id="exe-1", attempt=1, tenant_id="acme", timestamp=f"{DAY}T10:00:00+00:00")]  # fmt: skip
    prices = PriceTable.from_dict({"versions": [{
        "version": "g", "valid_from": "2026-01-01", "egress": 0.09, "units": {"egress": "GiB"},
        "sources": {"egress": "a provider's list price per GiB"},
    }]})  # fmt: skip
    try:
        FactWriter(s).write(events)
        refresh_rollups(s, prices)
        egress = s.scalar("SELECT sum(amount) FROM $db.cost_line_day FINAL WHERE category = 'egress'")
        assert egress == pytest.approx(0.09)
    finally:
        close_all()
    with pytest.raises(PriceConfigError, match="units.egress must be GB or GiB"):
        PriceTable.from_dict({"versions": [{"egress": 0.09, "units": {"egress": "GIB"}}]})


def test_focus_storage_row_prices_per_gb_month_with_storage_months(tmp_path):
    # storage_months 3 at 0.020 per GB-month: 1 GB stored is 3 GB-months at 0.020 (not 1 GB at 0.06)
    s = FactsStore(f"chdb://{tmp_path / 'facts'}")
    ref = {
        "$ref": {"uri": "s3://b/r.json", "store": "file", "format": "json", "size": 10**9, "checksum": "c"}
    }
    outcome = {"status": "ok", "result": ref, "meta": {"attempt": 1, "duration_ms": 1}}
    ts = f"{DAY}T10:00:00+00:00"
    events = [
        Event("playbook.execution.requested", "exe-1", {"playbook": "pb"}, tenant_id="acme", timestamp=ts),
        Event("task.done", "exe-1", {"task": "t", "kind": "python", "outcome": outcome}, step="s",
              step_run_id="exe-1", attempt=1, tenant_id="acme", timestamp=ts),
    ]  # fmt: skip
    prices = PriceTable.from_dict({"versions": [
        {"version": "m", "valid_from": "2026-01-01", "storage": {"file": 0.020}, "storage_months": 3}
    ]})  # fmt: skip
    try:
        FactWriter(s).write(events)
        refresh_rollups(s, prices)
        table = focus_table(s, viewer=Viewer.everyone())
        rows = [r for r in table.to_pylist() if r["SkuMeter"] == "storage"]
        assert len(rows) == 1, table.to_pylist()
        r = rows[0]
        assert (r["ListUnitPrice"], r["PricingQuantity"]) == (pytest.approx(0.020), pytest.approx(3.0))
        assert r["ListCost"] == pytest.approx(0.060) and check_table(table) == []
    finally:
        close_all()


def _budget_setup(tmp_path, budgets: list[dict]):
    now = datetime.now(UTC)
    s = FactsStore(f"chdb://{tmp_path / 'facts'}")
    FactWriter(s).write(_events(now.isoformat()))
    refresh_rollups(s, _prices("unallocated", "unallocated"))
    close_all()
    path = tmp_path / "budgets.yaml"
    path.write_text(yaml.safe_dump({"budgets": budgets}))
    resource = FactsStoreResource(clickhouse_url=f"chdb://{tmp_path / 'facts'}", data_dir=str(tmp_path),
                                  budgets=str(path))  # fmt: skip
    return resource, build_facts_definitions(resource=resource, rollup_cron=None)


@pytest.mark.parametrize("action", ["warn", "fail"])
def test_budget_sensor_alerts_once_per_month_and_the_alert_run_warns_or_fails(tmp_path, action):
    resource, defs = _budget_setup(tmp_path, [
        {"tenant": "acme", "monthly": 0.005, "action": action},  # month-to-date 0.010: exceeded
        {"tenant": "globex", "project": "p", "monthly": 1000.0},  # far within
    ])  # fmt: skip
    sensor = defs.resolve_sensor_def("noetl_cost_budgets")
    with dg.instance_for_test() as instance:
        result = sensor(dg.build_sensor_context(instance=instance, resources={RESOURCE_KEY: resource}))
        assert isinstance(result, dg.SensorResult) and len(result.run_requests) == 1
        req = result.run_requests[0]
        month = datetime.now(UTC).strftime("%Y-%m")
        assert req.run_key == f"budget-acme-{month}-exceeded"
        assert req.tags["noetl/budget"] == "acme" and req.tags["noetl/budget_status"] == "exceeded"
        assert float(req.tags["noetl/budget_month_to_date"]) == pytest.approx(0.010)
        run = defs.resolve_job_def(BUDGET_JOB).execute_in_process(
            instance=instance, tags=req.tags, raise_on_error=False
        )
        if action == "fail":
            assert not run.success
            failure = run.get_step_failure_events()[0].step_failure_data.user_failure_data
            assert (
                "budget acme" in failure.description
                and "crosses the monthly budget 0.005" in failure.description
            )
        else:
            assert run.success
            warnings = [e for e in instance.all_logs(run.run_id) if e.level == 30]  # logging.WARNING
            assert any("budget acme" in e.user_message and "crosses" in e.user_message for e in warnings)
        assert instance.get_run_by_id(run.run_id).tags["noetl/budget_status"] == "exceeded"


def test_budget_forecast_and_config_errors(tmp_path):
    s = FactsStore(f"chdb://{tmp_path / 'facts'}")
    try:
        FactWriter(s).write(_events(f"{DAY}T10:00:00+00:00") + _events("2026-04-01T10:00:00+00:00"))
        refresh_rollups(s, _prices("unallocated", "unallocated"))
        now = datetime(2026, 3, 10, 12, tzinfo=UTC)  # 9.5 days into a 31-day month
        st = evaluate(
            s, [Budget("globex", 0.05), Budget("globex", 0.5), Budget("globex", 0.05, forecast=False)], now
        )
        forecast = 0.030 / 9.5 * 31
        assert [x.crossed for x in st] == ["forecast", None, None]
        assert st[0].forecast == pytest.approx(forecast) and st[0].month_to_date == pytest.approx(0.030)
        assert "forecast cost" in st[0].message()
        # April 2 noon (1.5 days elapsed, 0.030 spent on the 1st): the forecast is 20x the spend
        # but does not alert yet; month-to-date over the budget still does
        early = evaluate(s, [Budget("globex", 0.05, action="fail"), Budget("globex", 0.02)],
                         datetime(2026, 4, 2, 12, tzinfo=UTC))  # fmt: skip
        assert early[0].forecast == pytest.approx(0.030 / 1.5 * 30) and early[0].crossed is None
        assert early[1].crossed == "exceeded"
        # from FORECAST_MIN_DAYS elapsed the forecast alerts
        assert (
            evaluate(s, [Budget("globex", 0.05)], datetime(2026, 4, 4, tzinfo=UTC))[0].crossed == "forecast"
        )
        # next month: nothing spent yet
        assert evaluate(s, [Budget("globex", 0.01)], datetime(2026, 5, 2, tzinfo=UTC))[0].month_to_date == 0
    finally:
        close_all()
    for raw, message in (
        ([{"tenant": "acme", "monthly": -1}], "monthly must be a positive number"),
        ([{"tenant": "acme", "monthly": 5, "action": "page"}], "action must be warn or fail"),
        ([{"monthly": 5}], "tenant must be a non-empty string"),
        ({"budget": []}, "budgets must be a list"),
    ):
        (tmp_path / "b.yaml").write_text(yaml.safe_dump(raw))
        with pytest.raises(BudgetConfigError, match=message):
            load_budgets(tmp_path / "b.yaml")


def test_focus_export_csv_and_parquet_and_its_errors(store, tmp_path):
    refresh_rollups(store, _prices("proportional", "proportional"))
    close_all()
    url = store.url
    runner = CliRunner()
    total = None
    for fmt in ("csv", "parquet"):
        out = tmp_path / f"bill.{fmt}"
        r = runner.invoke(
            cli, ["facts", "focus-export", "--clickhouse", url, "--out", str(out), "--all-tenants"]
        )
        assert r.exit_code == 0, r.output
        table = pcsv.read_csv(out) if fmt == "csv" else pq.read_table(out)
        assert table.column_names == [n for n, _ in COLUMNS]
        for col in ("BilledCost", "EffectiveCost", "ListCost", "ChargePeriodStart", "ChargePeriodEnd",
                    "BillingAccountId", "SubAccountId", "ServiceCategory", "ChargeCategory", "PricingUnit"):  # fmt: skip
            assert col in table.column_names
        rows = table.to_pylist()
        assert {r["BillingAccountId"] for r in rows} == {"acme", "globex", "platform-team"}
        assert all(r["BilledCost"] == r["EffectiveCost"] == r["ListCost"] for r in rows)
        # idle and shared redistribution are Adjustment rows without pricing columns; a shared
        # tenant's negative row is one of them (not a Credit: FOCUS keeps that for provider credits)
        moved = [r for r in rows if r["ChargeCategory"] == "Adjustment"]
        assert {r["ChargeDescription"].split()[0] for r in moved} == {"idle", "cost", "shared"}
        assert all(r["PricingQuantity"] is None and r["ListUnitPrice"] is None for r in moved)
        negative = [r for r in rows if r["BilledCost"] < 0]
        assert len(negative) == 1 and negative[0]["BillingAccountId"] == "platform-team"
        assert negative[0]["ChargeCategory"] == "Adjustment"
        usage = [r for r in rows if r["ChargeCategory"] == "Usage"]
        assert usage and all(r["PricingUnit"] and r["PricingCategory"] == "Standard" for r in usage)
        assert (check_csv(out) if fmt == "csv" else check_table(table)) == []
        if fmt == "csv":  # FOCUS text formats: 'T' date-times, no exponent
            text = out.read_text()
            assert f"{DAY}T00:00:00Z" in text and " 00:00:00Z" not in text
            assert not re.search(r"\d[eE][-+]?\d", text.split("\n", 1)[1])
        start = rows[0]["ChargePeriodStart"]
        assert str(start).startswith(DAY) and str(rows[0]["BillingPeriodStart"]).startswith("2026-03-01")
        assert json.loads(rows[0]["Tags"])["noetl/price_version"] == "d"
        total = sum(r["BilledCost"] for r in rows)
        assert total == pytest.approx(86.4)  # capacity: everything, idle included, is billed to someone
    r = runner.invoke(cli, ["facts", "focus-export", "--clickhouse", url, "--out", str(tmp_path / "acme.csv"),
                            "--tenant", "acme", "--start", DAY, "--end", DAY])  # fmt: skip
    assert r.exit_code == 0 and "BilledCost" in r.output
    assert {row["BillingAccountId"] for row in pcsv.read_csv(tmp_path / "acme.csv").to_pylist()} == {"acme"}
    for args, message in (
        (["--out", str(tmp_path / "bill.txt")], "unknown export format 'txt'"),
        (["--out", str(tmp_path / "missing" / "bill.csv")], "does not exist"),
        (["--out", str(tmp_path)], "is a directory"),
        (["--out", str(tmp_path / "x.csv"), "--start", "March"], "--start must be a date"),
        (
            ["--out", str(tmp_path / "x.csv"), "--start", "2026-03-11", "--end", "2026-03-10"],
            "is after --end",
        ),
    ):
        r = runner.invoke(cli, ["facts", "focus-export", "--clickhouse", url, "--all-tenants", *args])
        assert r.exit_code == 2, (args, r.output)
        assert message in r.output and "Traceback" not in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "bill.txt").exists()
    assert date.fromisoformat(DAY)  # the fixture's day
