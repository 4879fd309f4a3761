"""The execution pages in real Chromium (issue 36): ``dashboard serve``'s server over a real
event store of local runs, signed in with registry keys of two tenants.

- a cyclic execution's page: timeline bars for every step run and task attempt, the graph with
  tokens per arc; scrubbing the time changes the graph; clicking the failed step shows its
  error and playbook line; a loop bucket expands into its iterations;
- a diff of two runs that took different arcs: the divergence is shown, highlighted;
- another tenant's execution is a 404 (page and API), like an unknown id;
- hostile step names show as text, no handler runs, no CSP violation.
Screenshots go to ``$NOETL_TEST_ARTIFACTS`` (default ``<repo>/.test-artifacts``)/executions."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import httpx
import pytest
from conftest import PLAYBOOKS

from noetl_analytics.dashboard_access import KeyAuth
from noetl_analytics.execution_view import ExecutionViews
from noetl_analytics.interactive import make_server
from noetl_analytics.store import FactsStore, close_all
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store
from noetl_registry.service import Registry

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[2]
WATCH = """window.__csp = [];
document.addEventListener('securitypolicyviolation', (e) => window.__csp.push(e.effectiveDirective));"""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("execpages")
    url = f"sqlite:///{d / 'events.db'}"

    def run(name, workload=None, tenant="acme"):
        return run_playbook(
            PLAYBOOKS / name, workload, event_store=url, data_dir=d, tenant=tenant
        ).execution_id

    ids = {
        "left": run("explain_demo.yaml", {"route": "left"}),
        "right": run("explain_demo.yaml", {"route": "right"}),
        "loop": run("loop300.yaml", {"items": list(range(300)), "fail_at": 260}),
        "hostile": run("hostile_steps.yaml"),
        "globex": run("explain_demo.yaml", {"route": "left"}, tenant="globex"),
    }
    reg = Registry(f"sqlite:///{d / 'registry.db'}")
    keys = {t: reg.create_api_key(t)[1] for t in ("acme", "globex")}
    keys["acme_lab"] = reg.create_api_key("acme", "lab")[1]  # a project-scoped key: project lab only
    views = ExecutionViews(open_event_store(url), data_dir=str(d))
    server = make_server(FactsStore(f"chdb://{d / 'facts'}"), port=0, auth=KeyAuth(reg), executions=views)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"ids": ids, "keys": keys, "url": f"http://127.0.0.1:{server.server_address[1]}"}
    server.shutdown()
    server.server_close()
    reg.close()
    close_all()


@pytest.fixture
def artifacts():
    d = Path(os.environ.get("NOETL_TEST_ARTIFACTS", REPO / ".test-artifacts")) / "executions"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _get(world, path, who="acme", **params):
    key = world["keys"].get(who)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(world["url"] + path, params=params, headers=headers, follow_redirects=False, timeout=60)


def test_another_tenants_execution_is_not_found(world):
    ids = world["ids"]
    assert _get(world, f"/executions/{ids['left']}").status_code == 200
    assert _get(world, "/api/execution", id=ids["left"]).json()["execution"]["tenant"] == "acme"
    for path, params in ((f"/executions/{ids['globex']}", {}), ("/api/execution", {"id": ids["globex"]}),
                         ("/api/diff", {"a": ids["left"], "b": ids["globex"]}), ("/diff", {"a": ids["globex"], "b": ids["left"]}),
                         ("/api/execution/iterations", {"id": ids["globex"], "run": "x"})):  # fmt: skip
        r = _get(world, path, **params)
        assert r.status_code == 404, (path, r.status_code, r.text)
        assert "globex" not in r.text and "explain_demo" not in r.text
        unknown = _get(world, path, **{k: ("no-such-id" if v == ids["globex"] else v) for k, v in params.items()}) if params \
            else _get(world, "/executions/no-such-id")  # fmt: skip
        assert unknown.status_code == 404 and unknown.text.replace("no-such-id", ids["globex"]) == r.text
    # globex sees its own, not acme's
    assert _get(world, "/api/execution", "globex", id=ids["globex"]).status_code == 200
    assert _get(world, "/api/execution", "globex", id=ids["left"]).status_code == 404
    # a key of acme's project lab does not see acme's project default either
    assert _get(world, "/api/execution", "acme_lab", id=ids["left"]).status_code == 404
    # no key: sign in first
    assert _get(world, f"/executions/{ids['left']}", who="nobody").status_code == 401
    assert _get(world, "/api/execution", who="nobody", id=ids["left"]).status_code == 401
    # bad parameters: 400 / 404 with one line
    assert _get(world, "/api/execution/iterations", id=ids["loop"], run="x", offset="abc").status_code == 400
    assert _get(world, "/api/execution/iterations", id=ids["loop"], run="nope").status_code == 404


def _open(p, world, path, who="acme"):
    browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    page.add_init_script(WATCH)
    page.goto(f"{world['url']}/?key={world['keys'][who]}")
    page.goto(world["url"] + path)
    page.wait_for_selector("body[data-ready]", timeout=30_000)
    assert page.evaluate("document.body.dataset.ready") == "1", page.inner_text("#error")
    return browser, page


def test_cyclic_execution_page_timeline_graph_scrub_and_error(world, artifacts):
    from playwright.sync_api import sync_playwright

    assert os.path.exists(CHROMIUM), "Debian chromium missing: `make setup` installs it"
    with sync_playwright() as p:
        browser, page = _open(p, world, f"/executions/{world['ids']['right']}")
        try:
            bars = page.evaluate(
                "document.getElementById('timeline').data.filter(t => t.name.startsWith('step run')).reduce((a, t) => a + t.x.length, 0)"
            )
            assert bars == 6  # start, spin x3, fan, right
            attempts = page.evaluate(
                "document.getElementById('timeline').data.find(t => t.name === 'task attempt').x.length"
            )
            assert attempts == 6  # start, spin x3, and the failing task twice (loop attempts are in buckets)
            labels = "() => document.getElementById('graph').layout.annotations.map(a => a.text)"
            full = page.evaluate(labels)
            assert "↻ 2" in full  # spin -> spin: two tokens
            page.screenshot(path=str(artifacts / "1_execution.png"), full_page=True)
            # scrub to the start: no arc has passed a token yet
            page.fill("#scrub", "0")
            page.dispatch_event("#scrub", "input")
            early = page.evaluate(labels)
            assert "↻ 0" in early and early != full
            assert "0 of 6 step runs finished" in page.inner_text("#scrub-label")
            page.fill("#scrub", "1000")
            page.dispatch_event("#scrub", "input")
            # click the failed step in the graph: its error and playbook line
            page.evaluate("""() => { const gd = document.getElementById('graph'); const i = gd.data[0].customdata.indexOf('right');
                gd.emit('plotly_click', {points: [{customdata: 'right', pointIndex: i}]}); }""")
            text = page.inner_text("#details")
            assert "error: RuntimeError: right side is broken" in text
            line = next(
                i
                for i, t in enumerate((PLAYBOOKS / "explain_demo.yaml").read_text().splitlines(), 1)
                if t.strip() == "- step: right"
            )
            assert f"explain_demo.yaml:{line}" in text
            page.screenshot(path=str(artifacts / "2_failed_step.png"), full_page=True)
            assert page.evaluate("window.__csp") == []
        finally:
            browser.close()


def test_loop_buckets_expand_into_iterations(world, artifacts):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser, page = _open(p, world, f"/executions/{world['ids']['loop']}")
        try:
            buckets = page.evaluate(
                "document.getElementById('timeline').data.find(t => t.name === 'loop iterations').customdata"
            )
            assert sum(b[3] - b[2] + 1 for b in buckets) == 300 and len(buckets) <= 60
            failed = next(b for b in buckets if b[2] <= 260 <= b[3])
            page.evaluate(f"""() => document.getElementById('timeline').emit('plotly_click',
                {{points: [{{customdata: {list(failed)}}}]}})""")
            page.wait_for_function(
                "() => document.getElementById('timeline').data.some(t => t.name.startsWith('iterations '))"
            )
            tr = page.evaluate(
                "document.getElementById('timeline').data.find(t => t.name.startsWith('iterations ')).hovertext"
            )
            assert len(tr) == failed[3] - failed[2] + 1 and any(
                "iteration 260: error" in h and "item 260 is bad" in h for h in tr
            )
            page.screenshot(path=str(artifacts / "3_loop_expanded.png"), full_page=True)
        finally:
            browser.close()


def test_diff_page_highlights_the_divergence(world, artifacts):
    from playwright.sync_api import sync_playwright

    ids = world["ids"]
    with sync_playwright() as p:
        browser, page = _open(p, world, f"/diff?a={ids['left']}&b={ids['right']}")
        try:
            box = page.locator("#divergence")
            assert box.get_attribute("data-kind") == "arc" and box.get_attribute("data-step") == "fan"
            assert "fired ['left'] in A, ['right'] in B" in box.inner_text()
            assert (
                box.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(255, 243, 205)"
            )  # highlighted
            assert "workload.route" in page.inner_text("#diff-tables")
            page.screenshot(path=str(artifacts / "4_diff.png"), full_page=True)
        finally:
            browser.close()


def test_hostile_step_names_render_as_text(world, artifacts):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser, page = _open(p, world, f"/executions/{world['ids']['hostile']}")
        try:
            names = page.evaluate("document.getElementById('graph').data[0].customdata")
            assert "<img src=x onerror=window.__xss=1>" in names
            svg = page.inner_text("#graph")  # the label shows literally, as typed
            assert (
                "<img src=x onerror=window.__xss=1>" in svg
                and '<b>b</b><a href="javascript:window.__xss=2">x</a>' in svg
            )
            page.evaluate("""() => { const gd = document.getElementById('graph');
                gd.emit('plotly_click', {points: [{customdata: gd.data[0].customdata[1]}]}); }""")
            assert page.inner_text("#details").startswith("<img src=x onerror=window.__xss=1>")
            assert page.locator("img").count() == 0 and page.locator("#graph a").count() == 0
            assert page.evaluate("window.__xss") is None and page.evaluate("window.__csp") == []
            page.screenshot(path=str(artifacts / "5_hostile.png"), full_page=True)
        finally:
            browser.close()
