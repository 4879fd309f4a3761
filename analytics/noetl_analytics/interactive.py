"""Interactive cost dashboard (issue 18.4): Plotly charts over ClickHouse queries.

One page, two ways to ship it:
- ``serve``: a small HTTP server; the page asks ``/api/data`` (the allocation rollup for a
  date range, from ClickHouse at each request), ``/api/executions`` (drill-down to the
  executions of one tenant / playbook / step, from ``task_fact``) and, for admin keys,
  ``/api/cluster`` (allocated / unallocated / idle per day).
- ``export``: the same page with one viewer's data of the whole range inlined (no server; the
  execution drill-down lists what was inlined).

Tenancy (issue 30.5): every request but the static scripts and the sign-in form needs a
registry API key (``Authorization: Bearer``, or the HttpOnly session cookie that ``/login``
or ``/?key=`` hands out), and every query goes through :class:`noetl_analytics.dashboard_access.TenantScope`,
which filters by the key's tenant in SQL. Data reaches the page only as JSON and is shown as
text (see dashboard_app.js); the served page carries a Content-Security-Policy without
inline script, the export a meta policy allowing only its own two scripts by hash.

Filters (tenant, project, playbook, date range) apply in the browser to the rollup rows;
charts: cost per day per tenant, idle / unallocated per day (admin), top-N playbooks, cost
per step of the selected playbook, error and retry rates. Clicking a tenant, playbook or step
drills down. Plotly's own bundle is served / inlined: nothing is fetched from the internet.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import threading
from collections.abc import Callable
from datetime import date
from http.cookies import CookieError, SimpleCookie
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from noetl_analytics import execution_page
from noetl_analytics.dashboard_access import KeyAuth, Sessions, TenantScope, Viewer
from noetl_analytics.execution_view import ExecutionViews, preload_layout
from noetl_analytics.store import FactsStore
from noetl_dagster.engine.explain import UnknownExecution
from noetl_dagster.util.http_body import BoundedBodyHandler
from noetl_registry.errors import RegistryError, Unauthorized

_ROWS = """SELECT tenant, project, playbook, step, day, round(sum(cost), 12) AS cost,
    round(sum(cpu_core_hours), 9) AS cpu_core_hours, round(sum(ram_byte_hours) / 1e9, 9) AS ram_gb_hours,
    sum(egress_bytes) AS egress_bytes, sum(attempts) AS attempts, sum(failed_attempts) AS failed, sum(retries) AS retries,
    sum(executions) AS executions
FROM $db.allocation_cost_day
WHERE day BETWEEN {start:Date} AND {end:Date} AND $scope(tenant, project)
GROUP BY tenant, project, playbook, step, day
ORDER BY day, tenant, project, playbook, step"""

_SUMMARY = """SELECT day, round(allocated, 9) AS allocated, round(unallocated, 9) AS unallocated,
    round(ifNull(storage_cost, 0), 9) AS storage, round(idle, 9) AS idle, round(capacity_cost, 9) AS capacity
FROM $db.allocation_summary_day WHERE day BETWEEN {start:Date} AND {end:Date} ORDER BY day"""

# task attempts, and the engine's own CPU (the `platform` line, step ''), under the playbook name the
# priced rows use (execution_dim)
_EXECUTIONS = """SELECT execution_id, min(ts) AS started, countIf(what = 'task') AS attempts, countIf(status = 'error') AS failed,
    round(sum(cpu_ms) / 3.6e6, 9) AS cpu_core_hours, round(sum(duration_ms) / 1000, 3) AS seconds
FROM
(
    SELECT _x.*, if(_dim.playbook = '', '(unknown)', _dim.playbook) AS playbook
    FROM
    (
        SELECT execution_id, ts, tenant_id, project_id, step, 'task' AS what, status,
               coalesce(cpu_ms, duration_ms) AS cpu_ms, duration_ms
        FROM $db.task_fact FINAL
        UNION ALL
        SELECT execution_id, ts, tenant_id, project_id, step, 'platform', '', used * 3.6e6, 0
        FROM $db.usage_fact FINAL WHERE category = 'platform'
    ) AS _x
    LEFT JOIN $db.execution_dim AS _dim ON _dim.execution_id = _x.execution_id
)
WHERE tenant_id = {tenant:String} AND playbook = {playbook:String} AND step = {step:String}
    AND toDate(ts) BETWEEN {start:Date} AND {end:Date} AND $scope(tenant_id, project_id)
GROUP BY execution_id ORDER BY cpu_core_hours DESC LIMIT 50"""

_DAYS = "SELECT min(day), max(day) FROM $db.cost_line_day WHERE $scope(tenant_id, project_id)"

APP_JS = Path(__file__).parent / "dashboard_app.js"
COOKIE = "noetl_dashboard"
MAX_FORM_BYTES = 4096

# the served page: scripts only from this origin, no inline script or event handler; Plotly
# needs inline styles (it positions its SVG with style attributes)
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
       "font-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")  # fmt: skip


def _records(cols: list[str], rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [
        {c: (v.isoformat() if hasattr(v, "isoformat") else v) for c, v in zip(cols, r, strict=True)}
        for r in rows
    ]


def _scope(store: FactsStore | TenantScope, viewer: Viewer | None = None) -> TenantScope:
    if isinstance(store, TenantScope):
        return store
    return TenantScope(store, viewer or Viewer.everyone())


def date_range(scope: TenantScope) -> tuple[date, date]:
    _, rows = scope.query(_DAYS)
    lo, hi = rows[0] if rows else (None, None)
    today = date.today()
    # an empty scope reads as 1970-01-01 from the aggregate (min of nothing): today then
    lo = lo if lo and lo.year > 1970 else None
    hi = hi if hi and hi.year > 1970 else None
    return (lo or today), (hi or today)


def dashboard_data(
    store: FactsStore | TenantScope, start: date | None = None, end: date | None = None
) -> dict[str, Any]:
    """The viewer's rollup rows for [start, end] (a bare store: every tenant)."""
    scope = _scope(store)
    lo, hi = date_range(scope)
    start, end = start or lo, end or hi
    cols, rows = scope.query(_ROWS, {"start": start, "end": end})
    currency, version = scope.prices()
    records = _records(cols, rows)
    return {
        "start": start.isoformat(), "end": end.isoformat(), "min_day": lo.isoformat(), "max_day": hi.isoformat(),
        "currency": currency, "price_version": version,
        "synthetic": any(str(r["tenant"]).startswith("synthetic-") for r in records),
        "rows": records, "viewer": scope.viewer.public(),
    }  # fmt: skip


def cluster_summary(
    store: FactsStore | TenantScope, start: date | None = None, end: date | None = None
) -> list[dict[str, Any]]:
    """Allocated / unallocated / storage / idle per day for the whole cluster (admin only)."""
    scope = _scope(store)
    if start is None or end is None:
        lo, hi = date_range(scope)
        start, end = start or lo, end or hi
    cols, rows = scope.cluster_query(_SUMMARY, {"start": start, "end": end})
    return _records(cols, rows)


def executions(store: FactsStore | TenantScope, tenant: str, playbook: str, step: str, start: date,
               end: date) -> list[dict[str, Any]]:  # fmt: skip
    cols, rows = _scope(store).query(
        _EXECUTIONS, {"tenant": tenant, "playbook": playbook, "step": step, "start": start, "end": end}
    )
    return _records(cols, rows)


def plotly_js() -> str:
    from plotly.offline import get_plotlyjs  # noqa: PLC0415

    return get_plotlyjs()


def _script_json(value: Any) -> str:
    """JSON safe inside a <script type="application/json"> block: no '<' can close or open a tag."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def page(data: dict[str, Any] | None, *, plotly_src: str | None = "/plotly.min.js", title: str = "NoETL cost",
         cluster: list[dict[str, Any]] | None = None) -> str:  # fmt: skip
    """The page: live (``data`` None: the scripts and the data come from the server) or static
    (``data``, and ``cluster`` for an admin export, inlined; scripts inline, allowed by hash)."""
    if data is None:
        head, blocks, account = "", (
            f'<script src="{html.escape(plotly_src or "/plotly.min.js")}"></script>\n'
            '<script src="/dashboard_app.js"></script>'
        ), _LOGOUT  # fmt: skip
    else:
        scripts = [plotly_js(), APP_JS.read_text()]
        if any("</script" in s.lower() for s in scripts):  # would end the inline block early
            raise ValueError("an inlined script contains '</script'")
        policy = (f"default-src 'none'; script-src {' '.join(_sha256(s) for s in scripts)}; style-src 'unsafe-inline'; "
                  "img-src data: blob:; font-src data:; form-action 'none'; base-uri 'none'")  # fmt: skip
        head = f'<meta http-equiv="Content-Security-Policy" content="{policy}">'
        inline = {**data, "cluster": cluster}
        blocks = (
            f'<script type="application/json" id="noetl-data">{_script_json(inline)}</script>\n'
            + "\n".join(f"<script>{s}</script>" for s in scripts)
        )
        account = ""
    return (_TEMPLATE.replace("__CSP__", head).replace("__TITLE__", html.escape(title))
            .replace("__ACCOUNT__", account).replace("__SCRIPTS__", blocks))  # fmt: skip


def export_static(
    store: FactsStore, out: Path, *, title: str = "NoETL cost", viewer: Viewer | None = None
) -> Path:
    """cost.html with ``viewer``'s rows only (default: every tenant, with the cluster view)."""
    scope = TenantScope(store, viewer or Viewer.everyone())
    data = dashboard_data(scope)
    cluster = None
    if scope.viewer.admin:
        cluster = cluster_summary(scope, date.fromisoformat(data["start"]), date.fromisoformat(data["end"]))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "cost.html"
    path.write_text(page(data, plotly_src=None, title=title, cluster=cluster), encoding="utf-8")
    return path


def _day(value: str | None) -> date | None:
    if not value:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise ValueError(f"not a date (YYYY-MM-DD): {value!r}") from None


def _api_data(scope: TenantScope, q: dict[str, str]) -> Any:
    return dashboard_data(scope, _day(q.get("start")), _day(q.get("end")))


def _api_cluster(scope: TenantScope, q: dict[str, str]) -> Any:
    return cluster_summary(scope, _day(q.get("start")), _day(q.get("end")))


def _api_executions(scope: TenantScope, q: dict[str, str]) -> Any:
    start, end = _day(q.get("start")), _day(q.get("end"))
    if start is None or end is None:
        lo, hi = date_range(scope)
        start, end = start or lo, end or hi
    return executions(scope, q.get("tenant", ""), q.get("playbook", ""), q.get("step", ""), start, end)


# every data endpoint: it gets the caller's TenantScope, never the store
_API: dict[str, Callable[[TenantScope, dict[str, str]], Any]] = {
    "/api/data": _api_data, "/api/cluster": _api_cluster, "/api/executions": _api_executions,
}  # fmt: skip

# every GET route the server answers: the public ones carry no data (scripts, the sign-in form); every
# other is served only after the caller's key became a TenantScope (tests/analytics/test_route_gate.py
# asks each as another tenant, and fails on a route it has no probe for)
PUBLIC_ROUTES = frozenset(
    {"/plotly.min.js", "/dashboard_app.js", "/execution_app.js", "/login", "/favicon.ico"}
)
SCOPED_ROUTES = ("/", *_API, *execution_page.API, execution_page.PREFIX + "<id>", "/diff")


def route_of(path: str) -> str | None:
    """The SCOPED_ROUTES entry serving ``path`` (None: not found)."""
    if path == "/" or path in _API or path in execution_page.API or path == "/diff":
        return path
    return execution_page.PREFIX + "<id>" if execution_page.is_page(path) else None


class _Handler(BoundedBodyHandler):
    # every request's body is read (or refused: 413, 400) before any route, at most this much
    max_body = MAX_FORM_BYTES
    store: FactsStore
    auth: KeyAuth
    sessions: Sessions
    lock: threading.Lock
    title = "NoETL cost"
    secure_cookie = False
    executions: ExecutionViews | None = None

    def version_string(self) -> str:  # no Python version in the Server header
        return "noetl-dashboard"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet server (and no ?key= in logs)
        pass

    def _send(
        self, body: str | bytes, ctype: str, status: int = 200, headers: dict[str, str] | None = None
    ) -> None:
        raw = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "same-origin")  # and so our own forms carry an Origin
        self.send_header("X-Frame-Options", "DENY")
        if not ctype.startswith("application/javascript"):
            self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(raw)

    def _json(self, value: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self._send(json.dumps(value), "application/json", status, headers)

    # ------------------------------------------------------------ sessions
    def _cookie(self) -> str | None:
        try:
            jar = SimpleCookie(self.headers.get("Cookie", ""))
        except CookieError:
            return None
        morsel = jar.get(COOKIE)
        return morsel.value if morsel else None

    def _set_cookie(self, sid: str, max_age: int) -> str:
        secure = "; Secure" if self.secure_cookie else ""
        return f"{COOKIE}={sid}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"

    def _signed_in(self, api_key: str) -> None:
        """A valid key from the form or ?key=: open a session, go to the page (no key in the URL)."""
        self.auth.viewer(api_key)
        sid = self.sessions.open(api_key)
        self._send(
            "",
            "text/plain",
            303,
            {"Location": "/", "Set-Cookie": self._set_cookie(sid, int(self.sessions.ttl))},
        )

    def _viewer(self) -> Viewer:
        """The one authentication step of every page and data request."""
        header = self.headers.get("Authorization")
        if header is not None:
            scheme, _, key = header.strip().partition(" ")
            if scheme.lower() != "bearer" or not key.strip():
                raise Unauthorized("Authorization must be 'Bearer <API key>'")
            return self.auth.viewer(key.strip())
        sid = self._cookie()
        key = self.sessions.key(sid)
        if key is None:
            raise Unauthorized("sign in with an API key (Authorization: Bearer <key>, /login or /?key=<key>)")
        try:
            return self.auth.viewer(key)
        except Unauthorized:
            self.sessions.close(sid)  # revoked: the session is dead for good
            raise

    def _refuse(self, path: str, e: RegistryError) -> None:
        headers = {"WWW-Authenticate": 'Bearer realm="noetl-dashboard"'} if e.status == 401 else {}
        if e.status == 401 and self._cookie():  # a dead session (expired, key revoked): forget it
            headers["Set-Cookie"] = self._set_cookie("", 0)
        if path.startswith("/api/"):
            self._json({"error": e.message}, e.status, headers)
        elif e.status == 401:
            self._send(_login_page(e.message if self._cookie() or "key" in self._query() else ""),
                       "text/html; charset=utf-8", 401, headers)  # fmt: skip
        else:
            self._send(e.message, "text/plain; charset=utf-8", e.status, headers)

    def _query(self) -> dict[str, str]:
        return {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}

    # ------------------------------------------------------------- routes
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path, q = urlsplit(self.path).path, self._query()
        try:
            if path in PUBLIC_ROUTES:  # scripts and the sign-in form: no data
                return self._public(path)
            if path == "/" and "key" in q:
                return self._signed_in(q["key"])
            if route_of(path) is None:
                return self._send("not found", "text/plain", 404)
            # the one authentication step of every other route, before any of it runs
            scope = TenantScope(self.store, self._viewer())
            if path == "/":
                return self._send(page(None, title=self.title), "text/html; charset=utf-8")
            if path in execution_page.API:  # issue 36: same sign-in, same scope
                return self._json(execution_page.api(self.executions, scope, path, q))
            if execution_page.is_page(path):
                return self._send(
                    execution_page.page(self.executions, scope, path, q, _LOGOUT), "text/html; charset=utf-8"
                )
            with self.lock:  # chdb: one query at a time
                result = _API[path](scope, q)
            self._json(result)
        except RegistryError as e:
            self._refuse(path, e)
        except ValueError as e:
            self._json({"error": str(e)}, 400)
        except UnknownExecution as e:  # a loop id the execution does not have
            self._json({"error": str(e)}, 404)
        except Exception as e:  # noqa: BLE001 - one line for the caller, no traceback, no internals
            self._json({"error": f"internal error ({type(e).__name__})"}, 500)

    def _public(self, path: str) -> None:
        if path == "/plotly.min.js":
            return self._send(
                _PLOTLY_CACHE.setdefault("js", plotly_js()), "application/javascript; charset=utf-8"
            )
        if path == "/dashboard_app.js":
            return self._send(APP_JS.read_text(), "application/javascript; charset=utf-8")
        if path == "/execution_app.js":
            return self._send(execution_page.APP_JS.read_text(), "application/javascript; charset=utf-8")
        if path == "/login":
            return self._send(_login_page(""), "text/html; charset=utf-8")
        return self._send(b"", "image/x-icon", 204)  # /favicon.ico

    def do_POST(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path
        origin = self.headers.get("Origin")
        if origin is not None and (origin == "null" or urlsplit(origin).netloc != self.headers.get("Host")):
            # another site posting a form here (e.g. signing the victim in with the attacker's key)
            return self._send("cross-site form refused", "text/plain", 403)
        try:
            if path == "/logout":
                self.sessions.close(self._cookie())
                return self._send(
                    "", "text/plain", 303, {"Location": "/login", "Set-Cookie": self._set_cookie("", 0)}
                )
            if path != "/login":
                return self._send("not found", "text/plain", 404)
            form = {k: v[-1] for k, v in parse_qs(self.body.decode("utf-8", "replace")).items()}
            self._signed_in(form.get("key", "").strip())
        except RegistryError as e:
            self._send(_login_page(e.message), "text/html; charset=utf-8", e.status)
        except ValueError:
            self._send("bad request", "text/plain", 400)


_PLOTLY_CACHE: dict[str, str] = {}


def make_server(store: FactsStore, host: str = "127.0.0.1", port: int = 8765, title: str = "NoETL cost", *,
                auth: KeyAuth, secure_cookie: bool = False, sessions: Sessions | None = None,
                executions: ExecutionViews | None = None,
                store_lock: threading.Lock | None = None) -> ThreadingHTTPServer:  # fmt: skip
    """The dashboard server; ``auth`` says whose keys it accepts (see :class:`KeyAuth`); with
    ``executions`` (over an event store) it serves the execution pages too (/executions/<id>, /diff),
    the graph layout library imported now, before it listens, not at a page's first open;
    ``store_lock`` is shared with the store's other users in this process (its exporter)."""
    if executions is not None:
        preload_layout()
    handler = type("Handler", (_Handler,), {
        "store": store, "auth": auth, "sessions": sessions or Sessions(), "lock": store_lock or threading.Lock(), "title": title,
        "secure_cookie": secure_cookie, "executions": executions,
    })  # fmt: skip
    return ThreadingHTTPServer((host, port), handler)


def _login_page(error: str) -> str:
    message = f'<p class="err">{html.escape(error)}</p>' if error else ""
    return _LOGIN.replace("__ERROR__", message)


_LOGOUT = '<form method="post" action="/logout"><button type="submit">sign out</button></form>'

_LOGIN = """<!doctype html>
<html><head><meta charset="utf-8"><title>NoETL cost: sign in</title>
<style>body{font-family:system-ui,sans-serif;margin:3rem auto;max-width:34rem;color:#222}
input{width:100%;padding:6px;font-family:monospace}button{margin-top:8px;padding:6px 14px}.err{color:#b00}
code{background:#f3f3f3;padding:1px 4px}</style></head><body>
<h2>NoETL cost dashboard</h2>
<p>Sign in with a registry API key (<code>noetl-registry keys create --tenant T</code>).
You will see your tenant's costs only.</p>
__ERROR__
<form method="post" action="/login">
<label for="key">API key</label><input id="key" name="key" type="password" autocomplete="off" required autofocus>
<button type="submit">sign in</button>
</form>
</body></html>
"""

_TEMPLATE = """<!doctype html>
<html><head><meta charset="utf-8">__CSP__<title>__TITLE__</title>
<style>
body{font-family:system-ui,sans-serif;margin:16px;color:#222}
header{display:flex;justify-content:space-between;align-items:baseline}
#account{display:flex;gap:8px;align-items:baseline;font-size:13px} #account form{margin:0}
#filters{display:flex;gap:12px;flex-wrap:wrap;align-items:end;margin-bottom:8px}
#filters label{display:flex;flex-direction:column;font-size:12px} #f-topn{width:4em}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:8px}
.chart{height:340px;border:1px solid #eee}
#banner,#error{background:#fff3cd;border:1px solid #e0c36c;padding:6px 10px;margin:8px 0}
#crumbs{margin:6px 0;font-size:14px} #crumbs a{cursor:pointer;color:#06c}
table{border-collapse:collapse;font-size:12px} td,th{border:1px solid #ddd;padding:3px 6px;text-align:right}
</style></head><body>
<header><h2>__TITLE__ <small id="meta"></small></h2><div id="account"><span id="who"></span>__ACCOUNT__</div></header>
<div id="banner" hidden>SYNTHETIC DATA: tenants named <code>synthetic-*</code> come from the demo history generator,
not from measured runs.</div>
<div id="error" hidden></div>
<div id="filters">
<label>tenant<select id="f-tenant"></select></label>
<label>project<select id="f-project"></select></label>
<label>playbook<select id="f-playbook"></select></label>
<label>from<input type="date" id="f-start"></label>
<label>to<input type="date" id="f-end"></label>
<label>top N<input type="number" id="f-topn" value="10" min="1" max="50"></label>
</div>
<div id="crumbs"></div>
<div class="grid">
<div id="ts" class="chart"></div><div id="idle" class="chart" hidden></div>
<div id="topn" class="chart"></div><div id="steps" class="chart"></div>
<div id="rates" class="chart"></div><div><h4>executions <span id="exec-title"></span></h4><div id="executions"></div></div>
</div>
__SCRIPTS__
</body></html>
"""
