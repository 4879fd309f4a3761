"""An execution's cost as run tags, and their refresh when the facts are repriced.

The run that finishes an execution is tagged ``noetl/cost_<cur>`` (the execution's cost),
``noetl/price_version`` and ``noetl/price_fingerprint`` (the digest of the price table that priced
it). A later price table (a repricing: ``facts refresh``, the ``noetl/cost_rollups`` asset) prices
the execution's log again and replaces those tags (:func:`reprice_run_tags`), so a run's tags say
what the facts say; a fingerprint other than the current table's shows a tag not yet refreshed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import dagster as dg

from noetl_analytics.pricing import Cost, PriceTable, cost_of_events
from noetl_dagster.resources.runtime import TAG_EXECUTION

TAG_PRICE_VERSION = "noetl/price_version"
TAG_PRICE_FINGERPRINT = "noetl/price_fingerprint"


def decimal_text(x: float) -> str:
    return f"{x:.12f}".rstrip("0").rstrip(".")


def cost_tags(cost: Cost, prices: PriceTable | None = None) -> dict[str, str]:
    """Run tags of an execution's cost: ``noetl/cost_<currency>`` (decimal string), ``noetl/price_version``
    and, with the table at hand, ``noetl/price_fingerprint``."""
    tags = {
        f"noetl/cost_{cost.currency.lower()}": decimal_text(cost.total),
        TAG_PRICE_VERSION: cost.price_version or "-",
    }
    if prices is not None:
        tags[TAG_PRICE_FINGERPRINT] = prices.fingerprint()
    return tags


def execution_costs(events: Iterable[Any], prices: PriceTable, execution_id: str) -> dict[str, Cost]:
    """step -> Cost of every line of the execution's own events (the platform line and lines of no
    step under ``""``; a sub-execution is priced on its own)."""
    return cost_of_events(prices, [e for e in events if e.execution_id == execution_id])


def execution_cost(events: Iterable[Any], prices: PriceTable, execution_id: str) -> Cost:
    return sum(execution_costs(events, prices, execution_id).values(), Cost(currency=prices.currency))


def _runs_with_cost(instance: dg.DagsterInstance, execution_ids: Iterable[str] | None) -> Iterable[Any]:
    if execution_ids is not None:
        for eid in execution_ids:
            yield from instance.get_run_records(dg.RunsFilter(tags={TAG_EXECUTION: eid}))
        return
    cursor = None
    while True:  # every run, a page at a time
        page = instance.get_run_records(limit=500, cursor=cursor)
        yield from page
        if len(page) < 500:
            return
        cursor = page[-1].dagster_run.run_id


def reprice_run_tags(
    instance: dg.DagsterInstance,
    event_store: Any,
    prices: PriceTable,
    execution_ids: Iterable[str] | None = None,
) -> list[str]:
    """Re-tag every run carrying an execution's cost (``noetl/cost_<cur>``) that another price table
    priced (its ``noetl/price_fingerprint`` differs or is missing): the execution's log priced with
    ``prices``. ``execution_ids``: only their runs (default: every run of the instance). A run whose
    ``noetl/run_cost_<cur>`` is the execution's cost (an asset run: the run is the execution) gets
    that tag too. Returns the run ids re-tagged."""
    cur = prices.currency.lower()
    cost_key, run_key = f"noetl/cost_{cur}", f"noetl/run_cost_{cur}"
    fingerprint = prices.fingerprint()
    done: list[str] = []
    for rec in _runs_with_cost(instance, execution_ids):
        tags = rec.dagster_run.tags
        eid = tags.get(TAG_EXECUTION)
        if not eid or cost_key not in tags or tags.get(TAG_PRICE_FINGERPRINT) == fingerprint:
            continue
        events = event_store.read(eid)
        if not events:
            continue
        new = cost_tags(execution_cost(events, prices, eid), prices)
        if tags.get(run_key) == tags[cost_key]:
            new[run_key] = new[cost_key]
        instance.add_run_tags(rec.dagster_run.run_id, new)
        done.append(rec.dagster_run.run_id)
    return done
