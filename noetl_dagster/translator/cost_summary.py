"""The execution's whole cost in Dagster: what no op or table carries lands on a cost summary.

Ops carry their step runs' attempts (``noetl/cost/<cur>`` on the ``result`` output) and stored
tables the storing step's share; what no step caused — the engine's ``platform`` line, lines of
no step — and, for the assets lens, the steps that stored no table, would be seen nowhere. The
run that finishes the execution materializes ``noetl_cost/<job>`` with:

- ``noetl/cost/<cur>``: the execution's cost less what its table materializations carry, so a sum
  of ``noetl/cost/<cur>`` over asset materializations (what Dagster+ Insights adds up) is the
  execution's cost;
- ``noetl/cost/execution_<cur>``, ``noetl/cost/tables_<cur>``, ``noetl/cost/ops_<cur>`` (what the
  ops' outputs carry: every step's lines) and ``noetl/cost/run_<cur>`` (what no step caused, the
  platform line among it), so ops + run = execution;
- the price version and fingerprint that priced it (a repricing refreshes the run tags,
  ``resources/run_costs.reprice_run_tags``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from noetl_analytics.pricing import COMPONENTS, Cost, PriceTable
from noetl_dagster.resources.runtime import TAG_EXECUTION

SUMMARY_PREFIX = "noetl_cost"


def summary_key(job_name: str) -> dg.AssetKey:
    """The cost summary asset of a job's executions: ``noetl_cost/<job>``."""
    return dg.AssetKey([SUMMARY_PREFIX, job_name])


def tables_cost(
    instance: dg.DagsterInstance, execution_id: str, currency: str, only_run: str | None = None
) -> float:
    """``noetl/cost/<cur>`` summed over the table materializations already logged by the execution's
    runs (every run tagged with its execution id, or ``only_run``; summaries excluded)."""
    key = f"noetl/cost/{currency.lower()}"
    if only_run is not None:
        run_ids = [only_run]
    else:
        runs = instance.get_run_records(dg.RunsFilter(tags={TAG_EXECUTION: execution_id}))
        run_ids = [rec.dagster_run.run_id for rec in runs]
    total = 0.0
    for run_id in run_ids:
        cursor = None
        while True:
            page = instance.get_records_for_run(
                run_id, cursor=cursor, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
            )
            for r in page.records:
                mat = r.event_log_entry.asset_materialization
                if mat is None or mat.asset_key.path[0] == SUMMARY_PREFIX:
                    continue
                v = mat.metadata.get(key)
                total += float(getattr(v, "value", v) or 0.0)
            if not page.has_more:
                break
            cursor = page.cursor
    return total


def materialization_cost(mat: dg.AssetMaterialization | dg.MaterializeResult, currency: str) -> float:
    v = (mat.metadata or {}).get(f"noetl/cost/{currency.lower()}")
    return float(getattr(v, "value", v) or 0.0)


def summary_materialization(
    job_name: str, execution_id: str, by_step: Mapping[str, Cost], on_tables: float, prices: PriceTable
) -> dg.AssetMaterialization:
    """The cost summary of one finished execution (``by_step``: step -> Cost of its whole log; the
    platform line and lines of no step under ``""``); ``on_tables``: what its tables carry."""
    cur = prices.currency.lower()
    zero = Cost(currency=prices.currency)
    total = sum(by_step.values(), zero)
    run = by_step.get("", zero)
    md: dict[str, Any] = {
        f"noetl/cost/{cur}": dg.FloatMetadataValue(total.total - on_tables),
        f"noetl/cost/execution_{cur}": dg.FloatMetadataValue(total.total),
        f"noetl/cost/tables_{cur}": dg.FloatMetadataValue(on_tables),
        f"noetl/cost/ops_{cur}": dg.FloatMetadataValue(total.total - run.total),
        f"noetl/cost/run_{cur}": dg.FloatMetadataValue(run.total),
    }
    for c in COMPONENTS:  # the execution's lines by component; a zero one is no line
        if getattr(total, c):
            md[f"noetl/cost/{c}_{cur}"] = dg.FloatMetadataValue(getattr(total, c))
    md["noetl/cost/attempts"] = total.attempts
    md["noetl/cost/price_version"] = dg.MetadataValue.text(total.price_version)
    md["noetl/cost/price_fingerprint"] = dg.MetadataValue.text(prices.fingerprint())
    md["execution_id"] = execution_id
    return dg.AssetMaterialization(
        asset_key=summary_key(job_name),
        metadata=md,
        description=f"cost of execution {execution_id}: what its ops and tables do not carry is here",
    )
