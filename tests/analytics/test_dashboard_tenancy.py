"""Tenant-safe dashboards (issue 30.5), on real runs, a real registry and real Chromium.

Real executions (two hostile playbooks whose ``metadata.path`` is HTML / Plotly markup, and a
failing one) for acme/sales, acme/lab and globex/research are exported to a chdb facts store;
``dashboard serve``'s server signs in with keys from a SQLite registry (acme, acme/lab,
globex, a revoked globex key, and ``platform``, the admin tenant). Checked:

- every data endpoint and the page answer 401 without a key, and bad keys get one-line errors;
- each key's API answers (every endpoint in ``interactive._API``) hold only its tenant's rows
  (not even the other tenant's name); the cluster view is 403 for tenants, 200 for admin;
- the gate refuses a query that does not name its tenant columns;
- in Chromium the hostile names show literally (select options, Plotly labels), no handler runs
  (a window flag stays unset, no CSP violation), the CSP blocks an injected inline handler, and
  each tenant sees only its rows in the page;
- ``export --tenant T`` writes only T's rows, with the same guarantees offline.
Screenshots go to ``$NOETL_TEST_ARTIFACTS`` (default ``<repo>/.test-artifacts``)/dashboard.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from noetl_analytics import interactive
from noetl_analytics.dashboard_access import KeyAuth, RegistryUnavailable, TenantScope, Unauthorized, Viewer
from noetl_analytics.exporter import FactExporter
from noetl_analytics.interactive import make_server
from noetl_analytics.rollups import refresh_rollups
from noetl_analytics.store import FactsStore, close_all
from noetl_dagster.commands.facts_demo import run_playbooks
from noetl_dagster.commands.main import cli
from noetl_dagster.storage.events import SqliteEventStore
from noetl_registry.errors import Forbidden
from noetl_registry.service import Registry

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[2]
HOSTILE = sorted((Path(__file__).parent / "hostile").glob("*.yaml"))
FAILING = Path(__file__).parent / "playbooks" / "facts_fail.yaml"
IMG = "evil/<img src=x onerror=window.__xss=1>"
MARKUP = 'evil/<b>bold</b><a href="javascript:window.__xss=2">link</a>'
TENANTS = (("acme", "sales"), ("acme", "lab"), ("globex", "research"))

pytestmark = pytest.mark.slow

# CSP violations and the flags a hostile handler would set, recorded from the first script on
WATCH = """window.__csp = [];
document.addEventListener('securitypolicyviolation', (e) => window.__csp.push(e.effectiveDirective));"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("tenancy")
    log = SqliteEventStore(d / "events.db")
    results = run_playbooks([*HOSTILE, FAILING], d, tenants=TENANTS, event_store=log)
    assert not [r for *_, r in results if isinstance(r, Exception)]
    store = FactsStore(f"chdb://{d / 'facts'}")
    FactExporter(store, log).export()
    log.close()
    refresh_rollups(store)
    reg = Registry(f"sqlite:///{d / 'registry.db'}")
    keys = {
        name: reg.create_api_key(t, p)[1]
        for name, t, p in (
            ("acme", "acme", None),
            ("acme_lab", "acme", "lab"),
            ("globex", "globex", None),
            ("platform", "platform", None),
        )
    }
    revoked_id, keys["revoked"] = reg.create_api_key("globex")
    reg.revoke_api_key(revoked_id)
    server = make_server(store, port=0, auth=KeyAuth(reg, admin_tenants=["platform"]))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    yield {"dir": d, "store": store, "registry": reg, "keys": keys, "url": url}
    server.shutdown()
    server.server_close()
    reg.close()
    close_all()


@pytest.fixture
def artifacts():
    d = Path(os.environ.get("NOETL_TEST_ARTIFACTS", REPO / ".test-artifacts")) / "dashboard"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _get(world, path, key=None, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(world["url"] + path, headers={**headers, **kw.pop("headers", {})}, follow_redirects=False,
                     timeout=60, **kw)  # fmt: skip


DATA_PATHS = sorted(interactive._API)  # every data endpoint the server has


# ------------------------------------------------------------------ API: who gets in
@pytest.mark.parametrize("path", ["/", *DATA_PATHS])
def test_every_page_and_endpoint_needs_a_key(world, path):
    r = _get(world, path)
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    if path == "/":
        assert 'action="/login"' in r.text  # the sign-in form, not the dashboard
    else:
        assert "sign in with an API key" in r.json()["error"]
    # the scripts carry no data: public
    assert _get(world, "/dashboard_app.js").status_code == 200


BAD = {
    "malformed": ("Authorization", "Bearer not-a-key", "malformed API key"),
    "unknown": ("Authorization", "Bearer nrk_0123456789abcdef_" + "x" * 43, "unknown or revoked API key"),
    "revoked": ("Authorization", "Bearer {revoked}", "unknown or revoked API key"),
    "basic scheme": ("Authorization", "Basic YWNtZTpzZWNyZXQ=", "Authorization must be 'Bearer <API key>'"),
    "bare bearer": ("Authorization", "Bearer", "Authorization must be 'Bearer <API key>'"),
    "too long": ("Authorization", "Bearer nrk_" + "a" * 300, "malformed API key"),
    "forged cookie": ("Cookie", "noetl_dashboard=forged-session-id", "sign in with an API key"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_keys_get_401_and_one_line(world, case):
    header, value, message = BAD[case]
    for path in DATA_PATHS:
        r = _get(world, path, headers={header: value.format(**world["keys"])})
        assert r.status_code == 401, (case, path, r.text)
        error = r.json()["error"]
        assert message in error and "\n" not in error and "Traceback" not in error


def test_key_exchange_sets_an_httponly_cookie_and_drops_the_key_from_the_url(world):
    r = _get(world, "/?key=" + world["keys"]["acme"])
    assert r.status_code == 303 and r.headers["Location"] == "/"
    cookie = r.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and world["keys"]["acme"] not in cookie
    sid = cookie.split(";")[0]
    ok = _get(world, "/api/data", headers={"Cookie": sid})
    assert ok.status_code == 200 and {row["tenant"] for row in ok.json()["rows"]} == {"acme"}
    # a bad key in the exchange: the sign-in form again, saying why, and no cookie
    bad = _get(world, "/?key=" + world["keys"]["revoked"])
    assert (
        bad.status_code == 401
        and "unknown or revoked API key" in bad.text
        and "Set-Cookie" not in bad.headers
    )
    # the form posts the same way
    form = httpx.post(world["url"] + "/login", data={"key": world["keys"]["globex"]}, follow_redirects=False)
    assert form.status_code == 303 and "HttpOnly" in form.headers["Set-Cookie"]
    refused = httpx.post(world["url"] + "/login", data={"key": "nope"}, follow_redirects=False)
    assert refused.status_code == 401 and "malformed API key" in refused.text
    # a form posted from another site is refused (no login CSRF into someone else's tenant)
    for origin in ("http://evil.example", "null"):
        csrf = httpx.post(world["url"] + "/login", data={"key": world["keys"]["globex"]}, follow_redirects=False,
                          headers={"Origin": origin})  # fmt: skip
        assert csrf.status_code == 403 and "Set-Cookie" not in csrf.headers
    # sign out ends the session on the server, not only in the browser
    out = httpx.post(world["url"] + "/logout", headers={"Cookie": sid}, follow_redirects=False)
    assert out.status_code == 303 and "Max-Age=0" in out.headers["Set-Cookie"]
    assert _get(world, "/api/data", headers={"Cookie": sid}).status_code == 401


def test_a_revoked_key_ends_its_session_on_the_next_request(world):
    reg = world["registry"]
    key_id, key = reg.create_api_key("acme", label="short-lived")
    sid = _get(world, "/?key=" + key).headers["Set-Cookie"].split(";")[0]
    assert _get(world, "/api/data", headers={"Cookie": sid}).status_code == 200
    reg.revoke_api_key(key_id)
    r = _get(world, "/api/data", headers={"Cookie": sid})
    assert r.status_code == 401 and "revoked" in r.json()["error"]


def test_bad_parameters_after_sign_in_are_400(world):
    r = _get(world, "/api/data?start=yesterday", world["keys"]["acme"])
    assert r.status_code == 400 and r.json() == {"error": "not a date (YYYY-MM-DD): 'yesterday'"}
    assert _get(world, "/api/nothing", world["keys"]["acme"]).status_code == 404


# ------------------------------------------------------------- API: who sees what
def _steps(world):
    """(tenant, playbook, step) of every task attempt, from the admin's rows."""
    rows = _get(world, "/api/data", world["keys"]["platform"]).json()["rows"]
    return sorted({(r["tenant"], r["playbook"], r["step"]) for r in rows})


@pytest.mark.parametrize("who,tenant,project", [("acme", "acme", None), ("acme_lab", "acme", "lab"),
                                                ("globex", "globex", None)])  # fmt: skip
def test_each_key_reads_only_its_tenant_from_every_endpoint(world, who, tenant, project):
    key = world["keys"][who]
    data = _get(world, "/api/data", key).json()
    assert data["viewer"] == {
        "tenant": tenant,
        "project": project,
        "admin": False,
        "name": f"{tenant}/{project}" if project else tenant,
    }
    assert {r["tenant"] for r in data["rows"]} == {tenant}
    assert {r["project"] for r in data["rows"]} == (
        {project} if project else {p for t, p in TENANTS if t == tenant}
    )
    assert {r["playbook"] for r in data["rows"]} >= {IMG, MARKUP}
    others = [t for t, _ in TENANTS if t != tenant] + [p for t, p in TENANTS if project and p != project]
    # every endpoint, asked for every (tenant, playbook, step) there is: nothing of anyone else
    for path in DATA_PATHS:
        queries = [{}] + [{"tenant": t, "playbook": pb, "step": s} for t, pb, s in _steps(world)]
        for q in queries:
            r = _get(world, path, key, params=q)
            if path == "/api/cluster":
                assert r.status_code == 403 and "admin" in r.json()["error"]
                continue
            assert r.status_code == 200, (path, q, r.text)
            for other in others:
                assert other not in r.text, (who, path, q, other)
            if path == "/api/executions" and q.get("tenant") != tenant:
                assert r.json() == []
    own = [(t, pb, s) for t, pb, s in _steps(world) if t == tenant]
    execs = _get(
        world, "/api/executions", key, params=dict(zip(("tenant", "playbook", "step"), own[0], strict=True))
    )
    assert execs.json(), "its own executions are listed"


def test_admin_key_sees_every_tenant_and_the_cluster_view(world):
    key = world["keys"]["platform"]
    data = _get(world, "/api/data", key).json()
    assert data["viewer"]["admin"] is True
    assert {r["tenant"] for r in data["rows"]} >= {"acme", "globex"}
    cluster = _get(world, "/api/cluster", key)
    assert cluster.status_code == 200 and cluster.json() and {"idle", "unallocated"} <= set(cluster.json()[0])
    # a project-scoped key of the admin tenant is not an admin
    reg = world["registry"]
    _, scoped = reg.create_api_key("platform", "ops")
    assert _get(world, "/api/cluster", scoped).status_code == 403


def test_the_gate_refuses_a_query_without_its_tenant_columns(world):
    scope = TenantScope(world["store"], Viewer.of_tenant("acme"))
    with pytest.raises(RuntimeError, match=r"without \$scope"):
        scope.query("SELECT tenant, cost FROM $db.allocation_cost_day")
    with pytest.raises(Forbidden):
        scope.cluster_query("SELECT * FROM $db.allocation_summary_day")
    _, rows = scope.query("SELECT DISTINCT tenant FROM $db.allocation_cost_day WHERE $scope(tenant, project)")
    assert rows == [("acme",)]
    # the tenant is a bound parameter, never SQL text
    sneaky = TenantScope(world["store"], Viewer.of_tenant("x' OR 1=1 OR tenant='"))
    _, rows = sneaky.query("SELECT count() FROM $db.allocation_cost_day WHERE $scope(tenant, project)")
    assert rows == [(0,)]


def test_served_page_has_a_csp_without_inline_script(world):
    r = _get(world, "/", world["keys"]["acme"])
    csp = r.headers["Content-Security-Policy"]
    script_src = re.search(r"script-src ([^;]*)", csp).group(1)
    assert script_src.strip() == "'self'" and "unsafe" not in script_src
    assert "frame-ancestors 'none'" in csp and r.headers["X-Content-Type-Options"] == "nosniff"
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", r.text), "no inline script in the served page"
    app = _get(world, "/dashboard_app.js").text
    assert not re.search(r"\.(innerHTML|outerHTML)\s*=|insertAdjacentHTML|document\.write", app)


# ------------------------------------------------------------------------ browser
def _launch(p):
    assert os.path.exists(CHROMIUM), "Debian chromium missing: `make setup` installs it"
    return p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])


def _page(browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.add_init_script(WATCH)
    return page


def _wait_ready(page):
    page.wait_for_selector("body[data-ready]", timeout=60_000)
    assert page.evaluate("document.body.dataset.ready") == "1", page.text_content("#error")


SHOWN = """() => ({
  tenants: [...document.querySelectorAll('#f-tenant option')].map(o => o.value).filter(Boolean),
  projects: [...document.querySelectorAll('#f-project option')].map(o => o.value).filter(Boolean),
  playbooks: [...document.querySelectorAll('#f-playbook option')].map(o => o.textContent).filter(t => t !== '(all)'),
  traces: document.getElementById('ts').data.map(t => t.name),
  ticks: [...document.querySelectorAll('#topn .ytick text, #rates .ytick text')].map(t => t.textContent),
  links: document.querySelectorAll('#topn svg a, #rates svg a, #steps svg a').length,
  bold: document.querySelectorAll('#topn tspan[style*="bold"], #rates tspan[style*="bold"]').length,
  imgs: document.querySelectorAll('img').length,
  idle: !document.getElementById('idle').hidden,
  who: document.getElementById('who').textContent,
  xss: window.__xss, csp: window.__csp,
  text: document.body.innerText,
})"""

PROBE = """() => new Promise((done) => {
  // what an innerHTML bug would do: the CSP must stop the handler
  const d = document.createElement('div');
  d.innerHTML = '<img src="data:," onerror="window.__probe=1"><img src=x onerror="window.__probe=1">';
  document.body.append(d);
  setTimeout(() => done({probe: window.__probe, csp: window.__csp.slice()}), 500);
})"""


def _assert_safe(shown, tenant):
    assert shown["xss"] is None and shown["csp"] == [] and shown["imgs"] == 0
    assert IMG in shown["playbooks"] and MARKUP in shown["playbooks"]  # the names, literally
    assert f"{tenant} / {IMG}" in shown["ticks"] and f"{tenant} / {MARKUP}" in shown["ticks"]  # top N
    assert IMG in shown["ticks"] and MARKUP in shown["ticks"]  # error and retry rates
    assert shown["links"] == 0 and shown["bold"] == 0  # Plotly drew no <a> and no bold: text


def test_browser_hostile_names_are_text_and_each_tenant_sees_its_own(world, artifacts):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = _launch(p)
        try:
            page = _page(browser)
            page.goto(world["url"] + "/")  # not signed in: the form
            assert page.is_visible("input[name=key]")
            page.goto(world["url"] + "/?key=" + world["keys"]["acme"])
            _wait_ready(page)
            assert page.url == world["url"] + "/"  # the key is not left in the address bar
            assert page.evaluate("document.cookie") == ""  # HttpOnly
            acme = page.evaluate(SHOWN)
            _assert_safe(acme, "acme")
            assert (
                acme["tenants"] == ["acme"]
                and acme["traces"] == ["acme"]
                and sorted(acme["projects"]) == ["lab", "sales"]
            )
            assert not acme["idle"] and "globex" not in acme["text"] and "research" not in acme["text"]
            assert acme["who"] == "tenant acme"
            page.screenshot(path=str(artifacts / "tenant_acme.png"), full_page=True)
            # drill down to a hostile playbook's step: the executions table is text too
            page.select_option("#f-playbook", IMG)
            page.wait_for_function(
                "() => document.getElementById('steps').layout.title.text.includes('step')"
            )
            page.evaluate(
                "document.getElementById('steps').emit('plotly_click', {points: [{customdata: ['start', 0]}]})"
            )
            page.wait_for_selector("#executions table td")
            assert page.text_content("#exec-title") == f"acme / {IMG} / start"
            assert page.evaluate("window.__xss") is None and page.evaluate("window.__csp") == []
            page.screenshot(path=str(artifacts / "tenant_acme_drilldown.png"), full_page=True)
            probe = page.evaluate(PROBE)
            assert probe["probe"] is None and "script-src-attr" in probe["csp"]
            # sign out, sign in as globex with the form
            page.click("text=sign out")
            page.fill("input[name=key]", world["keys"]["globex"])
            page.click("button[type=submit]")
            _wait_ready(page)
            globex = page.evaluate(SHOWN)
            _assert_safe(globex, "globex")
            assert (
                globex["tenants"] == ["globex"]
                and globex["traces"] == ["globex"]
                and globex["projects"] == ["research"]
            )
            assert "acme" not in globex["text"] and not globex["idle"]
            page.screenshot(path=str(artifacts / "tenant_globex.png"), full_page=True)
            # the admin sees both, and the cluster view
            admin = _page(browser)
            admin.goto(world["url"] + "/?key=" + world["keys"]["platform"])
            _wait_ready(admin)
            everyone = admin.evaluate(SHOWN)
            assert (
                {"acme", "globex"} <= set(everyone["tenants"]) and everyone["idle"] and everyone["csp"] == []
            )
            assert everyone["xss"] is None and everyone["who"] == "platform (admin): all tenants"
            admin.screenshot(path=str(artifacts / "admin_all_tenants.png"), full_page=True)
            # a wrong key in the form: the form again, saying why
            bad = _page(browser)
            bad.goto(world["url"] + "/login")
            bad.fill("input[name=key]", world["keys"]["revoked"])
            bad.click("button[type=submit]")
            assert "unknown or revoked API key" in bad.text_content(".err")
        finally:
            browser.close()


def test_export_tenant_writes_only_its_rows_and_keeps_names_text(world, artifacts, tmp_path):
    from playwright.sync_api import sync_playwright

    facts = f"chdb://{world['dir'] / 'facts'}"
    out = tmp_path / "acme"
    r = CliRunner().invoke(cli, ["dashboard", "export", "--clickhouse", facts, "--data-dir", str(world["dir"]),
                                 "--out", str(out), "--tenant", "acme"])  # fmt: skip
    assert r.exit_code == 0, r.output
    html = (out / "cost.html").read_text()
    assert "globex" not in html and "research" not in html
    inline = json.loads(re.search(r'id="noetl-data">(.*?)</script>', html, re.S).group(1))
    assert {row["tenant"] for row in inline["rows"]} == {"acme"} and inline["cluster"] is None
    assert "<img" not in html.split('id="noetl-data">')[1].split("</script>")[0]  # data never raw markup
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', html).group(1)
    assert "unsafe" not in re.search(r"script-src ([^;]*)", csp).group(1)
    with sync_playwright() as p:
        browser = _launch(p)
        try:
            page = _page(browser)
            page.goto((out / "cost.html").as_uri())
            _wait_ready(page)
            shown = page.evaluate(SHOWN)
            _assert_safe(shown, "acme")
            assert shown["tenants"] == ["acme"] and not shown["idle"] and "globex" not in shown["text"]
            page.screenshot(path=str(artifacts / "export_tenant_acme.png"), full_page=True)
            probe = page.evaluate(PROBE)
            assert probe["probe"] is None and "script-src-attr" in probe["csp"]
        finally:
            browser.close()
    # the operator's export of everyone holds the cluster view
    r = CliRunner().invoke(cli, ["dashboard", "export", "--clickhouse", facts, "--data-dir", str(world["dir"]),
                                 "--out", str(tmp_path / "all"), "--all-tenants"])  # fmt: skip
    assert r.exit_code == 0, r.output
    inline = json.loads(
        re.search(
            r'id="noetl-data">(.*?)</script>', (tmp_path / "all" / "cost.html").read_text(), re.S
        ).group(1)
    )
    assert {"acme", "globex"} <= {row["tenant"] for row in inline["rows"]} and inline["cluster"]


@pytest.mark.parametrize("args,message", [
    ([], "say whose rows to write: --tenant T (one tenant) or --all-tenants"),
    (["--tenant", "acme", "--all-tenants"], "say whose rows to write"),
    (["--project", "lab"], "say whose rows to write"),
    (["--tenant", "nobody"], "no cost rows for tenant 'nobody'"),
    (["--tenant", "acme", "--project", "nothing"], "no cost rows for tenant 'acme' project 'nothing'"),
])  # fmt: skip
def test_export_cli_errors_are_one_line(world, tmp_path, args, message):
    facts = f"chdb://{world['dir'] / 'facts'}"
    r = CliRunner().invoke(cli, ["dashboard", "export", "--clickhouse", facts, "--data-dir", str(world["dir"]),
                                 "--out", str(tmp_path / "x"), *args])  # fmt: skip
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output
    assert not (tmp_path / "x" / "cost.html").exists()


# ---------------------------------------------------------- the HTTP registry, the CLI
def test_keys_checked_by_a_registry_over_http(world):
    import uvicorn

    from noetl_registry.app import create_app

    srv = uvicorn.Server(uvicorn.Config(create_app(world["registry"]), host="127.0.0.1", port=0, log_level="warning",
                                        lifespan="off"))  # fmt: skip
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        port = srv.servers[0].sockets[0].getsockname()[1]
        auth = KeyAuth(f"http://127.0.0.1:{port}", admin_tenants=["platform"])
        auth.check()
        assert auth.viewer(world["keys"]["acme_lab"]) == Viewer.of_tenant(
            "acme", "lab", auth.viewer(world["keys"]["acme_lab"]).key_id
        )
        assert auth.viewer(world["keys"]["platform"]).admin
        for bad in (world["keys"]["revoked"], "nrk_x_y", "bad\nkey", ""):
            with pytest.raises(Unauthorized):
                auth.viewer(bad)
    finally:
        srv.should_exit = True
        t.join(10)
    with pytest.raises(RegistryUnavailable, match="unreachable"):
        KeyAuth(f"http://127.0.0.1:{port}", timeout=2).viewer(world["keys"]["acme"])


def test_serve_refuses_an_unreachable_registry_in_one_line(world):
    r = CliRunner().invoke(cli, ["dashboard", "serve", "--registry", "http://127.0.0.1:9/", "--no-refresh",
                                 "--clickhouse", f"chdb://{world['dir'] / 'facts'}"])  # fmt: skip
    assert r.exit_code == 2 and "unreachable" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_plotly_labels_show_any_string_as_typed(world, tmp_path):
    """The page's esc() + Plotly's label markup, on generated strings over the characters that
    matter (<, >, &, ;, #, quotes, /, =) and known payloads: every label reads exactly as typed."""
    import random

    from playwright.sync_api import sync_playwright

    from noetl_analytics.interactive import export_static

    rng = random.Random(30)
    alphabet = "<>&;#/=\"'abAB01 x"
    strings = [IMG, MARKUP, "<script>window.__xss=3</script>", "<svg onload=window.__xss=4>", "&lt;b&gt;x&lt;/b&gt;",
               "&#60;i&#62;", "<br>line", "<sub>s</sub><sup>p</sup>", '<span style="font-size:80px">big</span>',
               "&amp;", "&nbsp;", "&mu;", "</text><foreignObject>"]  # fmt: skip
    strings += [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))).strip() or "x" for _ in range(300)
    ]
    strings = list(dict.fromkeys(strings))
    html = export_static(world["store"], tmp_path, viewer=Viewer.of_tenant("acme"))
    with sync_playwright() as p:
        browser = _launch(p)
        try:
            page = _page(browser)
            page.goto(html.as_uri())
            _wait_ready(page)
            shown = page.evaluate("""async (strings) => {
              const div = document.createElement('div'); document.body.append(div);
              await Plotly.newPlot(div, strings.map((s, i) => ({type: 'bar', name: esc(s), x: [1], y: [i]})), {showlegend: true});
              return [...div.querySelectorAll('.legendtext')].map(t => t.textContent);
            }""", strings)  # fmt: skip
            assert [(s, g) for s, g in zip(strings, shown, strict=True) if s != g] == []
            assert page.evaluate("window.__xss") is None and page.evaluate("window.__csp") == []
        finally:
            browser.close()
