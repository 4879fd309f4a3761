"""Every kind of run links to its execution's page, and the page links back to its Dagster runs
(issue 42): a Materialize of a partition, a schedule's run, a run the router launches; real runs."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import parse_qs, urlsplit

import dagster as dg
import pytest

from noetl_analytics.execution_view import ExecutionViews
from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.translator import compile_playbooks
from noetl_dagster.translator.runner import run_playbook_dagster

DASH, DAGSTER = "http://dash.example:8765", "http://dagster.example:3000"

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: linked, path: tests/linked}
executor:
  spec:
    dagster:
      partitions: {daily: 2026-11-20, workload_key: day}
    schedule: {cron: "0 2 * * *", workload: {day: "2026-11-30"}}
workload: {day: "2026-01-01"}
workflow:
  - step: start
    tool:
      - rows:
          kind: python
          input: {day: "{{ workload.day }}"}
          code: |
            result = [{"day": day, "i": 1}]
      - save:
          kind: parquet
          uri: noetl://demo/examples/t/dataset/linked_rows
          data: "{{ rows }}"
    outputs:
      - uri: noetl://demo/examples/t/dataset/linked_rows
"""


@pytest.fixture
def linked(tmp_path, dagster_data, monkeypatch):
    monkeypatch.setenv("NOETL_DASHBOARD_URL", DASH)
    monkeypatch.setenv("NOETL_DAGSTER_WEBSERVER_URL", DAGSTER + "/")
    f = tmp_path / "linked.yaml"
    f.write_text(PLAYBOOK)
    res = NoetlResource(data_dir=str(dagster_data), tenant="demo", project="examples")
    return f, compile_playbooks([f], resource=res), dagster_data


def _page(data_dir, eid: str) -> dict:
    return ExecutionViews(open_event_store(None, data_dir=str(data_dir)), data_dir=str(data_dir)).explain(eid)


def _linked(tags) -> str:  # noqa: ANN001
    eid = tags["noetl/execution_id"]
    assert tags["noetl/execution_url"] == f"{DASH}/executions/{eid}"
    assert tags["noetl/explain"] == f"noetl-dagster explain {eid}"
    return eid


def test_a_materialize_of_a_partition_links_both_ways(linked):
    _, loc, data = linked
    job = loc.definitions.resolve_implicit_global_asset_job_def()
    with dg.instance_for_test() as instance:
        r = job.execute_in_process(instance=instance, partition_key="2026-11-21")
        assert r.success
        tags = instance.get_run_by_id(r.run_id).tags
        eid = _linked(tags)
    # the tags a job run carries, which the docs promise every run kind (a Materialize had none of them)
    assert {k: tags.get(k) for k in ("noetl/playbook", "noetl/tenant", "noetl/project", "noetl/status")} == {
        "noetl/playbook": "tests/linked", "noetl/tenant": "demo", "noetl/project": "examples",
        "noetl/status": "completed",
    }  # fmt: skip
    assert tags.get("noetl/mode")
    # the table's; the other is the execution's cost summary (noetl_cost/<job>, translator/cost_summary.py)
    (mat,) = [
        m for m in r.asset_materializations_for_node("linked__tables") if m.asset_key.path[0] != "noetl_cost"
    ]
    assert mat.metadata["noetl/execution_page"].value == f"{DASH}/executions/{eid}"
    links = _page(data, eid)["dagster"]  # the page back to the Materialize run and every tagged run
    assert links["run"] == f"{DAGSTER}/runs/{r.run_id}"
    split = urlsplit(links["runs"])
    assert split.path == "/runs" and parse_qs(split.query) == {"q[]": [f"tag:noetl/execution_id={eid}"]}


def test_a_schedules_run_links_both_ways(linked):
    _, loc, data = linked
    schedule = loc.definitions.resolve_schedule_def("linked__schedule")
    with dg.instance_for_test() as instance:
        at = datetime(2026, 11, 30, 2, tzinfo=UTC)
        (req,) = schedule.evaluate_tick(
            dg.build_schedule_context(
                instance=instance,
                scheduled_execution_time=at,
                repository_def=loc.definitions.get_repository_def(),
            )
        ).run_requests
        job = loc.definitions.resolve_job_def("linked")
        r = job.execute_in_process(instance=instance, run_config=req.run_config, tags=req.tags)
        assert r.success
        eid = _linked(instance.get_run_by_id(r.run_id).tags)
    assert _page(data, eid)["dagster"]["run"] == f"{DAGSTER}/runs/{r.run_id}"


def test_a_run_the_router_launches_carries_the_link_from_its_request(linked):
    f, loc, data = linked
    eid = run_playbook_dagster(f, data_dir=data, detach=True).execution_id
    sensor = loc.definitions.resolve_sensor_def("noetl_router")
    with dg.instance_for_test() as instance:
        ctx = dg.build_sensor_context(instance=instance, resources={"noetl": loc.index.resource})
        (req,) = sensor(ctx).run_requests
    assert req.tags["noetl/execution_id"] == eid and _linked(req.tags) == eid
    assert "run" not in _page(data, eid)["dagster"]  # requested from the CLI: only the tagged runs


def test_no_webserver_url_no_back_links(linked, monkeypatch):
    _, loc, data = linked
    monkeypatch.delenv("NOETL_DAGSTER_WEBSERVER_URL")
    with dg.instance_for_test() as instance:
        r = loc.definitions.resolve_job_def("linked").execute_in_process(instance=instance)
        eid = _linked(instance.get_run_by_id(r.run_id).tags)
    assert _page(data, eid)["dagster"] is None
