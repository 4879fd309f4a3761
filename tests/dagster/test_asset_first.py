"""Asset-first (issue 22.6, first part): the tables a playbook declares are materializable assets;
materializing runs the playbook and reports each table with the reference it stored."""

from __future__ import annotations

import dagster as dg
from dagster_helpers import EXAMPLES

from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.translator import compile_playbooks


def test_declared_tables_materialize_by_running_the_playbook(dagster_data):
    loc = compile_playbooks([EXAMPLES / "sales_tables.yaml", EXAMPLES / "hello_dagster.yaml"], include_sensor=False,
                            resource=NoetlResource(data_dir=str(dagster_data), tenant="demo", project="examples"))  # fmt: skip
    defs = loc.definitions
    daily = dg.AssetKey(["demo", "examples", "sales", "daily_sales"])
    totals = dg.AssetKey(["demo", "examples", "sales", "region_totals"])
    ad = defs.resolve_assets_def(daily)
    assert ad.is_executable and set(ad.keys) == {daily, totals}
    spec = ad.specs_by_key[totals]
    assert daily in {d.asset_key for d in spec.deps} and "parquet" in spec.kinds
    assert "dagster/code_references" in spec.metadata
    with dg.instance_for_test() as instance:
        result = defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=instance)
        assert result.success
        mats = {m.asset_key: m.metadata for m in (e.materialization for e in result.get_asset_materialization_events())}
    assert mats[daily]["dagster/row_count"].value > 0
    assert mats[totals]["noetl/uri"].value.startswith("noetl://demo/examples/sales/dataset/region_totals")
