"""The link from a Dagster run to its execution's page on the dashboard server (tags every run kind
carries: jobs, Materialize, backfills, schedules and the router's launches).

The page's base URL is ``$NOETL_DASHBOARD_URL`` (where ``noetl-dagster dashboard serve`` is
reachable, e.g. ``http://dashboard.internal:8765``); without it, runs carry the CLI command
(``noetl-dagster explain <id>``) instead of a URL.
"""

from __future__ import annotations

import os
from urllib.parse import quote

URL_ENV = "NOETL_DASHBOARD_URL"
TAG_URL = "noetl/execution_url"
TAG_EXPLAIN = "noetl/explain"


def execution_url(execution_id: str) -> str | None:
    base = (os.environ.get(URL_ENV) or "").strip().rstrip("/")
    if not base.startswith(("http://", "https://")):
        return None
    return f"{base}/executions/{quote(execution_id, safe='')}"


def link_tags(execution_id: str) -> dict[str, str]:
    """Run tags pointing at the execution's page (and the command that explains it)."""
    tags = {TAG_EXPLAIN: f"noetl-dagster explain {execution_id}"}
    url = execution_url(execution_id)
    if url:
        tags[TAG_URL] = url
    return tags
