"""Links between the execution page and the Dagster webserver (issue 42), Dagster-free so the
dashboard server can make them: ``$NOETL_DAGSTER_WEBSERVER_URL`` is where the Dagster UI is reachable
(e.g. ``http://dagster.internal:3000``); without it (or with a base that is not http/https) there
are no links."""

from __future__ import annotations

import os
from urllib.parse import quote, urlencode

DAGSTER_URL_ENV = "NOETL_DAGSTER_WEBSERVER_URL"
TAG_EXECUTION = "noetl/execution_id"
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
