"""Issue 31 acceptance: a two-partition asset backfill launched through the real ``dagster dev``
(webserver + daemon, the example instance config: queued coordinator, warm launcher) leaves one
registry record per partition key, and the checks evaluated each partition's own record (issue 42:
in one run, which runs the playbook once per key)."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest
from dagster_helpers import REPO, dagster_dev_server
from test_asset_round2 import DAILY, SERIES
from test_dagster_dev import _graphql

from noetl_dagster.resources.noetl import NoetlResource, close_all_services

DEFS = """\
import os
from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.translator import compile_playbooks
defs = compile_playbooks([os.path.join(os.path.dirname(__file__), "playbooks")], include_sensor=False,
                         resource=NoetlResource(tenant="demo", project="examples")).definitions
"""
LAUNCH = """
mutation B($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message }
  }
}
"""
STATUS = "query S($id: String!) { partitionBackfillOrError(backfillId: $id) { ... on PartitionBackfill { status } } }"
RUNS = """{ runsOrError { ... on Runs { results { runId status tags { key value } } } } }"""
CHECKS = """
query C($path: [String!]!, $name: String!) { assetCheckExecutions(assetKey: {path: $path}, checkName: $name, limit: 10) {
  runId status evaluation { success metadataEntries { label ... on JsonMetadataEntry { jsonString } } } } }
"""


@pytest.mark.slow
def test_a_two_partition_backfill_in_dagster_dev_keeps_each_partitions_data(tmp_path):
    site = tmp_path / "site"
    (site / "t31dev" / "playbooks").mkdir(parents=True)
    (site / "t31dev" / "__init__.py").write_text("")
    (site / "t31dev" / "defs.py").write_text(DEFS)
    (site / "t31dev" / "playbooks" / "daily_events.yaml").write_text(
        DAILY.format(extra="", column="", series=SERIES)
    )
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "example_project" / "dagster.yaml", home / "dagster.yaml")
    noetl = tmp_path / "noetl"
    env = {**os.environ, "DAGSTER_HOME": str(home), "NOETL_DAGSTER_HOME": str(noetl),
           "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)}  # fmt: skip
    keys = ["2026-11-21", "2026-11-22"]
    try:
        with dagster_dev_server("t31dev.defs", cwd=site, env=env, log_path=tmp_path / "dev.log") as (url, _):
            path = ["t", "daily_events"]
            params = {"assetSelection": [{"path": path}], "partitionNames": keys}
            out = _graphql(url, LAUNCH, {"params": params})["launchPartitionBackfill"]
            assert out["__typename"] == "LaunchBackfillSuccess", out
            deadline, status = time.time() + 420, "?"
            while time.time() < deadline:
                status = _graphql(url, STATUS, {"id": out["backfillId"]})["partitionBackfillOrError"][
                    "status"
                ]
                if status not in ("REQUESTED", "CANCELING"):
                    break
                time.sleep(2)
            log = (tmp_path / "dev.log").read_text()[-3000:]
            assert status in ("COMPLETED", "COMPLETED_SUCCESS"), f"{status}\n{log}"
            runs = _graphql(url, RUNS, {})["runsOrError"]["results"]
            # issue 42: no declared backfill policy is one run, which runs the playbook once per key
            assert len(runs) == 1 and runs[0]["status"] == "SUCCESS", runs
            execs = _graphql(url, CHECKS, {"path": path, "name": "rows_of_the_day"})["assetCheckExecutions"]
    finally:
        close_all_services()
    reg = NoetlResource(data_dir=str(noetl)).registry("demo", "examples")
    newest = int(reg.resolve(SERIES).version[1:])
    records = {}
    for i in range(1, newest + 1):
        plan = reg.resolve(f"{SERIES}@v{i}")
        records[plan.metadata["partition_key"]] = (plan.version, plan.rows)
    assert sorted(records) == keys and [records[k][1] for k in keys] == [
        3,
        4,
    ]  # one record per key, its own rows
    evaluated = [ex for ex in execs if ex["evaluation"]]
    assert len(evaluated) == 1, execs  # (Dagster also lists planned executions without an evaluation)
    md = {m["label"]: m.get("jsonString") for m in evaluated[0]["evaluation"]["metadataEntries"]}
    assert evaluated[0]["evaluation"]["success"]  # the run's check: each partition's own record
    assert json.loads(md["noetl/partition_uris"]) == {k: f"{SERIES}@{records[k][0]}" for k in keys}
