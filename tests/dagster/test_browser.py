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


def _tail(dev_log: Path) -> str:
    return "--- dagster dev log (tail) ---\n" + dev_log.read_text(errors="replace")[-3000:]


def _poll(what: str, probe, dev_log: Path, timeout: float = 180, every: float = 1.0):  # noqa: ANN001, ANN202
    """``probe()`` until it returns something truthy (returned), at most ``timeout`` seconds: on a
    loaded machine a run takes as long as it takes; the deadline only bounds a hang."""
    deadline = time.monotonic() + timeout
    while True:
        seen = probe()
        if seen:
            return seen
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s\n{_tail(dev_log)}")
        time.sleep(every)


TERMINAL = ("SUCCESS", "FAILURE", "CANCELED")


def _wait_run(url: str, run_id: str, dev_log: Path, timeout: float = 180) -> str:
    """The terminal status of run ``run_id`` (polled)."""

    def status() -> str | None:
        s = _graphql(url, RUN_QUERY, {"id": run_id})["runOrError"].get("status")
        return s if s in TERMINAL else None

    return _poll(f"run {run_id} reaching {'/'.join(TERMINAL)}", status, dev_log, timeout)


def _wait_new_run(url: str, step_key: str, before: set[str], dev_log: Path, timeout: float = 180) -> str:
    """The id of the first run (not in ``before``) whose steps include ``step_key`` (polled)."""

    def found() -> str | None:
        runs = _graphql(url, FAILED_RUNS, {})["runsOrError"]["results"]
        return next(
            (
                r["runId"]
                for r in runs
                if r["runId"] not in before and step_key in str(r["stepKeysToExecute"])
            ),
            None,
        )

    return _poll(f"a run of {step_key} after Materialize", found, dev_log, timeout)


MATERIALIZATION = """
query M($path: [String!]!) { assetOrError(assetKey: {path: $path}) { ... on Asset {
  assetMaterializations(limit: 1) { runId metadataEntries { label } } } } }
"""


def _wait_materialization(url: str, path: list[str], dev_log: Path, timeout: float = 180) -> dict:
    def latest() -> dict | None:
        mats = _graphql(url, MATERIALIZATION, {"path": path})["assetOrError"].get("assetMaterializations")
        return (mats or [None])[0]

    return _poll(f"a materialization of {'/'.join(path)}", latest, dev_log, timeout)


@pytest.mark.slow
def test_launchpad_defaults_run_and_the_broken_playbook_shows_in_the_browser(
    dev_with_broken_playbook, artifacts
):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout  # noqa: PLC0415 - only this test needs it
    from playwright.sync_api import expect, sync_playwright  # noqa: PLC0415

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
            status = _wait_run(url, run_id, dev_log)
            assert status == "SUCCESS", f"hello_dagster run {run_id} ended {status}\n{_tail(dev_log)}"
            page.reload()
            expect(page.get_by_text("Success").first).to_be_visible(timeout=30_000)
            page.screenshot(path=artifacts / "2_run_success.png")
            # 3. the asset graph holds the broken playbook, its page carries FILE:LINE: RULE: message
            page.goto(f"{url}/asset-groups")
            try:  # the screenshot only illustrates (nothing is asserted on this page): when the graph settled
                page.wait_for_load_state("networkidle", timeout=30_000)
            except PlaywrightTimeout:
                pass
            page.screenshot(path=artifacts / "3_asset_graph.png")
            page.goto(f"{url}/assets/noetl_invalid_playbook/broken")
            expect(page.get_by_text("INVALID NoETL playbook").first).to_be_visible(timeout=60_000)
            expect(page.get_by_text("broken.yaml:6: unknown-tool-kind").first).to_be_visible()
            page.screenshot(path=artifacts / "4_invalid_playbook_asset.png")
            # its check fails with the same message
            page.goto(f"{url}/assets/noetl_invalid_playbook/broken?view=checks")
            expect(page.get_by_text("playbook_is_valid").first).to_be_visible(timeout=60_000)
            # failed without a click: the noetl_invalid_playbooks automation sensor ran the check (issue 31)
            deadline = time.monotonic() + 180
            while not page.get_by_text("Failed", exact=True).count():  # polled: the sensor ticks on its own
                assert time.monotonic() < deadline, (
                    f"playbook_is_valid not Failed within 180 s\n{_tail(dev_log)}"
                )
                page.wait_for_timeout(5000)
                page.reload()
                page.get_by_text("playbook_is_valid").first.wait_for(state="visible", timeout=60_000)
            page.screenshot(path=artifacts / "5_invalid_playbook_check.png")
            # 4. a table a playbook declares: an asset page with its declared checks
            page.goto(f"{url}/assets/sales/daily_sales?view=checks")
            expect(page.get_by_text("schema_drift").first).to_be_visible(timeout=60_000)
            expect(page.get_by_text("three_regions_a_day").first).to_be_visible()
            page.screenshot(path=artifacts / "6_declared_asset_checks.png")
            # 5. Materialize from its page: a subset (can_subset=True) runs only the steps it needs, then its checks pass
            page.get_by_text("Materialize", exact=True).first.click()
            mat = _wait_materialization(url, ["sales", "daily_sales"], dev_log)
            labels = {m["label"] for m in mat["metadataEntries"]}
            assert {
                "dagster/column_schema",
                "dagster/row_count",
                "noetl/version",
                "noetl/skipped_steps",
            } <= labels
            status = _wait_run(url, mat["runId"], dev_log)
            assert status == "SUCCESS", f"daily_sales run {mat['runId']} ended {status}\n{_tail(dev_log)}"
            page.reload()
            expect(page.get_by_text("Passed").first).to_be_visible(timeout=60_000)
            page.screenshot(path=artifacts / "7_materialized_checks_passed.png")
            # 6. a failing Materialize: the run names the step, task, tool kind, playbook line and the user's traceback
            page.goto(f"{url}/assets/t/ratios")
            expect(page.get_by_text("Materialize", exact=True).first).to_be_visible(timeout=60_000)
            before = {r["runId"] for r in _graphql(url, FAILED_RUNS, {})["runsOrError"]["results"]}
            page.get_by_text("Materialize", exact=True).first.click()
            run_id = _wait_new_run(url, "ratio_math__tables", before, dev_log)
            status = _wait_run(url, run_id, dev_log)
            assert status == "FAILURE", f"ratio_math run {run_id} ended {status}\n{_tail(dev_log)}"
            page.goto(f"{url}/runs/{run_id}?logs=type%3ASTEP_FAILURE")
            expect(page.get_by_text("failed in task divide (python) at").first).to_be_visible(timeout=60_000)
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
    daily = next(n for n in nodes if n["assetKey"]["path"] == ["sales", "daily_sales"])
    assert daily["isMaterializable"] and {"parquet", "duckdb"} <= set(daily["kinds"])
