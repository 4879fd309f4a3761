"""Whole costs in Dagster (issue 43 item 4): on a real run of a multi-step playbook with assets, what
Dagster shows adds up to the execution's cost, priced from its event log with the same price table.

- ops lens: the ``result`` outputs' ``noetl/cost/usd`` + the cost summary's ``noetl/cost/run_usd``
  (the lines no step caused: the platform line) = the execution's cost;
- assets lens (what Insights sums): ``noetl/cost/usd`` over the run's asset materializations — the
  tables' shares and the ``noetl_cost/<job>`` summary — = the execution's cost;
both within 1e-9 USD (before, ops carried 6-88 % and assets 0-44 % of it). A repricing re-tags the run."""

from __future__ import annotations

import dagster as dg
import pytest
import yaml

from noetl_analytics.pricing import PriceTable
from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.resources.run_costs import execution_cost, reprice_run_tags
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.translator import compile_playbooks

PRICES = """\
currency: USD
allocation:
  - version: t-1
    valid_from: 2000-01-01
    cpu_core_hour: 36.0
    ram_gb_hour: 3.6
    storage_gb_month: 5000.0
"""

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: cost_whole, path: tests/cost_whole}
workflow:
  - step: start
    tool:
      - crunch:
          kind: python
          code: |
            result = sum(i * i for i in range(200000))
    next: {arcs: [{step: store}]}
  - step: store
    tool:
      - rows:
          kind: python
          code: |
            result = [{"k": i, "v": i * i} for i in range(200)]
      - save_a:
          kind: parquet
          uri: noetl://demo/examples/costs/dataset/whole_a
          data: "{{ rows }}"
      - save_b:
          kind: parquet
          uri: noetl://demo/examples/costs/dataset/whole_b
          data: "{{ rows }}"
    outputs:
      - uri: noetl://demo/examples/costs/dataset/whole_a
      - uri: noetl://demo/examples/costs/dataset/whole_b
    next: {arcs: [{step: report}]}
  - step: report
    tool:
      - tally:
          kind: python
          code: |
            result = sum(i % 7 for i in range(100000))
"""


@pytest.fixture
def whole(tmp_path):
    pb = tmp_path / "cost_whole.yaml"
    pb.write_text(PLAYBOOK)
    data = tmp_path / "noetl"
    data.mkdir()
    (data / "prices.yaml").write_text(PRICES)
    res = NoetlResource(data_dir=str(data), tenant="demo", project="examples")
    return compile_playbooks(pb, resource=res, include_sensor=False), data


def _value(md, key: str) -> float:  # noqa: ANN001
    v = md.get(key)
    return float(getattr(v, "value", v) or 0.0)


def _whole_cost(data, eid: str, prices: str = PRICES):  # noqa: ANN001, ANN202
    log = open_event_store(None, data_dir=data)
    try:
        return execution_cost(log.read(eid), PriceTable.from_dict(yaml.safe_load(prices)), eid)
    finally:
        log.close()


def _materializations(result) -> list[dg.AssetMaterialization]:  # noqa: ANN001
    return [ev.event_specific_data.materialization for ev in result.all_events
            if ev.event_type_value == "ASSET_MATERIALIZATION"]  # fmt: skip


def test_an_op_jobs_ops_assets_and_summary_add_up_to_the_execution_cost(whole):
    loc, data = whole
    with dg.instance_for_test() as inst:
        result = loc.definitions.resolve_job_def("cost_whole").execute_in_process(instance=inst)
        assert result.success
        run = inst.get_run_by_id(result.run_id)
        eid = run.tags["noetl/execution_id"]
        whole = _whole_cost(data, eid)
        assert whole.platform > 0 and whole.storage > 0 and whole.cpu > 0
        ops = sum(
            _value(ev.step_output_data.metadata, "noetl/cost/usd")
            for ev in result.all_events
            if ev.event_type_value == "STEP_OUTPUT" and ev.step_output_data.output_name == "result"
        )
        mats = _materializations(result)
        [summary] = [m for m in mats if m.asset_key.path[0] == "noetl_cost"]
        assert summary.asset_key == dg.AssetKey(["noetl_cost", "cost_whole"])
        tables = [m for m in mats if m is not summary]
        assert sorted(m.asset_key.path[-1] for m in tables) == ["whole_a", "whole_b"]
        md = summary.metadata
        # ops lens: every step's lines on its op, the rest (the platform line) on the summary
        assert ops + _value(md, "noetl/cost/run_usd") == pytest.approx(whole.total, abs=1e-9)
        assert _value(md, "noetl/cost/run_usd") == pytest.approx(whole.platform, abs=1e-12)
        assert _value(md, "noetl/cost/ops_usd") == pytest.approx(ops, abs=1e-9)
        # assets lens: the tables' shares + the summary's figure
        on_tables = sum(_value(m.metadata, "noetl/cost/usd") for m in tables)
        assert 0 < on_tables < whole.total
        assert on_tables + _value(md, "noetl/cost/usd") == pytest.approx(whole.total, abs=1e-9)
        assert _value(md, "noetl/cost/tables_usd") == pytest.approx(on_tables, abs=1e-12)
        assert _value(md, "noetl/cost/execution_usd") == pytest.approx(whole.total, abs=1e-12)
        assert md["execution_id"].value == eid and md["noetl/cost/price_version"].value == "t-1"
        # the summary is an asset's history, as Insights reads it
        latest = inst.get_latest_materialization_event(summary.asset_key)
        assert latest.asset_materialization.metadata["noetl/cost/usd"].value > 0
        tags = inst.get_run_by_id(result.run_id).tags
        assert float(tags["noetl/cost_usd"]) == pytest.approx(whole.total, abs=1e-9)
        priced_by = PriceTable.from_dict(yaml.safe_load(PRICES)).fingerprint()
        assert tags["noetl/price_fingerprint"] == priced_by


def test_an_asset_runs_tables_and_summary_add_up_to_the_execution_cost(whole):
    loc, data = whole
    job = loc.definitions.resolve_implicit_global_asset_job_def()
    with dg.instance_for_test() as inst:
        result = job.execute_in_process(instance=inst)
        assert result.success
        tags = inst.get_run_by_id(result.run_id).tags
        whole = _whole_cost(data, tags["noetl/execution_id"])
        mats = _materializations(result)
        assert sorted(m.asset_key.to_user_string() for m in mats if m.asset_key.path[0] == "noetl_cost") == [
            "noetl_cost/cost_whole"
        ]
        assert len(mats) == 3
        assert sum(_value(m.metadata, "noetl/cost/usd") for m in mats) == pytest.approx(whole.total, abs=1e-9)
        assert float(tags["noetl/cost_usd"]) == pytest.approx(whole.total, abs=1e-9)


def test_a_repricing_re_tags_the_run(whole):
    """The run's tags follow a new price table (as the cost-rollups asset applies it); a run already
    priced by it is left alone."""
    loc, data = whole
    with dg.instance_for_test() as inst:
        result = loc.definitions.resolve_job_def("cost_whole").execute_in_process(instance=inst)
        eid = inst.get_run_by_id(result.run_id).tags["noetl/execution_id"]
        before = float(inst.get_run_by_id(result.run_id).tags["noetl/cost_usd"])
        doubled = PRICES.replace("36.0", "72.0").replace("3.6", "7.2").replace("5000.0", "10000.0")
        prices = PriceTable.from_dict(yaml.safe_load(doubled))
        log = open_event_store(None, data_dir=data)
        try:
            assert reprice_run_tags(inst, log, prices) == [result.run_id]
            assert reprice_run_tags(inst, log, prices, [eid]) == []  # already priced by this table
        finally:
            log.close()
        tags = inst.get_run_by_id(result.run_id).tags
        assert float(tags["noetl/cost_usd"]) == pytest.approx(2 * before, rel=1e-9)
        assert float(tags["noetl/cost_usd"]) == pytest.approx(_whole_cost(data, eid, doubled).total, abs=1e-9)
        assert tags["noetl/price_fingerprint"] == prices.fingerprint()


def test_the_cost_rollups_asset_re_tags_runs_when_the_price_table_changes(whole):
    """The ``noetl/cost_rollups`` asset (what applies a repricing to the facts) re-tags the runs too."""
    from noetl_analytics.store import close_all
    from noetl_dagster.sensors.facts import (
        EXPORT_JOB,
        ROLLUPS_KEY,
        FactsStoreResource,
        build_facts_definitions,
    )

    loc, data = whole
    facts = build_facts_definitions(resource=FactsStoreResource(data_dir=str(data)))
    try:
        with dg.instance_for_test() as inst:
            result = loc.definitions.resolve_job_def("cost_whole").execute_in_process(instance=inst)
            eid = inst.get_run_by_id(result.run_id).tags["noetl/execution_id"]
            assert facts.resolve_job_def(EXPORT_JOB).execute_in_process(instance=inst).success
            assert dg.materialize([facts.resolve_assets_def(ROLLUPS_KEY)], instance=inst).success
            first = float(inst.get_run_by_id(result.run_id).tags["noetl/cost_usd"])
            assert first == pytest.approx(_whole_cost(data, eid).total, abs=1e-9)  # same table: unchanged
            doubled = PRICES.replace("36.0", "72.0").replace("3.6", "7.2").replace("5000.0", "10000.0")
            (data / "prices.yaml").write_text(doubled)
            assert dg.materialize([facts.resolve_assets_def(ROLLUPS_KEY)], instance=inst).success
            tags = inst.get_run_by_id(result.run_id).tags
        assert float(tags["noetl/cost_usd"]) == pytest.approx(2 * first, rel=1e-9)
        assert tags["noetl/price_fingerprint"] == PriceTable.from_dict(yaml.safe_load(doubled)).fingerprint()
    finally:
        close_all()
