"""A real browser on the real UI (issue 22.5): ``dagster dev`` on a copy of example_project
with one broken playbook added; Playwright drives Debian Chromium (``/usr/bin/chromium``,
installed by ``make setup``): the launchpad of hello_dagster opens pre-filled with the
workload, Launch Run with those defaults succeeds, the broken file is an asset whose page
shows ``FILE:LINE: RULE: message`` and whose check fails, the other jobs are there, and a
declared table is a materializable asset whose page lists its declared checks.
Screenshots go to ``$NOETL_TEST_ARTIFACTS`` (default ``<repo>/.test-artifacts``)/browser."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from dagster_helpers import REPO, dagster_dev_server
from test_dagster_dev import _graphql

CHROMIUM = "/usr/bin/chromium"
LOCATION = "example_project.definitions"
BROKEN = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: broken, path: examples/broken}\nworkflow:\n  - step: start\n    tool: {kind: teleport}\n"
RUN_QUERY = "query R($id: ID!) { runOrError(runId: $id) { ... on Run { status jobName } } }"
FAILED_RUNS = "{ runsOrError(limit: 10) { ... on Runs { results { runId stepKeysToExecute } } } }"
FAILING = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: ratio_math, path: examples/ratio_math}
workflow:
  - step: start
    tool:
      - numbers: {kind: python, code: "result = {'a': 1, 'b': 0}"}
    next:
      arcs: [{step: transform}]
  - step: transform
    tool:
      - divide:
          kind: python
          input: {a: "{{ start.a }}", b: "{{ start.b }}"}
          code: |
            def ratio(a, b):
                return a / b

            def main(a, b):
                return [{"r": ratio(a, b)}]
      - save: {kind: parquet, uri: noetl://demo/examples/t/dataset/ratios, data: "{{ divide }}"}
    outputs: [noetl://demo/examples/t/dataset/ratios]
"""
CHECK_MUTATION = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) { __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } }
}
"""


@pytest.fixture
def artifacts():
    d = Path(os.environ.get("NOETL_TEST_ARTIFACTS", REPO / ".test-artifacts")) / "browser"
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture
def dev_with_broken_playbook(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(REPO / "example_project", site / "example_project", symlinks=True,
                    ignore=shutil.ignore_patterns(".noetl", ".dagster_home", "src", "__pycache__"))  # fmt: skip
    (site / "example_project" / "playbooks" / "broken.yaml").write_text(BROKEN)
    (site / "example_project" / "playbooks" / "ratio_math.yaml").write_text(FAILING)
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "example_project" / "dagster.yaml", home / "dagster.yaml")
    env = {**os.environ, "DAGSTER_HOME": str(home), "NOETL_DAGSTER_HOME": str(tmp_path / "noetl"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)}  # fmt: skip
    with dagster_dev_server(LOCATION, cwd=site, env=env, log_path=tmp_path / "dagster_dev.log") as (url, _):
        yield url, tmp_path / "dagster_dev.log"


def _dismiss_welcome(page) -> None:  # noqa: ANN001
    """The first visit shows a "Join the Dagster community" dialog; Skip it."""
    skip = page.get_by_role("button", name="Skip")
    try:
        skip.wait_for(state="visible", timeout=5_000)
    except Exception:  # noqa: BLE001 - no dialog this time
        return
    skip.click()


def _wait_run(url: str, run_id: str, timeout: float = 120) -> str:
    deadline = time.time() + timeout
    status = "?"
    while time.time() < deadline:
        status = _graphql(url, RUN_QUERY, {"id": run_id})["runOrError"].get("status", "?")
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            return status
        time.sleep(1)
    return status


MATERIALIZATION = """
query M($path: [String!]!) { assetOrError(assetKey: {path: $path}) { ... on Asset {
  assetMaterializations(limit: 1) { runId metadataEntries { label } } } } }
"""


def _wait_materialization(url: str, path: list[str], timeout: float = 180) -> dict | None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        mats = (
            _graphql(url, MATERIALIZATION, {"path": path})["assetOrError"].get("assetMaterializations") or []
        )
        if mats:
            return mats[0]
        time.sleep(1)
    return None


@pytest.mark.slow
def test_launchpad_defaults_run_and_the_broken_playbook_shows_in_the_browser(
    dev_with_broken_playbook, artifacts
):
    from playwright.sync_api import expect, sync_playwright  # noqa: PLC0415 - only the browser test needs it

    url, dev_log = dev_with_broken_playbook
    assert os.path.exists(CHROMIUM), "Debian chromium missing: `make setup` installs it"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        try:
            # 1. the launchpad opens pre-filled with the playbook's workload
            page.goto(f"{url}/locations/{LOCATION}/jobs/hello_dagster/playground")
            expect(page.get_by_text("workload:").first).to_be_visible(timeout=60_000)
            _dismiss_welcome(page)
            expect(page.get_by_text("Dagster", exact=True).first).to_be_visible()
            page.screenshot(path=artifacts / "1_launchpad_prefilled.png")
            # 2. launch it unchanged; the run succeeds
            launch = page.get_by_role("button", name="Launch Run")
            expect(launch).to_be_enabled(timeout=30_000)
            launch.click()
            page.wait_for_url("**/runs/**", timeout=60_000)
            run_id = page.url.rstrip("/").split("/runs/")[-1].split("?")[0].split("/")[0]
            assert _wait_run(url, run_id) == "SUCCESS", dev_log.read_text()[-3000:]
            page.reload()
            expect(page.get_by_text("Success").first).to_be_visible(timeout=30_000)
            page.screenshot(path=artifacts / "2_run_success.png")
            # 3. the asset graph holds the broken playbook, its page carries FILE:LINE: RULE: message
            page.goto(f"{url}/asset-groups")
            page.wait_for_timeout(3000)
            page.screenshot(path=artifacts / "3_asset_graph.png")
            page.goto(f"{url}/assets/noetl_invalid_playbook/broken")
            expect(page.get_by_text("INVALID NoETL playbook").first).to_be_visible(timeout=60_000)
            expect(page.get_by_text("broken.yaml:6: unknown-tool-kind").first).to_be_visible()
            page.screenshot(path=artifacts / "4_invalid_playbook_asset.png")
            # its check fails with the same message
            page.goto(f"{url}/assets/noetl_invalid_playbook/broken?view=checks")
            expect(page.get_by_text("playbook_is_valid").first).to_be_visible(timeout=60_000)
            # failed without a click: the noetl_invalid_playbooks automation sensor ran the check (issue 31)
            deadline = time.time() + 180
            while not page.get_by_text("Failed", exact=True).count() and time.time() < deadline:
                page.wait_for_timeout(5000)
                page.reload()
            expect(page.get_by_text("Failed", exact=True).first).to_be_visible(timeout=10_000)
            page.screenshot(path=artifacts / "5_invalid_playbook_check.png")
            # 4. a table a playbook declares: an asset page with its declared checks
            page.goto(f"{url}/assets/demo/examples/sales/daily_sales?view=checks")
            expect(page.get_by_text("schema_drift").first).to_be_visible(timeout=60_000)
            expect(page.get_by_text("three_regions_a_day").first).to_be_visible()
            page.screenshot(path=artifacts / "6_declared_asset_checks.png")
            # 5. Materialize from its page: a subset (can_subset=True) runs only the steps it needs, then its checks pass
            page.get_by_text("Materialize", exact=True).first.click()
            mat = _wait_materialization(url, ["demo", "examples", "sales", "daily_sales"])
            assert mat is not None, dev_log.read_text()[-3000:]
            labels = {m["label"] for m in mat["metadataEntries"]}
            assert {
                "dagster/column_schema",
                "dagster/row_count",
                "noetl/version",
                "noetl/skipped_steps",
            } <= labels
            assert _wait_run(url, mat["runId"]) == "SUCCESS", dev_log.read_text()[-3000:]
            page.reload()
            expect(page.get_by_text("Passed").first).to_be_visible(timeout=60_000)
            page.screenshot(path=artifacts / "7_materialized_checks_passed.png")
            # 6. a failing Materialize: the run names the step, task, tool kind, playbook line and the user's traceback
            page.goto(f"{url}/assets/demo/examples/t/ratios")
            expect(page.get_by_text("Materialize", exact=True).first).to_be_visible(timeout=60_000)
            page.get_by_text("Materialize", exact=True).first.click()
            page.wait_for_timeout(3000)
            runs = _graphql(url, FAILED_RUNS, {})["runsOrError"]["results"]
            run_id = next(r["runId"] for r in runs if "ratio_math__tables" in str(r["stepKeysToExecute"]))
            assert _wait_run(url, run_id) == "FAILURE", dev_log.read_text()[-3000:]
            page.goto(f"{url}/runs/{run_id}?logs=type%3ASTEP_FAILURE")
            expect(page.get_by_text("failed in task divide (python) at").first).to_be_visible(timeout=60_000)
            page.wait_for_timeout(1500)
            page.screenshot(path=artifacts / "8_failed_materialize.png", full_page=True)
        finally:
            browser.close()
    jobs = _graphql(
        url, "{ repositoriesOrError { ... on RepositoryConnection { nodes { jobs { name } } } } }", {}
    )
    names = {j["name"] for r in jobs["repositoriesOrError"]["nodes"] for j in r["jobs"]}
    assert {"hello_dagster", "countdown_cycle", "per_step_pipeline"} <= names and not any(
        "broken" in n for n in names
    )
    assert sum("broken.yaml" in line for line in dev_log.read_text().splitlines()) >= 1
    nodes = _graphql(url, "{ assetNodes { assetKey { path } isMaterializable kinds } }", {})["assetNodes"]
    daily = next(n for n in nodes if n["assetKey"]["path"] == ["demo", "examples", "sales", "daily_sales"])
    assert daily["isMaterializable"] and {"parquet", "duckdb"} <= set(daily["kinds"])
