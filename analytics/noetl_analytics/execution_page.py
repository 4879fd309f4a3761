"""The execution pages of the dashboard server (issue 36): ``/executions/<id>`` and ``/diff?a=&b=``.

Served by ``dashboard serve`` behind the same sign-in as the cost pages; every read goes
through :class:`noetl_analytics.execution_view.ExecutionViews` with the caller's
:class:`TenantScope`, so another tenant's execution is a 404 like an unknown id. The HTML
holds no data and no inline script (the server's CSP allows scripts from itself only):
``execution_app.js`` asks ``/api/execution``, ``/api/execution/iterations`` and ``/api/diff``
for JSON and shows every string as text.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from noetl_analytics.dashboard_access import TenantScope
from noetl_analytics.execution_view import ExecutionViews
from noetl_registry.errors import NotFound

APP_JS = Path(__file__).parent / "execution_app.js"
PREFIX = "/executions/"
API = ("/api/execution", "/api/execution/iterations", "/api/diff")


def is_page(path: str) -> bool:
    return (path.startswith(PREFIX) and len(path) > len(PREFIX)) or path == "/diff"


def _int(q: dict[str, str], key: str, default: int) -> int:
    try:
        return int(q.get(key, default))
    except ValueError:
        raise ValueError(f"{key} must be an integer: {q.get(key)!r}") from None


def api(views: ExecutionViews | None, scope: TenantScope, path: str, q: dict[str, str]) -> Any:
    """The JSON of one API path, read as ``scope``'s viewer."""
    if views is None:
        raise NotFound("this dashboard has no event store (dashboard serve --event-store URL)")
    if path == "/api/execution":
        return views.explain(q.get("id", ""), scope)
    if path == "/api/execution/iterations":
        return views.iterations(
            q.get("id", ""), q.get("run", ""), _int(q, "offset", 0), _int(q, "limit", 100), scope
        )
    return views.diff(q.get("a", ""), q.get("b", ""), scope)


def page(views: ExecutionViews | None, scope: TenantScope, path: str, q: dict[str, str], account: str) -> str:
    """The HTML of an execution or diff page, after checking the viewer may see the executions."""
    if views is None:
        raise NotFound("this dashboard has no event store (dashboard serve --event-store URL)")
    if path == "/diff":
        views.diff(q.get("a", ""), q.get("b", ""), scope)  # 404 before any page for someone else's ids
        title = "execution diff"
    else:
        eid = unquote(path[len(PREFIX) :])
        views.explain(eid, scope)
        title = f"execution {eid}"
    return _TEMPLATE.replace("__TITLE__", html.escape(title)).replace("__ACCOUNT__", account)


_TEMPLATE = """<!doctype html>
<html><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{font-family:system-ui,sans-serif;margin:16px;color:#222}
header{display:flex;justify-content:space-between;align-items:baseline} header form{margin:0}
#summary{font-size:14px;margin:4px 0 8px} #summary span{margin-right:14px}
#error{background:#fff3cd;border:1px solid #e0c36c;padding:6px 10px;margin:8px 0}
.grid{display:grid;grid-template-columns:3fr 2fr;gap:8px}
#timeline{height:460px;border:1px solid #eee} #graph{height:460px;border:1px solid #eee}
#scrubber{display:flex;gap:8px;align-items:center;font-size:13px;margin:6px 0} #scrub{flex:1}
#details{border:1px solid #ddd;padding:8px;font-size:13px;margin-top:8px;white-space:pre-wrap;min-height:3em}
#details .err{color:#b00;font-weight:600} #details .line{font-family:monospace;background:#f3f3f3}
#divergence{background:#fff3cd;border:2px solid #e0a800;padding:8px;margin:8px 0;white-space:pre-wrap}
table{border-collapse:collapse;font-size:12px;margin-top:6px} td,th{border:1px solid #ddd;padding:3px 6px;text-align:left}
a{color:#06c}
</style></head><body>
<header><h2 id="title">__TITLE__</h2><div id="account"><a href="/">cost dashboard</a> __ACCOUNT__</div></header>
<div id="error" hidden></div>
<div id="summary"></div>
<div id="execution-view" hidden>
<div id="scrubber"><label for="scrub">time</label><input type="range" id="scrub" min="0" max="1000" value="1000">
<span id="scrub-label"></span></div>
<div class="grid"><div id="timeline"></div><div id="graph"></div></div>
<div id="details">click a bar or a step for its input, result and error</div>
</div>
<div id="diff-view" hidden><div id="divergence"></div><div id="diff-tables"></div></div>
<script src="/plotly.min.js"></script>
<script src="/execution_app.js"></script>
</body></html>
"""
