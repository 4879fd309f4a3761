"""The component's ``translation:`` block (DbtProjectComponent style) and typed attributes."""

from __future__ import annotations

import dagster as dg
import pydantic
import pytest
from dagster_helpers import EXAMPLES

from noetl_dagster import NoetlPlaybooksComponent
from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.translator import compile_playbooks
from noetl_dagster.translator.component import NoetlTranslation, _ConfiguredTranslator


def test_translation_block_reaches_jobs_ops_and_assets(dagster_data):
    translation = NoetlTranslation(job_tags={"team": "data"}, op_tags={"dagster/concurrency_key": "noetl"},
                                   group_name="tables", asset_tags={"layer": "bronze"}, kinds=["warehouse"])  # fmt: skip
    loc = compile_playbooks([EXAMPLES / "sales_tables.yaml"], _ConfiguredTranslator(translation), include_sensor=False,
                            resource=NoetlResource(data_dir=str(dagster_data)))  # fmt: skip
    job = loc.definitions.resolve_job_def(loc.index.playbooks[0].job_name)
    assert job.tags["team"] == "data"
    assert all(n.definition.tags["dagster/concurrency_key"] == "noetl" for n in job.nodes)
    specs = list(loc.definitions.resolve_all_asset_specs())
    assert specs and all(s.group_name == "tables" and s.tags["layer"] == "bronze" and "warehouse" in s.kinds
                         for s in specs)  # fmt: skip


def test_translation_owners_automation_and_templated_metadata(dagster_data):
    translation = NoetlTranslation(owners=["team:platform"], automation="on_missing",
                                   asset_metadata={"runbook": "https://wiki/{playbook}#{step}"})  # fmt: skip
    loc = compile_playbooks([EXAMPLES / "sales_tables.yaml"], _ConfiguredTranslator(translation), include_sensor=False,
                            resource=NoetlResource(data_dir=str(dagster_data)))  # fmt: skip
    specs = {s.key.path[-1]: s for s in loc.definitions.resolve_all_asset_specs()}
    daily = specs["daily_sales"]
    assert daily.owners == ["team:sales"]  # the playbook's own owners win
    assert daily.automation_condition.get_label() == dg.AutomationCondition.on_missing().get_label()
    assert daily.metadata["runbook"] == "https://wiki/examples/sales_tables#store_daily"


def test_mode_and_on_error_are_enums():
    assert NoetlPlaybooksComponent(playbooks_dir="p").on_error == "report"
    with pytest.raises(pydantic.ValidationError):
        NoetlPlaybooksComponent(playbooks_dir="p", mode="sideways")
    with pytest.raises(pydantic.ValidationError):
        NoetlPlaybooksComponent(playbooks_dir="p", on_error="ignore")
