"""The static dashboard outputs are tenant-scoped like the server (DESIGN.md "Guarantees at one
gate"): the rendered HTML/PNG page (``noetl-dagster dashboard``) and the Grafana JSON
(``noetl-dagster dashboard grafana``, ``python -m analytics.grafana``) read through
``noetl_analytics.dashboard_access`` (``TenantScope`` / ``scoped_sql``), and say whose rows only when
told: ``--tenant T [--project P]`` or, for an operator, ``--all-tenants``.

Real runs of three tenant/projects exported to a chdb facts store; the Grafana panels' SQL is run
against it as the ClickHouse plugin would (its time macro expanded).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from noetl_analytics.dashboard import render_dashboard
from noetl_analytics.dashboard_access import Viewer, scoped_sql
from noetl_analytics.exporter import FactExporter
from noetl_analytics.grafana import build_dashboard
from noetl_analytics.grafana import main as grafana_main
from noetl_analytics.panels import PANELS
from noetl_analytics.rollups import refresh_rollups
from noetl_analytics.store import FactsStore, close_all
from noetl_dagster.commands.facts_demo import run_playbooks
from noetl_dagster.commands.main import cli
from noetl_dagster.storage.events import SqliteEventStore

HERE = Path(__file__).parent
TENANTS = (("acme", "sales"), ("acme", "lab"), ("globex", "research"))
VIEWERS = {
    "acme": Viewer.of_tenant("acme"),
    "acme/lab": Viewer.of_tenant("acme", "lab"),
    "globex": Viewer.of_tenant("globex"),
}
# what each viewer must never see (tenant and project names appear in the panels' labels)
FOREIGN = {
    "acme": ("globex", "research"),
    "acme/lab": ("globex", "research", "sales"),
    "globex": ("acme", "sales"),
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("static_tenancy")
    log = SqliteEventStore(d / "events.db")
    playbooks = sorted((HERE / "playbooks").glob("*.yaml"))
    results = run_playbooks(playbooks, d, tenants=TENANTS, event_store=log)
    assert not [r for *_, r in results if isinstance(r, Exception)]
    store = FactsStore(f"chdb://{d / 'facts'}")
    FactExporter(store, log).export()
    log.close()
    refresh_rollups(store)
    yield {"dir": d, "store": store, "facts": f"chdb://{d / 'facts'}"}
    close_all()


def _cells(rows) -> str:
    return json.dumps([list(map(str, r)) for r in rows])


def _totals(panels) -> dict[str, float]:
    summary = next(p for p in panels if p.panel.key == "summary")
    return {c: float(v or 0) for c, v in zip(summary.columns, summary.rows[0], strict=True)}


def test_rendered_page_holds_only_the_viewers_rows(world, tmp_path):
    """Every panel of a tenant's page: no other tenant's (or project's) name; the totals of the
    tenants' pages add up to the operator's page (each row counted once, in one tenant)."""
    everyone = render_dashboard(world["store"], tmp_path / "all", viewer=Viewer.everyone())
    assert "globex" in _cells(next(p for p in everyone.panels if p.panel.key == "cost_per_tenant").rows)
    totals = {}
    for name, viewer in VIEWERS.items():
        dash = render_dashboard(world["store"], tmp_path / name.replace("/", "_"), viewer=viewer)
        for result in dash.panels:
            cells = _cells(result.rows)
            for other in FOREIGN[name]:
                assert other not in cells, (name, result.panel.key, cells[:300])
        page = dash.html.read_text()
        assert f"<div class='meta'>{name} · " in page
        for other in FOREIGN[name]:
            assert not re.search(rf"<td>[^<]*\b{other}\b", page), (name, other)
        totals[name] = _totals(dash.panels)
    assert totals["acme"]["executions"] > totals["acme/lab"]["executions"] > 0
    for col in (
        "executions",
        "failed_executions",
        "step_runs",
        "task_attempts",
        "failed_attempts",
        "bytes_stored",
    ):
        assert totals["acme"][col] + totals["globex"][col] == _totals(everyone.panels)[col], col


def test_every_panel_names_its_tenant_columns():
    """A panel without ``$scope`` is refused by the gate (a new panel cannot forget the filter)."""
    for p in PANELS:
        scoped_sql(p.sql, Viewer.of_tenant("acme"))  # raises without $scope
    with pytest.raises(RuntimeError, match=r"without \$scope"):
        scoped_sql("SELECT count() FROM $db.task_fact", Viewer.of_tenant("acme"))


@pytest.mark.parametrize("name", sorted(VIEWERS))
def test_grafana_json_of_a_tenant_queries_only_its_rows(world, name):
    viewer = VIEWERS[name]
    dash = build_dashboard(world["store"].database, viewer=viewer)
    assert dash["title"] == f"NoETL facts: {name}" and dash["uid"] == "noetl-facts-" + name.replace("/", "-")
    for panel in dash["panels"]:
        sql = panel["targets"][0]["rawSql"]
        assert "$scope" not in sql and f"tenant_id = '{viewer.tenant}'" in sql, panel["title"]
        sql = re.sub(r"\$__timeFilter\(([^)]+)\)", r"\1 >= now() - INTERVAL 30 DAY AND \1 <= now()", sql)
        _, rows = world["store"].query(sql)
        cells = _cells(rows)
        for other in FOREIGN[name]:
            assert other not in cells, (name, panel["title"], cells[:300])


def test_grafana_tenant_names_are_checked_before_they_are_written_into_sql():
    for bad in ("x' OR 1=1 --", "a\\'b", "$__all", ""):
        with pytest.raises(Exception, match="invalid tenant"):
            build_dashboard(viewer=Viewer.of_tenant(bad))
    with pytest.raises(Exception, match="invalid project"):
        build_dashboard(viewer=Viewer.of_tenant("acme", "p' OR '1"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "say whose rows to write: --tenant T (one tenant) or --all-tenants"),
        (["--tenant", "acme", "--all-tenants"], "say whose rows to write"),
        (["--project", "lab"], "say whose rows to write"),
        (["--tenant", "acme'--"], "invalid tenant"),
    ],
)
@pytest.mark.parametrize("command", ["render", "grafana", "focus"])
def test_static_outputs_need_an_explicit_scope(world, tmp_path, command, args, message):
    out = tmp_path / "out"
    if command == "render":
        argv = ["dashboard", "--clickhouse", world["facts"], "--data-dir", str(world["dir"]), "--no-export"]
        argv += ["--out", str(out), *args]
    elif command == "focus":
        argv = [
            "facts",
            "focus-export",
            "--clickhouse",
            world["facts"],
            "--out",
            str(out / "bill.csv"),
            *args,
        ]
    else:
        argv = ["dashboard", "grafana", "-o", str(out / "g.json"), *args]
    r = CliRunner().invoke(cli, argv)
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert r.output.strip().count("\n") == 0, r.output
    assert not out.exists()


def test_cli_render_and_grafana_for_one_tenant(world, tmp_path):
    out = tmp_path / "globex"
    r = CliRunner().invoke(cli, ["dashboard", "--clickhouse", world["facts"], "--data-dir", str(world["dir"]),
                                 "--no-export", "--out", str(out), "--tenant", "globex"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "(globex)" in r.output
    page = (out / "index.html").read_text()
    assert not re.search(r"<td>[^<]*\b(acme|sales|lab)\b", page)
    r = CliRunner().invoke(
        cli, ["dashboard", "grafana", "-o", str(tmp_path / "g.json"), "--tenant", "globex"]
    )
    assert r.exit_code == 0, r.output
    dash = json.loads((tmp_path / "g.json").read_text())
    assert all("tenant_id = 'globex'" in p["targets"][0]["rawSql"] for p in dash["panels"])


def test_grafana_module_needs_a_scope_too(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        grafana_main(["-o", str(tmp_path / "g.json")])
    assert e.value.code == 2 and "--all-tenants" in capsys.readouterr().err
    grafana_main(["--tenant", "acme", "-o", str(tmp_path / "g.json")])
    assert json.loads((tmp_path / "g.json").read_text())["uid"] == "noetl-facts-acme"


def test_focus_export_of_one_tenant_or_project(world, tmp_path):
    """The FOCUS chargeback file reads through the same gate: a tenant's (project's) rows only."""
    import pyarrow.csv as pcsv  # noqa: PLC0415

    seen = {}
    for key, args in (("lab", ["--tenant", "acme", "--project", "lab"]), ("globex", ["--tenant", "globex"]),
                      ("all", ["--all-tenants"])):  # fmt: skip
        out = tmp_path / f"{key}.csv"
        r = CliRunner().invoke(
            cli, ["facts", "focus-export", "--clickhouse", world["facts"], "--out", str(out), *args]
        )
        assert r.exit_code == 0, r.output
        rows = pcsv.read_csv(out).to_pylist()
        seen[key] = {(row["BillingAccountId"], row["SubAccountId"]) for row in rows}
    assert seen["lab"] == {("acme", "lab")}
    assert seen["globex"] == {("globex", "research")}
    assert {("acme", "lab"), ("acme", "sales"), ("globex", "research")} <= seen["all"]
