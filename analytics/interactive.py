"""Interactive cost dashboard (issue 18.4): Plotly charts over ClickHouse queries.

One page, two ways to ship it:
- ``serve``: a small HTTP server; the page asks ``/api/data`` (the allocation rollup for a
  date range, from ClickHouse at each request) and ``/api/executions`` (drill-down to the
  executions of one tenant / playbook / step, from ``task_fact``).
- ``export``: the same page with the data of the whole range inlined (no server; the
  execution drill-down lists what was inlined).

Filters (tenant, project, playbook, date range) apply in the browser to the rollup rows;
charts: cost per day per tenant, idle / unallocated per day, top-N playbooks, cost per
step of the selected playbook, error and retry rates. Clicking a tenant, playbook or step
drills down. Plotly's own bundle is served / inlined: nothing is fetched from the internet.
"""

from __future__ import annotations

import json
import threading
from datetime import date
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from analytics.store import FactsStore

_ROWS = """SELECT tenant, project, playbook, step, day, round(sum(cost), 9) AS cost,
    round(sum(cpu_core_hours), 9) AS cpu_core_hours, round(sum(ram_byte_hours) / 1e9, 9) AS ram_gb_hours,
    sum(egress_bytes) AS egress_bytes, sum(attempts) AS attempts, sum(failed_attempts) AS failed, sum(retries) AS retries,
    sum(executions) AS executions
FROM $db.allocation_cost_day
WHERE day BETWEEN {start:Date} AND {end:Date}
GROUP BY tenant, project, playbook, step, day
ORDER BY day, tenant, project, playbook, step"""

_SUMMARY = """SELECT day, round(allocated, 9) AS allocated, round(unallocated, 9) AS unallocated,
    round(ifNull(storage_cost, 0), 9) AS storage, round(idle, 9) AS idle, round(capacity_cost, 9) AS capacity
FROM $db.allocation_summary_day WHERE day BETWEEN {start:Date} AND {end:Date} ORDER BY day"""

_EXECUTIONS = """SELECT execution_id, min(ts) AS started, count() AS attempts, countIf(status = 'error') AS failed,
    round(sum(coalesce(cpu_ms, duration_ms)) / 3.6e6, 9) AS cpu_core_hours, round(sum(duration_ms) / 1000, 3) AS seconds
FROM $db.task_fact
WHERE tenant_id = {tenant:String} AND playbook = {playbook:String} AND step = {step:String}
    AND toDate(ts) BETWEEN {start:Date} AND {end:Date}
GROUP BY execution_id ORDER BY cpu_core_hours DESC LIMIT 50"""


def _records(cols: list[str], rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [{c: (v.isoformat() if hasattr(v, "isoformat") else v) for c, v in zip(cols, r, strict=True)} for r in rows]


def date_range(store: FactsStore) -> tuple[date, date]:
    _, rows = store.query("SELECT min(day), max(day) FROM $db.allocation_step_day")
    lo, hi = rows[0]
    today = date.today()
    return (lo or today), (hi or today)


def dashboard_data(store: FactsStore, start: date | None = None, end: date | None = None) -> dict[str, Any]:
    lo, hi = date_range(store)
    start, end = start or lo, end or hi
    params = {"start": start, "end": end}
    cols, rows = store.query(_ROWS, params)
    scols, srows = store.query(_SUMMARY, params)
    _, cur = store.query("SELECT any(currency), any(version) FROM $db.price_version")
    records = _records(cols, rows)
    return {
        "start": start.isoformat(), "end": end.isoformat(), "min_day": lo.isoformat(), "max_day": hi.isoformat(),
        "currency": cur[0][0] or "", "price_version": cur[0][1] or "",
        "synthetic": any(str(r["tenant"]).startswith("synthetic-") for r in records),
        "rows": records, "summary": _records(scols, srows),
    }  # fmt: skip


def executions(store: FactsStore, tenant: str, playbook: str, step: str, start: date, end: date) -> list[dict[str, Any]]:
    cols, rows = store.query(
        _EXECUTIONS, {"tenant": tenant, "playbook": playbook, "step": step, "start": start, "end": end}
    )
    return _records(cols, rows)


def plotly_js() -> str:
    from plotly.offline import get_plotlyjs  # noqa: PLC0415

    return get_plotlyjs()


def page(data: dict[str, Any] | None, *, plotly_src: str | None = "/plotly.min.js", title: str = "NoETL cost") -> str:
    """The page: live (``data`` None: fetched from /api/data) or static (``data`` inlined)."""
    script = f'<script src="{plotly_src}"></script>' if plotly_src else f"<script>{plotly_js()}</script>"
    inline = "null" if data is None else json.dumps(data).replace("</", "<\\/")
    return _TEMPLATE.replace("__TITLE__", title).replace("__PLOTLY__", script).replace("__DATA__", inline).replace(
        "__APP__", (Path(__file__).parent / "dashboard_app.js").read_text()
    )


def export_static(store: FactsStore, out: Path, *, title: str = "NoETL cost") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "cost.html"
    path.write_text(page(dashboard_data(store), plotly_src=None, title=title), encoding="utf-8")
    return path


class _Handler(BaseHTTPRequestHandler):
    store: FactsStore
    lock: threading.Lock
    title = "NoETL cost"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet server
        pass

    def _send(self, body: str | bytes, ctype: str, status: int = 200) -> None:
        raw = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            if url.path == "/":
                self._send(page(None, title=self.title), "text/html; charset=utf-8")
            elif url.path == "/plotly.min.js":
                self._send(_PLOTLY_CACHE.setdefault("js", plotly_js()), "application/javascript")
            elif url.path == "/api/data":
                with self.lock:  # chdb: one query at a time
                    data = dashboard_data(self.store, _day(q.get("start")), _day(q.get("end")))
                self._send(json.dumps(data), "application/json")
            elif url.path == "/api/executions":
                with self.lock:
                    lo, hi = date_range(self.store)
                    rows = executions(self.store, q.get("tenant", ""), q.get("playbook", ""), q.get("step", ""),
                                      _day(q.get("start")) or lo, _day(q.get("end")) or hi)  # fmt: skip
                self._send(json.dumps(rows), "application/json")
            else:
                self._send("not found", "text/plain", 404)
        except ValueError as e:
            self._send(json.dumps({"error": str(e)}), "application/json", 400)


_PLOTLY_CACHE: dict[str, str] = {}


def _day(value: str | None) -> date | None:
    if not value:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise ValueError(f"not a date (YYYY-MM-DD): {value!r}") from None


def make_server(store: FactsStore, host: str = "127.0.0.1", port: int = 8765, title: str = "NoETL cost") -> ThreadingHTTPServer:
    handler = type("Handler", (_Handler,), {"store": store, "lock": threading.Lock(), "title": title})
    return ThreadingHTTPServer((host, port), handler)


_TEMPLATE = """<!doctype html>
<html><head><meta charset="utf-8"><title>__TITLE__</title>
__PLOTLY__
<style>
body{font-family:system-ui,sans-serif;margin:16px;color:#222}
#filters{display:flex;gap:12px;flex-wrap:wrap;align-items:end;margin-bottom:8px}
#filters label{display:flex;flex-direction:column;font-size:12px}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:8px}
.chart{height:340px;border:1px solid #eee}
#banner{background:#fff3cd;border:1px solid #e0c36c;padding:6px 10px;margin:8px 0;display:none}
#crumbs{margin:6px 0;font-size:14px} #crumbs a{cursor:pointer;color:#06c}
table{border-collapse:collapse;font-size:12px} td,th{border:1px solid #ddd;padding:3px 6px;text-align:right}
</style></head><body>
<h2>__TITLE__ <small id="meta"></small></h2>
<div id="banner">SYNTHETIC DATA: tenants named <code>synthetic-*</code> come from the demo history generator,
not from measured runs.</div>
<div id="filters">
<label>tenant<select id="f-tenant"></select></label>
<label>project<select id="f-project"></select></label>
<label>playbook<select id="f-playbook"></select></label>
<label>from<input type="date" id="f-start"></label>
<label>to<input type="date" id="f-end"></label>
<label>top N<input type="number" id="f-topn" value="10" min="1" max="50" style="width:4em"></label>
</div>
<div id="crumbs"></div>
<div class="grid">
<div id="ts" class="chart"></div><div id="idle" class="chart"></div>
<div id="topn" class="chart"></div><div id="steps" class="chart"></div>
<div id="rates" class="chart"></div><div><h4>executions <span id="exec-title"></span></h4><div id="executions"></div></div>
</div>
<script>const INLINE = __DATA__;</script>
<script>__APP__</script>
</body></html>
"""
