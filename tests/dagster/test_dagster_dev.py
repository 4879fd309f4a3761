"""Acceptance: the real ``dagster dev`` (webserver + daemon) serves the example
code location, and its ``noetl_router`` sensor launches an execution requested
outside Dagster (``run --runner dagster --detach``). Per-step hops and resumes
are the same router code, tested in-process in test_router.py (each daemon-launched
run costs a process start). Completion is observed through the
GraphQL API; the process group is stopped with SIGINT (DESIGN.md pitfalls:
``dagster dev`` ignores signals unless it leads its own group)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest
from dagster_helpers import EXAMPLES, REPO, dagster_dev_server

from noetl_dagster.resources.noetl import close_all_services
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.translator.runner import run_playbook_dagster

RUNS_QUERY = """
query Runs($eid: String!) {
  runsOrError(filter: {tags: [{key: "noetl/execution_id", value: $eid}]}) {
    __typename
    ... on Runs { results { runId status jobName tags { key value } } }
    ... on PythonError { message }
  }
}
"""


def _graphql(url: str, query: str, variables: dict) -> dict:
    r = httpx.post(f"{url}/graphql", json={"query": query, "variables": variables}, timeout=10)
    r.raise_for_status()
    body = r.json()
    assert "errors" not in body, body
    return body["data"]


def _runs(url: str, eid: str) -> list[dict]:
    data = _graphql(url, RUNS_QUERY, {"eid": eid})["runsOrError"]
    assert data["__typename"] == "Runs", data
    return data["results"]


@pytest.fixture
def dagster_dev(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "example_project" / "dagster.yaml", home / "dagster.yaml")
    noetl_home = tmp_path / "noetl"
    env = {**os.environ, "DAGSTER_HOME": str(home), "NOETL_DAGSTER_HOME": str(noetl_home)}
    try:
        with dagster_dev_server("example_project.definitions", cwd=tmp_path, env=env,
                                log_path=tmp_path / "dagster_dev.log") as (url, proc):  # fmt: skip
            yield url, noetl_home, proc
    finally:
        close_all_services()


def _wait_finished(url: str, noetl_home: Path, eid: str, timeout: float) -> list[dict]:
    store = open_event_store(None, data_dir=noetl_home)
    try:
        deadline = time.time() + timeout
        while time.time() < deadline:
            runs = _runs(url, eid)
            done = any(e.name == "workflow.finished" for e in store.read(eid))
            if done and runs and all(r["status"] in ("SUCCESS", "FAILURE", "CANCELED") for r in runs):
                return runs
            time.sleep(1)
        raise AssertionError(f"execution {eid} not finished in {timeout} s; runs: {_runs(url, eid)}")
    finally:
        store.close()


@pytest.mark.slow
def test_sensor_launches_detached_executions_in_dagster_dev(dagster_dev):
    url, noetl_home, proc = dagster_dev
    # requested outside Dagster: one run of the playbook's job, launched by the router
    req = run_playbook_dagster(EXAMPLES / "hello_dagster.yaml", {"name": "daemon"}, data_dir=noetl_home,
                               tenant="demo", project="examples", detach=True)  # fmt: skip
    assert req.status == "requested"

    runs = _wait_finished(url, noetl_home, req.execution_id, timeout=90)
    assert [r["status"] for r in runs] == ["SUCCESS"]
    tags = {t["key"]: t["value"] for t in runs[0]["tags"]}
    assert tags["noetl/execution_id"] == req.execution_id
    assert tags["noetl/playbook"] == "examples/hello_dagster"
    assert tags["noetl/tenant"] == "demo" and tags["noetl/project"] == "examples"
    assert tags["dagster/run_key"].startswith(req.execution_id)
    assert tags["noetl/status"] == "completed"

    store = open_event_store(None, data_dir=noetl_home)
    try:
        finished = [e for e in store.read(req.execution_id) if e.name == "workflow.finished"]
        assert len(finished) == 1 and finished[0].data["status"] == "completed"
        hello = {e.step: e.data.get("result") for e in store.read(req.execution_id) if e.name == "step.done"}
        assert hello["done"] == {"said": 3, "last": "Hello, daemon!"}
        # one tenant/project for the whole execution: the request's, in every event and run tag
        assert {(e.tenant_id, e.project_id) for e in store.read(req.execution_id)} == {("demo", "examples")}
    finally:
        store.close()
    assert proc.poll() is None
