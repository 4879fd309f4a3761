"""Dagster's view of an execution's inside (issue 36): the compact summary a region or loop op logs (steps run,
iterations, retries), so the Dagster UI shows more than the one bar such an op is.

The page's base URL is ``$NOETL_DASHBOARD_URL`` (where ``noetl-dagster dashboard serve`` is
reachable, e.g. ``http://dashboard.internal:8765``); without it, runs carry the CLI command
(``noetl-dagster explain <id>``) instead of a URL.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from noetl_dagster.engine.events import Event
from noetl_dagster.engine.explain import explain


def op_summary(events: Iterable[Event], runs: set[str]) -> dict[str, Any]:
    """What the op's step runs did: runs per step, loop iterations (ok / failed), retries."""
    page = explain([e for e in events if e.step_run_id in runs]).data if runs else None
    if page is None or not page["runs"]:
        return {"text": "no step runs", "step_runs": 0, "iterations": 0, "retries": 0}
    per = Counter(r["step"] for r in page["runs"])
    ok = sum(r["loop"]["ok"] for r in page["runs"] if r["loop"])
    failed = sum(r["loop"]["failed"] for r in page["runs"] if r["loop"])
    t = page["totals"]
    steps = ", ".join(f"{s} x{n}" if n > 1 else s for s, n in per.most_common(8)) + (
        ", ..." if len(per) > 8 else ""
    )
    text = (f"{t['step_runs']} step runs ({steps}); {t['failed_runs']} failed; "
            f"{ok + failed} loop iterations ({ok} ok, {failed} failed); {t['retries']} retries")  # fmt: skip
    return {"text": text, "step_runs": t["step_runs"], "iterations": ok + failed, "retries": t["retries"]}
