"""Links between the execution page and the Dagster webserver (issue 42), both ways, Dagster-free so
the dashboard server, the sensors and the translator share them.

``$NOETL_DASHBOARD_URL`` is where ``noetl-dagster dashboard serve`` is reachable (e.g.
``http://dashboard.internal:8765``): every run kind carries a tag pointing at its execution's page;
without it, runs carry the CLI command (``noetl-dagster explain <id>``) instead of a URL.
``$NOETL_DAGSTER_WEBSERVER_URL`` is where the Dagster UI is reachable (e.g.
``http://dagster.internal:3000``): the page links back to the runs; without it (or with a base that
is not http/https) there are no back links."""

from __future__ import annotations

import os
from urllib.parse import quote, urlencode

DAGSTER_URL_ENV = "NOETL_DAGSTER_WEBSERVER_URL"
URL_ENV = "NOETL_DASHBOARD_URL"
TAG_EXECUTION = "noetl/execution_id"
TAG_URL = "noetl/execution_url"
TAG_EXPLAIN = "noetl/explain"
# the prefixes of a request's requested_by that name the Dagster run which recorded it
DAGSTER_REQUESTERS = ("dagster:", "dagster-asset:")


def dagster_base() -> str | None:
    base = (os.environ.get(DAGSTER_URL_ENV) or "").strip().rstrip("/")
    return base if base.startswith(("http://", "https://")) else None


def dagster_links(execution_id: str, requested_by: str | None) -> dict[str, str] | None:
    """The Dagster run that requested the execution (``run``, when a Dagster run did) and every run
    tagged with it (``runs``: the per-step jobs, re-executions, the Materialize or backfill run)."""
    base = dagster_base()
    if base is None:
        return None
    out = {"runs": f"{base}/runs?" + urlencode([("q[]", f"tag:{TAG_EXECUTION}={execution_id}")])}
    for prefix in DAGSTER_REQUESTERS:
        if (requested_by or "").startswith(prefix):
            out["run"] = f"{base}/runs/{quote(requested_by[len(prefix) :], safe='')}"  # type: ignore[index]
    return out


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
