"""Stored references across executions (issue costscope): two real executions (Dagster,
execute_in_process) of one playbook write a table (``kind: parquet``, a new version each) and name
one user-chosen uri with no producer as a step's result (a path every run writes again). Each
execution bills its own writes once, so the page (explain), the facts (exported in small batches,
rolled up, re-exported), the static dashboard's Totals tile, the FOCUS export, ``cost_of_events``
per execution and the sum of the ops' cost metadata agree. Before, the priced table's ``GROUP BY
key`` billed the producer-less uri once across all executions while the Python views billed it in
each (the facts were short by one write)."""

from __future__ import annotations

import dagster as dg
import pytest
import yaml

from noetl_analytics.execution_view import ExecutionViews
from noetl_analytics.exporter import FactExporter
from noetl_analytics.pricing import Cost, PriceTable, cost_of_events
from noetl_analytics.rollups import refresh_rollups
from noetl_analytics.store import FactsStore, close_all
from noetl_dagster.engine.usage_lines import created_refs
from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.translator import compile_playbooks

PRICES = {
    "currency": "USD",
    "versions": [
        {
            "version": "p-1",
            "valid_from": "2000-01-01",
            "compute": 36.0,
            "ram": 3.6,
            "storage": {"default": 500000.0},  # the tables' few kB are cents, as the CPU
            "call": {"default": 0.0002},
            "platform": 18.0,
        }
    ],
}

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: shared_table, path: tests/shared_table}
workflow:
  - step: start
    tool:
      - rows:
          kind: python
          code: |
            result = [{"k": i, "v": i * i} for i in range(200)]
    next: {arcs: [{step: save}]}
  - step: save
    tool:
      - put:
          kind: parquet
          uri: noetl://demo/examples/costs/dataset/shared_table
          data: "{{ start }}"
    next: {arcs: [{step: report}]}
  - step: report
    tool:
      - publish:
          kind: python
          code: |
            # a report at a path the user chose, written again by every run: no producer in it
            result = {"uri": "noetl://demo/examples/reports/dataset/daily", "store": "file",
                      "format": "json", "size": 40000, "checksum": "sha256:00"}
"""
USER_URI = "noetl://demo/examples/reports/dataset/daily"


def _op_costs(result) -> float:  # noqa: ANN001
    total = 0.0
    for node in result.job_def.nodes:
        for ev in result.events_for_node(node.name):
            if ev.event_type_value == "STEP_OUTPUT" and ev.step_output_data.output_name == "result":
                md = ev.step_output_data.metadata
                total += md["noetl/cost/usd"].value if "noetl/cost/usd" in md else 0.0
    return total


def test_two_executions_writing_one_uri_cost_the_same_in_every_view(tmp_path):
    pb = tmp_path / "shared_table.yaml"
    pb.write_text(PLAYBOOK)
    data = tmp_path / "noetl"
    data.mkdir()
    (data / "prices.yaml").write_text(yaml.safe_dump(PRICES))
    res = NoetlResource(data_dir=str(data), tenant="demo", project="examples")
    job = compile_playbooks(pb, resource=res, include_sensor=False).definitions.resolve_job_def(
        "shared_table"
    )
    eids, ops = [], 0.0
    with dg.instance_for_test() as inst:
        for _ in range(2):
            result = job.execute_in_process(instance=inst, raise_on_error=False)
            assert result.success
            eids.append(inst.get_run_by_id(result.run_id).tags["noetl/execution_id"])
            ops += _op_costs(result)
    prices = PriceTable.load(data_dir=data)
    log = open_event_store(None, data_dir=data)
    try:
        logs = {eid: log.read(eid) for eid in eids}
        python = {eid: sum(cost_of_events(prices, evs).values(), Cost()) for eid, evs in logs.items()}
        assert all(c.storage > 0 for c in python.values())  # each execution wrote the table
        # the case: both executions name the one producer-less uri
        for evs in logs.values():
            assert any(r["uri"] == USER_URI and "execution_id" not in r
                       for e in evs for r in created_refs(e.name, e.data))  # fmt: skip
        views = ExecutionViews(log, data_dir=str(data))
        page = {eid: views.explain(eid)["totals"]["cost"] for eid in eids}
        store = FactsStore(f"chdb://{tmp_path / 'facts'}")
        exporter = FactExporter(store, log, batch_events=7, prices=prices)
        exporter.export()
        facts, again = _priced_total_then_reexported(exporter, store, prices)
        tile, focus = _dashboard_tile_and_focus(store, tmp_path / "dash")
    finally:
        log.close()
        close_all()
    py_total = sum(c.total for c in python.values())
    assert sum(page.values()) == pytest.approx(py_total, abs=1e-9)
    assert facts == pytest.approx(py_total, abs=1e-9)
    assert again == pytest.approx(facts, abs=1e-12)
    assert tile == pytest.approx(py_total, abs=1e-9) and focus == pytest.approx(py_total, abs=1e-9)
    assert ops == pytest.approx(py_total - sum(c.platform for c in python.values()), abs=1e-9)


def _dashboard_tile_and_focus(store, out) -> tuple[float, float]:  # noqa: ANN001
    """The static dashboard's Totals tile (rendered) and the FOCUS export's BilledCost, all tenants."""
    from noetl_analytics.dashboard import render_dashboard  # noqa: PLC0415
    from noetl_analytics.dashboard_access import Viewer  # noqa: PLC0415
    from noetl_analytics.focus import focus_table  # noqa: PLC0415

    summary = next(p for p in render_dashboard(store, out, viewer=Viewer.everyone()).panels
                   if p.panel.key == "summary")  # fmt: skip
    tile = summary.rows[0][summary.columns.index("cost")]
    return tile, sum(focus_table(store, viewer=Viewer.everyone()).column("BilledCost").to_pylist())


def _log(eid: str, refs: list[dict], parent: str | None = None) -> list:
    from datetime import UTC, datetime, timedelta

    from noetl_dagster.engine.events import Event

    t0 = datetime(2026, 3, 2, 12, tzinfo=UTC)
    out = []

    def ev(name: str, data: dict, **kw) -> None:  # noqa: ANN003
        ts = (t0 + timedelta(milliseconds=100 * len(out))).isoformat(timespec="microseconds")
        out.append(Event(name, eid, data, tenant_id="acme", project_id="p", timestamp=ts,
                         parent_execution_id=parent, **kw))  # fmt: skip

    ev("playbook.execution.requested", {"playbook": "t/x"})
    for i, ref in enumerate(refs):
        run = f"{eid}-r{i}"
        ev("step.scheduled", {}, step=f"s{i}", step_run_id=run)
        ev("task.done", {"kind": "python", "outcome": {"status": "ok", "result": {"$ref": ref},
           "meta": {"duration_ms": 10, "cpu_ms": 5}}}, step=f"s{i}", step_run_id=run)  # fmt: skip
        ev("step.done", {"result": {"$ref": ref}}, step=f"s{i}", step_run_id=run)
    ev("workflow.finished", {"status": "completed", "platform": {"cpu_s": 0.5}})
    return out


def test_a_reference_is_billed_to_its_producer_not_to_a_parent_passing_it_on(tmp_path):
    """A child's reference handed to its parent unchanged is billed to the child only: every view agrees."""
    from noetl_analytics.execution_view import pricer
    from noetl_dagster.engine.explain import explain
    from noetl_dagster.storage.events import SqliteEventStore

    home = tmp_path / "home"
    home.mkdir()
    (home / "prices.yaml").write_text(yaml.safe_dump({**PRICES, "versions": [{**PRICES["versions"][0],
                                                      "valid_from": "2026-01-01", "storage": {"default": 0.023}}]}))  # fmt: skip
    child_ref = {"uri": "s3://b/child/out.json", "store": "s3", "format": "json", "size": 4 * 10**9,
                 "checksum": "c1", "execution_id": "child"}  # fmt: skip
    shared = {
        "uri": "s3://b/shared.json",
        "store": "s3",
        "format": "json",
        "size": 2 * 10**9,
        "checksum": "c2",
    }
    child = _log("child", [child_ref, shared], parent="parent")
    parent = _log("parent", [child_ref])
    events = child + parent
    prices = PriceTable.load(data_dir=home)
    python = {e: sum(cost_of_events(prices, [x for x in events if x.execution_id == e]).values(), Cost())
              for e in ("child", "parent")}  # fmt: skip
    price, _ = pricer(data_dir=str(home))
    page = {e: explain([x for x in events if x.execution_id == e], price=price).data["totals"]["cost"]
            for e in ("child", "parent")}  # fmt: skip
    # the parent does not pay for the child's reference it passed on
    assert python["child"].storage > 0 and python["parent"].storage == 0
    log = SqliteEventStore(tmp_path / "events.db")
    try:
        log.append(events)
        store = FactsStore(f"chdb://{tmp_path / 'facts'}")
        exporter = FactExporter(store, log, batch_events=3, prices=prices)
        exporter.export()
        facts, again = _priced_total_then_reexported(exporter, store, prices)
    finally:
        log.close()
        close_all()
    for e in ("child", "parent"):
        assert page[e] == pytest.approx(python[e].total, abs=1e-9)
    assert facts == pytest.approx(sum(c.total for c in python.values()), abs=1e-9)
    assert again == pytest.approx(facts, abs=1e-12)


def _priced_total_then_reexported(exporter, store, prices) -> tuple[float, float]:
    """The priced total after the export so far, and again after a re-export from cursor 0 (which
    must not double it)."""
    refresh_rollups(store, prices)
    facts = store.scalar("SELECT sum(amount) FROM $db.cost_line_day FINAL")
    exporter.save_cursor(0)
    exporter.export()
    refresh_rollups(store, prices)
    return facts, store.scalar("SELECT sum(amount) FROM $db.cost_line_day FINAL")
