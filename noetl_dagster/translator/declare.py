"""Playbook declarations as Dagster objects: partitions, automation conditions, freshness policies.

Pure functions of the playbook model (``executor.spec.dagster`` and step ``outputs``,
validated by ``dsl.outputs``); the translator and the asset builder both use them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import dagster as dg

from noetl_dagster.dsl.model import Partitions, Playbook

STORAGE_KINDS = ("parquet", "arrow", "iceberg")


# -- declarations -> Dagster -----------------------------------------------------------------
def partitions_def(pb: Playbook) -> dg.PartitionsDefinition | None:
    """``executor.spec.dagster.partitions`` as a Dagster partitions definition."""
    p: Partitions | None = pb.dagster.partitions
    if p is None:
        return None
    if p.kind == "static":
        values = pb.workload.get(p.static) if isinstance(p.static, str) else p.static
        return dg.StaticPartitionsDefinition([str(v) for v in values or []])
    cls = {"daily": dg.DailyPartitionsDefinition, "hourly": dg.HourlyPartitionsDefinition,
           "weekly": dg.WeeklyPartitionsDefinition, "monthly": dg.MonthlyPartitionsDefinition}[p.kind]  # fmt: skip
    start = getattr(p, p.kind)
    if p.kind == "hourly" and len(start) == 10:
        start += "-00:00"
    return cls(start_date=start, timezone=p.timezone, end_offset=p.end_offset)


def automation_condition(raw: Any) -> dg.AutomationCondition | None:
    """``automation: eager | on_missing | {on_cron: '<cron>', timezone}``."""
    if raw is None:
        return None
    if raw == "eager":
        return dg.AutomationCondition.eager()
    if raw == "on_missing":
        return dg.AutomationCondition.on_missing()
    return dg.AutomationCondition.on_cron(raw["on_cron"], raw.get("timezone") or "UTC")


def freshness_policy(raw: Mapping[str, Any] | None) -> dg.FreshnessPolicy | None:
    """``freshness: {fail_after_minutes, warn_after_minutes}`` (time window) or
    ``{deadline_cron, lower_bound_minutes, timezone}`` (cron)."""
    if not raw:
        return None
    if "deadline_cron" in raw:
        return dg.FreshnessPolicy.cron(
            deadline_cron=raw["deadline_cron"], lower_bound_delta=timedelta(minutes=raw["lower_bound_minutes"]),
            timezone=raw.get("timezone") or "UTC",
        )  # fmt: skip
    warn = raw.get("warn_after_minutes")
    return dg.FreshnessPolicy.time_window(
        fail_window=timedelta(minutes=raw["fail_after_minutes"]),
        warn_window=timedelta(minutes=warn) if warn else None,
    )


def with_partition_metadata(pb: Playbook) -> Playbook:
    """A partitioned playbook's storage writes record their partition key in the registry:
    ``metadata: {partition_key: '{{ workload.<workload_key> }}'}`` unless the task sets one."""
    p = pb.dagster.partitions
    if p is None:
        return pb
    out = pb.model_copy(deep=True)
    out._steps = None  # the copy's step cache must point at the copied steps
    for step in out.workflow:
        for task in step.tool:
            if task.kind in STORAGE_KINDS and str(task.config.get("op") or "write") == "write":
                meta = task.config.get("metadata")
                meta = dict(meta) if isinstance(meta, Mapping) else {}
                meta.setdefault("partition_key", "{{ workload." + p.workload_key + " }}")
                task.config["metadata"] = meta
    return out
