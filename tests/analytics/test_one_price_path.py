"""One price path (issue 30.1): the same runs cost the same through every view, to a millionth of a cent.

Runs: two tenants' local runs of a playbook (one step declares Kubernetes requests), one Dagster run
(execute_in_process) of the same playbook for a third tenant, and an execution of recorded events
with a GPU attempt, an egress-heavy call, a stored result and the engine's own CPU on its terminal
event (the ``platform`` line), all in one event log, exported and priced with one price file.
Views: the priced table, the static render (its Totals tile and its cost-per-tenant panel), the
shipped Grafana JSON's SQL, the interactive dashboard's data, the Dagster run tag and the cost
rollup asset's metadata, the ``facts query`` examples of docs/analytics.md, the FOCUS export, and
the Python pricing Dagster uses (every event of the log)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from noetl_analytics.dashboard import render_dashboard
from noetl_analytics.dashboard_access import Viewer
from noetl_analytics.exporter import FactExporter
from noetl_analytics.focus_rules import check_csv, check_table
from noetl_analytics.grafana import GRAFANA_JSON
from noetl_analytics.interactive import cluster_summary, dashboard_data
from noetl_analytics.pricing import Cost, PriceTable, cost_of_events
from noetl_analytics.rollups import refresh_rollups
from noetl_analytics.store import FactsStore, close_all
from noetl_dagster.commands.main import cli
from noetl_dagster.engine.events import Event
from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.sensors.facts import ROLLUPS_KEY, FactsStoreResource, build_facts_definitions
from noetl_dagster.storage.events import SqliteEventStore
from noetl_dagster.translator import compile_playbooks

ROOT = Path(__file__).resolve().parents[2]
CENT_MILLIONTH = 1e-8  # USD
PRICES = {
    "currency": "USD",
    "worker_class_by_kind": {"duckdb": "cpu.large"},
    "versions": [
        {"version": "old", "valid_from": "2000-01-01", "compute": 1.0},
        {
            "version": "p-1",
            "valid_from": "2026-01-01",
            "compute": {"default": 36.0, "cpu.large": 72.0},  # 1 cent per CPU-second: visible figures
            "ram": 3.6,
            "gpu": {"default": 2.48, "a100": 4.1},
            "egress": {"default": 0.09, "eu-west": 0.12},
            "storage": {"default": 0.023, "s3": 0.025},
            "storage_months": 3,
            "call": {"python": 0.0001, "http": 0.0002},
            "platform": 18.0,
        },
    ],
}
PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: price_path, path: tests/price_path}
workflow:
  - step: start
    tool:
      - crunch:
          kind: python
          code: |
            t = 0
            for i in range(150000):
                t += i * i
            result = {"t": t % 97}
    next: {arcs: [{step: reserved}]}
  - step: reserved
    spec: {resources: {cpu: "2", memory: 1Gi}}
    tool:
      - nap:
          kind: python
          code: |
            import time
            time.sleep(0.05)
            result = {"ok": True}
"""
SYNTH = "exec-recorded-1"


def _recorded(ts: str) -> list[Event]:
    """An execution as recorded events: a GPU attempt, an HTTP call with egress, a stored result, and the
    engine's own CPU on the terminal event (what the meter records there)."""

    def done(step: str, kind: str, meta: dict) -> Event:  # noqa: ANN202
        outcome = {"status": "ok", "result": {"ok": 1}, "meta": {"attempt": 1, **meta}}
        return Event(
            "task.done",
            SYNTH,
            {"task": f"{step}_t", "kind": kind, "outcome": outcome},
            step=step,
            step_run_id=f"{SYNTH}-{step}",
            attempt=1,
            tenant_id="initech",
            project_id="ml",
            timestamp=ts,
        )

    ref = {
        "$ref": {
            "uri": "s3://b/initech/r.json",
            "store": "s3",
            "format": "json",
            "size": 4_000_000_000,
            "checksum": "x",
        }
    }
    return [
        Event("playbook.execution.requested", SYNTH, {"playbook": "tests/recorded"}, tenant_id="initech",
              project_id="ml", timestamp=ts),
        done("train", "python", {"duration_ms": 90_000, "gpu_class": "a100",
                                 "usage": {"cpu_s": 12.5, "gpu_s": 180.0, "mem_delta_bytes": 2_000_000_000}}),
        done("push", "http", {"duration_ms": 800, "region": "eu-west", "usage": {"cpu_s": 0.02, "egress_bytes": 3_500_000_000}}),
        Event("step.done", SYNTH, {"result": ref, "duration_ms": 91_000}, step="train", step_run_id=f"{SYNTH}-train",
              tenant_id="initech", project_id="ml", timestamp=ts),
        Event("workflow.finished", SYNTH, {"status": "completed", "platform": {"cpu_s": 0.75, "window": "execution"}},
              tenant_id="initech", project_id="ml", timestamp=ts),
    ]  # fmt: skip


@pytest.fixture
def priced(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "prices.yaml").write_text(yaml.safe_dump(PRICES))
    pb = tmp_path / "price_path.yaml"
    pb.write_text(PLAYBOOK)
    for tenant, project in (("acme", "sales"), ("globex", "research")):
        r = run_playbook(pb, None, data_dir=home, tenant=tenant, project=project)
        assert r.status == "completed", r.to_json()
    loc = compile_playbooks(pb, resource=NoetlResource(data_dir=str(home), tenant="hooli", project="ops"),
                            include_sensor=False)  # fmt: skip
    with dg.instance_for_test() as instance:
        result = loc.definitions.resolve_job_def("price_path").execute_in_process(instance=instance)
        assert result.success
        run_tags = dict(instance.get_run_by_id(result.run_id).tags)
    log = SqliteEventStore(home / "events.db")
    try:
        first = log.tail(0, 1)[0].event.timestamp
        log.append(_recorded(first))
        events = [s.event for s in log.tail(0, 1_000_000)]
        store = FactsStore(f"chdb://{tmp_path / 'facts'}")
        FactExporter(store, log, prices=PriceTable.load(data_dir=home)).export()
    finally:
        log.close()
    refresh_rollups(store, PriceTable.load(data_dir=home))
    yield home, store, events, run_tags, tmp_path
    close_all()


def _doc_queries() -> list[str]:
    text = (ROOT / "docs" / "analytics.md").read_text()
    return re.findall(r'noetl-dagster facts query "([^"]*cost[^"]*)"', text)


def test_every_view_shows_the_same_total(priced):
    home, store, events, run_tags, tmp_path = priced
    prices = PriceTable.load(data_dir=home)
    views: dict[str, float] = {}
    views["priced table (cost_line_day)"] = store.scalar("SELECT sum(amount) FROM $db.cost_line_day FINAL")

    dash = render_dashboard(store, tmp_path / "dash", viewer=Viewer.everyone())
    panels = {p.panel.key: p for p in dash.panels}
    summary = panels["summary"]
    views["static render: Totals tile"] = summary.rows[0][summary.columns.index("cost")]
    per_tenant = panels["cost_per_tenant"]
    views["static render: cost per tenant"] = sum(
        r[per_tenant.columns.index("amount")] for r in per_tenant.rows
    )

    grafana = {p["title"]: p["targets"][0]["rawSql"] for p in json.loads(GRAFANA_JSON.read_text())["panels"]}
    for title, column in (("Totals", "cost"), ("Cost per tenant over time", "amount")):
        sql = re.sub(r"\$__timeFilter\([^)]+\)", "1 = 1", grafana[title]).replace("noetl.", "$db.")
        cols, rows = store.query(sql)
        views[f"Grafana JSON: {title}"] = sum(r[cols.index(column)] for r in rows)

    data = dashboard_data(store)
    views["interactive: /api/data rows"] = sum(r["cost"] for r in data["rows"])
    views["interactive: allocated + unallocated"] = sum(
        d["allocated"] + d["unallocated"] for d in cluster_summary(store)
    )

    defs = build_facts_definitions(
        resource=FactsStoreResource(clickhouse_url=store.url, data_dir=str(home), event_store_url=f"sqlite:///{home / 'events.db'}"),
        rollup_cron=None,
    )  # fmt: skip
    with dg.instance_for_test() as instance:
        res = defs.resolve_job_def("noetl_cost_rollups_job").execute_in_process(instance=instance)
        assert res.success
        md = {
            e.materialization.asset_key: e.materialization.metadata
            for e in res.get_asset_materialization_events()
        }
    views["Dagster asset noetl/cost_rollups: total_cost"] = md[ROLLUPS_KEY]["total_cost"].value
    views["Dagster asset noetl/cost_rollups: noetl/cost"] = md[ROLLUPS_KEY]["noetl/cost"].value

    runner = CliRunner()
    queries = _doc_queries()
    assert queries, "docs/analytics.md shows a `facts query` example over the cost tables"
    for q in queries:
        out = runner.invoke(cli, ["facts", "query", "--clickhouse", store.url, "--json", q])
        assert out.exit_code == 0, out.output
        rows = json.loads(out.output)
        views[f"facts query: {q}"] = sum(r["cost"] for r in rows)

    for fmt in ("csv", "parquet"):
        out_file = tmp_path / f"focus.{fmt}"
        out = runner.invoke(
            cli, ["facts", "focus-export", "--clickhouse", store.url, "--out", str(out_file), "--all-tenants"]
        )
        assert out.exit_code == 0, out.output
        # the export of real runs follows the FOCUS 1.2 rules (formats, nulls, values, ListCost)
        errors = check_table(pq.read_table(out_file)) if fmt == "parquet" else check_csv(out_file)
        print(f"FOCUS {fmt} rule errors: {len(errors)}")
        assert errors == [], errors[:10]
        if fmt == "parquet":
            views["FOCUS export (Parquet): BilledCost"] = sum(
                pq.read_table(out_file).column("BilledCost").to_pylist()
            )
        else:
            import pyarrow.csv as pcsv  # noqa: PLC0415

            views["FOCUS export (CSV): BilledCost"] = sum(
                pcsv.read_csv(out_file).column("BilledCost").to_pylist()
            )

    python = sum(cost_of_events(prices, events).values(), Cost())
    views["Python pricing (Dagster metadata) of every event"] = python.total

    total = views["priced table (cost_line_day)"]
    print(json.dumps(views, indent=1))  # the figures for the record (pytest -s)
    assert total > 0
    for name, value in views.items():
        assert value == pytest.approx(total, abs=CENT_MILLIONTH), (name, value, total)

    # the Dagster run's execution: its run tag equals its tenant's lines in the priced table
    hooli = store.scalar("SELECT sum(amount) FROM $db.cost_line_day FINAL WHERE tenant_id = 'hooli'")
    assert float(run_tags["noetl/cost_usd"]) == pytest.approx(hooli, abs=CENT_MILLIONTH) and hooli > 0
    assert run_tags["noetl/price_version"] == "p-1"


def test_platform_gpu_and_requests_lines(priced):
    _, store, events, _, _ = priced
    lines = {(c, i): (q, u, r, a) for c, i, q, u, r, a in store.query(
        "SELECT category, item, sum(quantity), sum(used), sum(requested), sum(amount) FROM $db.cost_line_day FINAL"
        " WHERE tenant_id = 'initech' GROUP BY category, item")[1]}  # fmt: skip
    # the engine's CPU on the terminal event: its own line, priced per core-hour of the platform price
    assert lines[("platform", "default")][0] == pytest.approx(0.75 / 3600)
    assert lines[("platform", "default")][3] == pytest.approx(0.75 / 3600 * 18.0)
    # GPU-hours of a GPU attempt, by GPU class
    assert lines[("gpu", "a100")][3] == pytest.approx(180 / 3600 * 4.1)
    # egress by region, storage billed once for storage_months, calls by kind
    assert lines[("egress", "eu-west")][3] == pytest.approx(3.5 * 0.12)
    assert lines[("storage", "s3")][3] == pytest.approx(4.0 * 0.025 * 3)
    assert lines[("call", "http")][3] == pytest.approx(0.0002)
    # a step that declares Kubernetes requests pays max(request, usage): 2 cores and 1 GiB for its duration
    _, rows = store.query(
        "SELECT category, sum(quantity), sum(used), sum(requested) FROM $db.cost_line_day FINAL"
        " WHERE step = 'reserved' GROUP BY category ORDER BY category"
    )
    req = {c: (q, u, r) for c, q, u, r in rows}
    naps = [e for e in events if e.name == "task.done" and e.step == "reserved"]
    hours = sum(e.data["outcome"]["meta"]["duration_ms"] for e in naps) / 3.6e6
    assert len(naps) == 3 and naps[0].data["outcome"]["meta"]["requests"] == {
        "cpu": 2.0,
        "memory_bytes": 2**30,
    }
    assert req["compute"][2] == pytest.approx(2 * hours) and req["compute"][0] == pytest.approx(2 * hours)
    assert req["compute"][1] < req["compute"][2]  # it used less than it reserved
    assert req["ram"][0] == pytest.approx(2**30 / 1e9 * hours)
    # without requests the quantity is the usage
    _, start = store.query("SELECT sum(quantity), sum(used), sum(requested) FROM $db.cost_line_day FINAL"
                           " WHERE step = 'start' AND category = 'compute'")  # fmt: skip
    assert start[0][0] == pytest.approx(start[0][1]) and start[0][2] == 0
