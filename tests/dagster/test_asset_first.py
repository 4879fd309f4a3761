"""Asset-first (issue 22.3): declared tables are materializable assets with schema, rows, bytes, versions,
kinds, owners and code references; declared checks are asset checks evaluated from the event log;
partitions set a workload value and are recorded on registry versions; automation and freshness
come from the playbook."""

from __future__ import annotations

import textwrap

import dagster as dg
import pytest
from dagster_helpers import EXAMPLES

from noetl_dagster.dsl import PlaybookInvalid, load_playbook
from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.translator import compile_playbooks

DAILY = dg.AssetKey(["sales", "daily_sales"])
TOTALS = dg.AssetKey(["sales", "region_totals"])


def _res(data_dir):
    return NoetlResource(data_dir=str(data_dir), tenant="demo", project="examples")


def _defs(paths, data_dir, **kw):
    return compile_playbooks(paths, include_sensor=False, resource=_res(data_dir), **kw).definitions


def _unbound(defs, key):
    """The playbook's multi-asset and its checks as defined (no resources bound), for dg.materialize."""
    assets = [a for a in defs.assets if isinstance(a, dg.AssetsDefinition) and key in a.keys]
    return assets + [c for c in defs.asset_checks if any(k.asset_key == key for k in c.check_keys)]


def test_declared_tables_materialize_with_schema_rows_bytes_and_checks(dagster_data):
    defs = _defs([EXAMPLES / "sales_tables.yaml", EXAMPLES / "hello_dagster.yaml"], dagster_data)
    ad = defs.resolve_assets_def(DAILY)
    assert ad.is_executable and set(ad.keys) == {DAILY, TOTALS}
    daily, totals = ad.specs_by_key[DAILY], ad.specs_by_key[TOTALS]
    assert DAILY in {d.asset_key for d in totals.deps}
    assert {"noetl", "parquet", "duckdb"} <= daily.kinds and {"parquet", "python"} <= totals.kinds
    assert daily.owners == ["team:sales"] and daily.group_name == "sales"
    assert daily.freshness_policy is not None
    ref = daily.metadata["dagster/code_references"].code_references[0]
    text = (EXAMPLES / "sales_tables.yaml").read_text().splitlines()
    assert (
        ref.file_path.endswith("sales_tables.yaml")
        and "uri: noetl://demo/examples/sales/dataset/daily_sales" in text[ref.line_number - 1]
    )
    assert [c.name for c in daily.metadata["dagster/column_schema"].columns] == ["day", "region", "amount"]
    check_keys = {k.name for k in defs.resolve_asset_graph().asset_check_keys if k.asset_key == DAILY}
    assert check_keys == {"row_count", "schema_drift", "freshness", "three_regions_a_day", "step_succeeded"}

    with dg.instance_for_test() as instance:
        for _ in range(2):  # the second run: schema_drift compares with v1
            result = defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=instance)
            assert result.success
        mats = {
            e.materialization.asset_key: e.materialization.metadata
            for e in result.get_asset_materialization_events()
        }
        evals = {(e.asset_key, e.check_name): e for e in result.get_asset_check_evaluations()}
        run = instance.get_run_by_id(result.run_id)
    md = mats[DAILY]
    assert md["dagster/row_count"].value == 15 and md["noetl/size_bytes"].value > 0
    assert [(c.name, c.type) for c in md["dagster/column_schema"].schema.columns] == [
        ("day", "int64"), ("region", "string"), ("amount", "int64")]  # fmt: skip
    assert md["noetl/version"].value == "v2" and md["noetl/uri"].value.endswith("daily_sales@v2")
    assert md["noetl/checksum"].value.startswith("sha256:")
    assert mats[TOTALS]["dagster/row_count"].value == 3
    assert run.tags["noetl/execution_id"] == md["noetl/execution_id"].value
    assert all(e.passed for e in evals.values()), {k: e.description for k, e in evals.items() if not e.passed}
    assert "unchanged" in evals[(DAILY, "schema_drift")].description
    assert evals[(TOTALS, "row_count")].passed


PARTITIONED = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: shapes, path: tests/shapes}}
executor:
  spec:
    dagster:
      partitions: {{static: shapes, workload_key: shape}}
      automation: {automation}
workload:
  shape: narrow
  shapes: [narrow, wide]
workflow:
  - step: start
    tool:
      - make:
          kind: python
          input: {{shape: "{{{{ workload.shape }}}}"}}
          code: |
            def main(shape):
                return [dict(a=i, **({{"b": "x"}} if shape == "wide" else {{}})) for i in range(4)]
      - save:
          kind: parquet
          uri: noetl://demo/examples/t/dataset/shapes
          data: "{{{{ make }}}}"
    outputs:
      - uri: noetl://demo/examples/t/dataset/shapes
        owners: [ana@example.com]
        checks:
          - schema: {{stable: true}}
          - name: many_rows
            assert: "{{{{ output.rows > 100 }}}}"
            severity: warn
"""


def test_partitions_set_the_workload_value_record_the_key_and_drift_is_per_partition(dagster_data, tmp_path):
    f = tmp_path / "shapes.yaml"
    f.write_text(PARTITIONED.format(automation="eager"))
    defs = _defs([f], dagster_data)
    key = dg.AssetKey(["t", "shapes"])
    ad = defs.resolve_assets_def(key)
    assert ad.partitions_def.get_partition_keys() == ["narrow", "wide"]
    assert ad.specs_by_key[key].owners == ["ana@example.com"]
    assert ad.specs_by_key[key].automation_condition.get_label() == dg.AutomationCondition.eager().get_label()
    with dg.instance_for_test() as instance:
        evals = {}
        for part in ("narrow", "wide"):
            r = dg.materialize(_unbound(defs, key), instance=instance, partition_key=part,
                               resources={"noetl": _res(dagster_data)})  # fmt: skip
            assert r.success
            evals[part] = {e.check_name: e for e in r.get_asset_check_evaluations()}
            mat = r.get_asset_materialization_events()[0].materialization
            assert mat.partition == part and mat.metadata["noetl/partition_key"].value == part
    assert evals["narrow"]["schema_drift"].passed
    drift = evals["wide"]["schema_drift"]  # wide's first version: narrow's v1 is another partition's data
    assert drift.passed and "added" not in drift.description
    pred = evals["wide"]["many_rows"]
    assert (
        not pred.passed and pred.severity == dg.AssetCheckSeverity.WARN and "4 > 100" not in pred.description
    )
    # the registry version records its partition key
    plan = (
        NoetlResource(data_dir=str(dagster_data))
        .registry("demo", "examples")
        .resolve("noetl://demo/examples/t/dataset/shapes")
    )
    assert plan.version == "v2" and plan.metadata["partition_key"] == "wide"


DAILY_PB = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: daily_load, path: tests/daily_load}
executor:
  spec:
    dagster:
      partitions: {daily: 2026-11-01, workload_key: day}
      automation: {on_cron: "0 6 * * *", timezone: Europe/Paris}
      freshness: {deadline_cron: "0 9 * * *", lower_bound_minutes: 180}
workload: {day: "2026-01-01"}
workflow:
  - step: start
    tool:
      - save:
          kind: parquet
          uri: noetl://demo/examples/t/dataset/daily_load
          data: [{day: "{{ workload.day }}"}]
    outputs: [noetl://demo/examples/t/dataset/daily_load]
"""


def test_daily_partition_key_becomes_the_workload_value(dagster_data, tmp_path):
    f = tmp_path / "daily.yaml"
    f.write_text(DAILY_PB)
    defs = _defs([f], dagster_data)
    key = dg.AssetKey(["t", "daily_load"])
    ad = defs.resolve_assets_def(key)
    assert isinstance(ad.partitions_def, dg.DailyPartitionsDefinition)
    spec = ad.specs_by_key[key]
    assert (
        spec.automation_condition.get_label()
        == dg.AutomationCondition.on_cron("0 6 * * *", "Europe/Paris").get_label()
    )
    assert spec.freshness_policy.deadline_cron == "0 9 * * *"
    with dg.instance_for_test() as instance:
        r = dg.materialize(_unbound(defs, key), instance=instance, partition_key="2026-11-20",
                           resources={"noetl": _res(dagster_data)})  # fmt: skip
        assert r.success
    storage = NoetlResource(data_dir=str(dagster_data)).registry("demo", "examples")
    plan = storage.resolve("noetl://demo/examples/t/dataset/daily_load")
    assert plan.metadata["partition_key"] == "2026-11-20"
    from noetl_dagster.storage.tables import TableStorage  # noqa: PLC0415

    table, _ = TableStorage(storage, data_dir=dagster_data).fetch(plan.uri, as_type="arrow")
    assert table.to_pylist() == [{"day": "2026-11-20"}]


def test_partitioned_playbook_job_takes_the_partition_key(dagster_data, tmp_path):
    f = tmp_path / "daily.yaml"
    f.write_text(DAILY_PB)
    job = _defs([f], dagster_data).resolve_job_def("daily_load")
    assert isinstance(job.partitions_def, dg.DailyPartitionsDefinition)
    key = dg.AssetKey(["t", "daily_load"])
    with dg.instance_for_test() as instance:
        assert job.execute_in_process(instance=instance, partition_key="2026-11-21").success
        mat = instance.get_latest_materialization_event(key).asset_materialization
    assert mat.partition == "2026-11-21" and mat.metadata["noetl/partition_key"].value == "2026-11-21"


# Dagster's own automation tester passes a beta parameter (AssetSelection.all(include_sources=True))
@pytest.mark.filterwarnings("ignore:Parameter `include_sources` of function `AssetSelection.all`")
def test_on_cron_automation_requests_the_asset_after_the_tick(dagster_data, tmp_path):
    import datetime as dt  # noqa: PLC0415

    f = tmp_path / "shapes.yaml"
    f.write_text(PARTITIONED.format(automation='{on_cron: "0 6 * * *"}')
                 .replace("partitions: {static: shapes, workload_key: shape}", ""))  # fmt: skip
    defs = _defs([f], dagster_data)
    day = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
    with dg.instance_for_test() as instance:
        before = dg.evaluate_automation_conditions(
            defs=defs, instance=instance, evaluation_time=day.replace(hour=5, minute=59)
        )
        after = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=before.cursor,
                                                  evaluation_time=day.replace(hour=6, minute=1))  # fmt: skip
    assert (before.total_requested, after.total_requested) == (0, 1)


@pytest.mark.parametrize(
    ("snippet", "rule"),
    [
        ("outputs: [{uri: 'noetl://demo/x/t/dataset/a@v1'}]", "output-uri"),
        (
            "outputs: [{uri: 'noetl://demo/x/t/dataset/a', checks: [{row_count: {min: 1}, assert: '{{ 1 }}'}]}]",
            "check-shape",
        ),
        ("outputs: [{uri: 'noetl://demo/x/t/dataset/a', owners: [nobody]}]", "output-owners"),
        ("outputs: [{uri: 'noetl://demo/x/t/dataset/a', automation: sometimes}]", "automation"),
        ("outputs: [{uri: 'noetl://demo/x/t/dataset/a', colour: red}]", "output-key"),
    ],
)
def test_bad_declarations_are_one_line_errors_with_file_and_line(tmp_path, snippet, rule):
    f = tmp_path / "bad.yaml"
    f.write_text(
        textwrap.dedent(f"""\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {{name: bad, path: t/bad}}
        workflow:
          - step: start
            tool: [{{a: {{kind: python, code: "def main(): return 1"}}}}]
            {snippet}
        """)
    )
    with pytest.raises(PlaybookInvalid) as e:
        load_playbook(f)
    assert f"{f}:7: {rule}:" in str(e.value.issues[0])


def test_bad_partitions_in_a_code_location_are_contained(dagster_data, tmp_path):
    (tmp_path / "bad.yaml").write_text(DAILY_PB.replace("daily: 2026-11-01", "daily: someday"))
    (tmp_path / "good.yaml").write_text(DAILY_PB.replace("daily_load", "good_load"))
    loc = compile_playbooks(tmp_path, include_sensor=False, on_error="report",
                            resource=NoetlResource(data_dir=str(dagster_data)))  # fmt: skip
    assert [c.job_name for c in loc.index.playbooks] == ["good_load"]
    assert "bad.yaml:7: partitions:" in loc.index.invalid[0].issues[0]


def test_a_playbook_job_run_evaluates_the_declared_checks_of_what_it_stored(dagster_data):
    defs = _defs([EXAMPLES / "sales_tables.yaml"], dagster_data)
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("sales_tables").execute_in_process(instance=instance)
        assert result.success
        evals = {(e.asset_key, e.check_name): e for e in result.get_asset_check_evaluations()}
        record = instance.event_log_storage.get_latest_asset_check_execution_by_key(
            [dg.AssetCheckKey(DAILY, "three_regions_a_day")])  # fmt: skip
    assert set(evals) == {(DAILY, n) for n in ("row_count", "schema_drift", "freshness", "three_regions_a_day")} | {
        (TOTALS, "row_count")} | {(DAILY, "step_succeeded"), (TOTALS, "step_succeeded")}  # fmt: skip
    assert all(e.passed for e in evals.values()), {k: e.description for k, e in evals.items()}
    assert record[dg.AssetCheckKey(DAILY, "three_regions_a_day")].status.value == "SUCCEEDED"


def test_materializing_the_declared_tables_reports_their_cost(dagster_data):
    """The asset-first multi-asset carries the storing step's cost on each materialization (split over
    the tables that step stored) and tags the run with the execution's total, as the op-based jobs do."""
    import yaml

    from noetl_analytics.pricing import Cost, PriceTable, cost_of_events
    from noetl_dagster.storage.event_stores import open_event_store

    prices_yaml = (
        "currency: USD\nallocation:\n  - {version: t-9, valid_from: 2000-01-01, cpu_core_hour: 36.0,"
        " ram_gb_hour: 3.6, egress_gb: 0.09, shot: 0.0009, qpu_second: 1.6}\n"
    )
    dagster_data.mkdir(parents=True, exist_ok=True)
    (dagster_data / "prices.yaml").write_text(prices_yaml)
    defs = _defs([EXAMPLES / "sales_tables.yaml"], dagster_data)
    with dg.instance_for_test() as instance:
        result = defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=instance)
        assert result.success
        mats = {
            e.materialization.asset_key: e.materialization.metadata
            for e in result.get_asset_materialization_events()
        }
        tags = instance.get_run_by_id(result.run_id).tags
    eid = tags["noetl/execution_id"]
    log = open_event_store(None, data_dir=dagster_data)
    try:
        attempts = [e for e in log.read(eid) if e.execution_id == eid]
    finally:
        log.close()
    prices = PriceTable.from_dict(yaml.safe_load(prices_yaml))
    by_step: dict[str, list] = {}
    for e in attempts:
        by_step.setdefault(e.step, []).append(e)
    for key in (DAILY, TOTALS):
        md = mats[key]
        step = md["noetl/step"].value
        share = md["noetl/cost/share"].value
        expected = sum(cost_of_events(prices, by_step[step]).values(), Cost())
        assert md["noetl/cost/usd"].value == pytest.approx(expected.total * share, rel=1e-9)
        assert md["noetl/cost/usd"].value > 0 and md["noetl/cost/price_version"].value == "t-9"
    total = sum(cost_of_events(prices, attempts).values(), Cost())
    assert float(tags["noetl/cost_usd"]) == pytest.approx(total.total, rel=1e-9, abs=1e-12)
    assert tags["noetl/run_cost_usd"] == tags["noetl/cost_usd"] and tags["noetl/price_version"] == "t-9"
