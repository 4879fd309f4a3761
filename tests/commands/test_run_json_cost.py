"""``run --runner dagster --json`` prints the Dagster run ids and the execution's cost (issue 43 item 4): the
cost is the execution's log priced by the price table the run tags use, so it equals the Dagster
run's ``noetl/cost_usd`` tag; a price file that does not load says so in ``cost.error``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dagster as dg
import pytest
import yaml

from noetl_analytics.pricing import PriceTable
from noetl_dagster.resources.run_costs import execution_cost
from noetl_dagster.storage.event_stores import open_event_store

PRICES = """\
currency: USD
versions:
  - version: j-1
    valid_from: 2000-01-01
    cpu_core_hour: 36.0
    ram_gb_hour: 3.6
"""

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: json_cost, path: tests/json_cost}
workflow:
  - step: start
    tool: {kind: python, code: "result = sum(i * i for i in range(100000))"}
    next: {arcs: [{step: end}]}
  - step: end
    tool: {kind: noop}
"""


def _run(tmp_path, *args: str, prices: str = PRICES) -> dict:  # noqa: ANN001
    data = tmp_path / "noetl"
    data.mkdir(exist_ok=True)
    (data / "prices.yaml").write_text(prices)
    pb = tmp_path / "json_cost.yaml"
    pb.write_text(PLAYBOOK)
    root = os.getcwd()
    env = {**os.environ, "NOETL_DAGSTER_HOME": str(data), "DAGSTER_HOME": str(tmp_path / "dagster_home"),
           "PYTHONPATH": os.pathsep.join([root, f"{root}/analytics", f"{root}/lineage", f"{root}/registry_service"]),
           "NO_COLOR": "1"}  # fmt: skip
    env.pop("NOETL_DAGSTER_PRICES", None)
    proc = subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", "run", str(pb), "--json", *args],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _whole(tmp_path, eid: str):  # noqa: ANN001, ANN202
    log = open_event_store(None, data_dir=tmp_path / "noetl")
    try:
        return execution_cost(log.read(eid), PriceTable.from_dict(yaml.safe_load(PRICES)), eid)
    finally:
        log.close()


def test_dagster_run_json_has_the_run_id_and_the_cost_of_its_tags(tmp_path):
    out = _run(tmp_path, "--runner", "dagster")
    assert out["status"] == "completed"
    run_id = out["dagster"]["run_id"]
    assert out["dagster"]["run_ids"] == [run_id] and out["dagster"]["statuses"] == ["SUCCESS"]
    whole = _whole(tmp_path, out["execution_id"])
    cost = out["cost"]
    assert cost["currency"] == "USD" and cost["price_version"] == "j-1"
    assert cost["total"] == pytest.approx(whole.total, abs=1e-12) and cost["platform"] > 0
    assert sum(cost["steps"].values()) + cost["platform"] == pytest.approx(cost["total"], abs=1e-12)
    with dg.DagsterInstance.from_config(str(tmp_path / "dagster_home")) as inst:
        tags = inst.get_run_by_id(run_id).tags
    assert tags["noetl/execution_id"] == out["execution_id"]
    assert float(tags["noetl/cost_usd"]) == pytest.approx(cost["total"], abs=1e-9)
    assert tags["noetl/price_fingerprint"] == cost["price_fingerprint"]


def test_local_run_json_is_the_contract_alone(tmp_path):
    """The local runner prints SEMANTICS §8's five keys: no Dagster run, and no YAML price file read."""
    assert list(_run(tmp_path)) == ["execution_id", "status", "ctx", "results", "runs"]


def test_a_bad_price_file_is_an_error_in_cost_not_a_failed_run(tmp_path):
    out = _run(tmp_path, "--runner", "dagster", prices="versions: [{cpu_core_hour: -1}]\n")
    assert out["status"] == "completed"
    assert "cpu_core_hour must be a non-negative number" in out["cost"]["error"]
