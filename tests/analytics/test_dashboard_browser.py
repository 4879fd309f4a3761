"""The interactive cost dashboard in a real browser (issue 18.4): Playwright drives Debian
Chromium (``/usr/bin/chromium``, installed by ``make setup``) against ``dashboard serve``'s
server over a chdb facts store holding the SYNTHETIC 30-day demo history; a filter change
and a date-range change must change the charts' data; the static export works offline.
Screenshots go to .test-artifacts/dashboard (gitignored)."""

from __future__ import annotations

import os
import threading
from datetime import date, timedelta
from pathlib import Path

import pytest

from noetl_analytics.dashboard_access import KeyAuth
from noetl_analytics.demo_history import generate_history
from noetl_analytics.interactive import export_static, make_server
from noetl_analytics.rollups import refresh_rollups
from noetl_analytics.store import FactsStore, close_all
from noetl_registry.service import Registry

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture
def artifacts():
    d = Path(os.environ.get("NOETL_TEST_ARTIFACTS", REPO / ".test-artifacts")) / "dashboard"
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture
def served(tmp_path):
    store = FactsStore(f"chdb://{tmp_path / 'facts'}")
    generate_history(store, days=30, per_day=1500)
    refresh_rollups(store)
    reg = Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    _, key = reg.create_api_key("platform")  # the admin tenant: every synthetic tenant shows
    server = make_server(store, port=0, auth=KeyAuth(reg, admin_tenants=["platform"]))
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield store, f"http://127.0.0.1:{server.server_address[1]}/?key={key}"
    server.shutdown()
    server.server_close()
    reg.close()
    close_all()


TOTALS = """() => {
  const gd = document.getElementById('ts');
  return {names: gd.data.map(t => t.name), days: gd.data.length ? gd.data[0].x.length : 0,
          total: gd.data.reduce((a, t) => a + t.y.reduce((b, v) => b + v, 0), 0)};
}"""


def _open(p, url):
    browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1400, "height": 1300})
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    return browser, page


def test_filters_and_date_range_change_the_charts(served, artifacts, tmp_path):
    from playwright.sync_api import sync_playwright

    assert os.path.exists(CHROMIUM), "Debian chromium missing: `make setup` installs it"
    store, url = served
    with sync_playwright() as p:
        browser, page = _open(p, url)
        try:
            assert page.is_visible("#banner")  # synthetic data is labelled as such
            assert page.is_visible("#idle")  # the cluster view: an admin key
            before = page.evaluate(TOTALS)
            assert len(before["names"]) == 4 and before["days"] >= 28 and before["total"] > 0
            page.screenshot(path=str(artifacts / "1_all_tenants.png"), full_page=True)
            # 1. a tenant filter: one series left, a smaller total
            page.select_option("#f-tenant", "synthetic-umbrella")
            page.wait_for_function("() => document.getElementById('ts').data.length === 1")
            one = page.evaluate(TOTALS)
            assert one["names"] == ["synthetic-umbrella"] and 0 < one["total"] < before["total"]
            # drill-down chart is at the playbook level now
            assert "playbook" in page.evaluate("document.getElementById('steps').layout.title.text")
            page.screenshot(path=str(artifacts / "2_tenant_filter.png"), full_page=True)
            # 2. a date range: the server is asked again; fewer days
            week_start = date.fromisoformat(page.input_value("#f-end")) - timedelta(days=6)
            page.fill("#f-start", week_start.isoformat())
            page.dispatch_event("#f-start", "change")
            page.wait_for_function(f"() => document.getElementById('ts').data[0].x.length < {one['days']}")
            week = page.evaluate(TOTALS)
            assert week["days"] < one["days"] and week["total"] < one["total"]
            page.screenshot(path=str(artifacts / "3_date_range.png"), full_page=True)
        finally:
            browser.close()
        # the static export: same page, data inlined, filters work without a server
        html = export_static(store, tmp_path / "static")
        browser, page = _open(p, html.as_uri())
        try:
            before = page.evaluate(TOTALS)
            page.select_option("#f-tenant", "synthetic-acme")
            page.wait_for_function("() => document.getElementById('ts').data.length === 1")
            after = page.evaluate(TOTALS)
            assert after["total"] < before["total"] and after["names"] == ["synthetic-acme"]
            page.screenshot(path=str(artifacts / "4_static_export.png"), full_page=True)
        finally:
            browser.close()
