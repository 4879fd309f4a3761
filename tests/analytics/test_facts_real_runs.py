"""Facts from real executions (every example playbook and this folder's playbooks,
for two tenants): totals equal what the event log says, re-export is idempotent,
the dashboard renders, the Grafana panels' SQL runs, the CLI works."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import pytest
from click.testing import CliRunner
from facts_helpers import fact_totals

from noetl_analytics.dashboard import render_dashboard
from noetl_analytics.dashboard_access import Viewer
from noetl_analytics.exporter import FactExporter
from noetl_analytics.grafana import GRAFANA_JSON, build_dashboard, render_json
from noetl_analytics.panels import PANELS
from noetl_analytics.rollups import refresh_rollups
from noetl_analytics.store import close_all
from noetl_dagster.commands.main import cli
from noetl_dagster.engine import events as E
from noetl_dagster.storage.event_stores import open_event_store


def _walk_refs(value: Any, created: dict[str, int]) -> None:
    """Every stored object the events point at: ``$ref`` envelopes and published tables."""
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get("$ref"), dict):
            created[value["$ref"]["uri"]] = value["$ref"]["size"]
            return
        uri = value.get("uri")
        if isinstance(uri, str) and uri.startswith("noetl://") and "checksum" in value and "size" in value:
            created[uri] = value["size"] or 0
        for v in value.values():
            _walk_refs(v, created)
    elif isinstance(value, list):
        for v in value:
            _walk_refs(v, created)


def log_totals(url: str) -> dict[str, int]:
    log = open_event_store(url)
    events = [s.event for s in log.iter_all()]
    log.close()
    names = Counter(e.name for e in events)
    created: dict[str, int] = {}
    for e in events:
        _walk_refs(e.data, created)
    return {
        "executions": names[E.EXECUTION_REQUESTED],
        "failed_executions": sum(
            e.name == E.WORKFLOW_FINISHED and e.data.get("status") == "failed" for e in events
        ),
        "step_runs": names[E.STEP_DONE] + names[E.STEP_FAILED],
        "failed_steps": names[E.STEP_FAILED],
        "task_attempts": names[E.TASK_DONE],
        "failed_attempts": sum(
            e.name == E.TASK_DONE and e.data["outcome"]["status"] == "error" for e in events
        ),
        "iterations": names[E.LOOP_ITERATION_DONE] + names[E.LOOP_ITERATION_FAILED],
        "bytes": sum(created.values()),
    }


@pytest.fixture
def exported(real_runs, facts_store):
    data_dir, url, results = real_runs
    log = open_event_store(url)
    report = FactExporter(facts_store, log).export()
    yield facts_store, log, report, results
    log.close()


def test_fact_totals_equal_the_event_log(exported, real_runs):
    store, log, report, results = exported
    expected = log_totals(real_runs[1])
    # the runs cover what the totals count
    assert expected["failed_executions"] >= 2 and expected["failed_attempts"] > expected["failed_executions"]
    assert expected["bytes"] > 0 and expected["iterations"] > 0
    assert report.events == log.tail_last() and report.lag_events == 0
    assert fact_totals(store) == expected
    # one execution row per run started by the test (sub-playbooks add their own)
    top_level = store.scalar("SELECT count() FROM $db.execution_dim WHERE parent_execution_id = ''")
    assert top_level == len(results)


def test_reexport_from_zero_is_idempotent(exported):
    store, log, _, _ = exported
    before = fact_totals(store)
    exporter = FactExporter(store, log)
    exporter.save_cursor(0)  # as if every cursor update had been lost
    again = exporter.export()
    assert again.events == log.tail_last()
    assert fact_totals(store) == before


def test_registry_reads_and_writes_are_resource_facts(exported):
    store = exported[0]
    rows = store.query_dicts(
        "SELECT action, format, any(store) AS store, count() AS n FROM $db.resource_fact"
        " WHERE startsWith(uri, 'noetl://') GROUP BY action, format ORDER BY action"
    )
    assert [(r["action"], r["format"]) for r in rows] == [("created", "parquet"), ("read", "parquet")]


def test_dashboard_renders_from_real_runs(exported, tmp_path):
    store = exported[0]
    refresh_rollups(store)
    dash = render_dashboard(store, tmp_path / "dash", viewer=Viewer.everyone())
    assert {p.name for p in dash.pngs} == {f"{p.key}.png" for p in PANELS if p.chart != "stat"}
    for png in dash.pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    for result in dash.panels:
        assert result.rows, f"panel {result.panel.key} has no data"
    html = dash.html.read_text()
    # self-contained: charts inlined, nothing fetched
    assert html.count("data:image/png;base64,") == len(dash.pngs)
    assert not re.search(r"""(src|href)=['"]https?://""", html)
    tenants = {r[1] for r in next(p for p in dash.panels if p.panel.key == "cost_per_tenant").rows}
    assert tenants == {"acme", "globex", "__idle__"}  # the packaged prices leave idle capacity unallocated


def test_grafana_json_is_generated_and_its_sql_runs(exported):
    store = exported[0]
    refresh_rollups(store)
    assert json.loads(GRAFANA_JSON.read_text()) == build_dashboard(viewer=Viewer.everyone()), (
        "run: python -m analytics.grafana"
    )
    assert GRAFANA_JSON.read_text() == render_json(viewer=Viewer.everyone())
    dash = build_dashboard(viewer=Viewer.everyone())
    assert {p["datasource"]["type"] for p in dash["panels"]} == {"grafana-clickhouse-datasource"}
    for panel in dash["panels"]:
        sql = panel["targets"][0]["rawSql"]
        # the Grafana macro, expanded the way the plugin does for the last 30 days
        sql = re.sub(r"\$__timeFilter\(([^)]+)\)", r"\1 >= now() - INTERVAL 30 DAY AND \1 <= now()", sql)
        _, rows = store.query(sql)
        assert rows, panel["title"]


def test_cli_export_query_dashboard(real_runs, tmp_path):
    data_dir, url, _ = real_runs
    close_all()  # the CLI opens the embedded store itself
    facts = f"chdb://{tmp_path / 'cli_facts'}"
    runner = CliRunner()
    out = runner.invoke(cli, ["facts", "export", "--clickhouse", facts, "--events", url, "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert report["events"] > 0 and report["lag_events"] == 0
    out = runner.invoke(cli, ["facts", "export", "--clickhouse", facts, "--events", url, "--json"])
    assert json.loads(out.output)["events"] == 0
    out = runner.invoke(
        cli,
        [
            "facts",
            "query",
            "--clickhouse",
            facts,
            "--json",
            "SELECT tenant_id, count() AS n FROM $db.execution_dim GROUP BY tenant_id ORDER BY tenant_id",
        ],
    )
    assert out.exit_code == 0, out.output
    assert [r["tenant_id"] for r in json.loads(out.output)] == ["acme", "globex"]
    out = runner.invoke(cli, ["facts", "query", "--clickhouse", facts, "SELECT count() FROM noetl.task_fact"])
    assert out.exit_code == 0 and "1 row(s)" in out.output
    bad = runner.invoke(cli, ["facts", "query", "--clickhouse", facts, "SELECT nope FROM noetl.task_fact"])
    assert bad.exit_code == 2 and "error:" in bad.output
    # facts query is read-only (ClickHouse's readonly=1): writes and DDL are refused, the data stays
    for write in ("TRUNCATE TABLE $db.task_fact", "INSERT INTO $db.task_fact (execution_id) VALUES ('x')",
                  "DROP TABLE $db.task_fact", "ALTER TABLE $db.task_fact DELETE WHERE 1",
                  "CREATE TABLE $db.z (a Int8) ENGINE = Memory", "OPTIMIZE TABLE $db.task_fact",
                  "SYSTEM FLUSH LOGS", "SET readonly = 0"):  # fmt: skip
        bad = runner.invoke(cli, ["facts", "query", "--clickhouse", facts, write])
        assert bad.exit_code == 2 and "read-only" in bad.output and "Traceback" not in bad.output, bad.output
    out = runner.invoke(
        cli, ["facts", "query", "--clickhouse", facts, "--json", "SELECT count() AS n FROM $db.task_fact"]
    )
    assert json.loads(out.output)[0]["n"] > 0
    bad = runner.invoke(cli, ["facts", "export", "--clickhouse", "mysql://x", "--events", url])
    assert bad.exit_code == 2 and "unsupported facts store URL" in bad.output
    out = runner.invoke(
        cli,
        ["dashboard", "--clickhouse", facts, "--events", url, "--out", str(tmp_path / "d"), "--all-tenants"],
    )
    assert out.exit_code == 0, out.output
    assert (tmp_path / "d" / "index.html").is_file() and (tmp_path / "d" / "cost_per_tenant.png").is_file()
    bad_prices = tmp_path / "p.yaml"
    bad_prices.write_text("versions: [{compute: {default: -1}}]")
    out = runner.invoke(cli, ["facts", "refresh", "--clickhouse", facts, "--prices", str(bad_prices)])
    assert out.exit_code == 2 and "non-negative" in out.output
    close_all()
