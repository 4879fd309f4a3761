"""Playbook declarations as Dagster objects: partitions, automation conditions, freshness policies.

Pure functions of the playbook model (``executor.spec.dagster`` and step ``outputs``,
validated by ``dsl.outputs``); the translator and the asset builder both use them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg

from noetl_dagster.dsl.model import Partitions, Playbook

STORAGE_KINDS = ("parquet", "arrow", "iceberg")
RANGE_SEP = "..."  # a range run records partition_key "<first>...<last>"


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


def schedule_partition_keys(parts: dg.PartitionsDefinition, when: datetime | None) -> list[str]:
    """The partitions one schedule tick at ``when`` runs, as ``dg.build_schedule_from_partitioned_job``
    picks them: a time partition the last complete one (a daily schedule at 02:00 runs yesterday; an
    ``end_offset`` moves it), static partitions every key (one run each)."""
    with dg.partition_loading_context(effective_dt=when):
        if isinstance(parts, dg.TimeWindowPartitionsDefinition):
            last = parts.get_last_partition_key()
            return [last] if last else []
        return list(parts.get_partition_keys())


def workload_partition_key(pb: Playbook, workload: Mapping[str, Any]) -> str | None:
    """The partition an execution's workload names (``workload.<workload_key>``) when it is one of the
    playbook's keys; None for a range label or a value outside the partitions."""
    parts = partitions_def(pb)
    key = workload.get(pb.dagster.partitions.workload_key) if parts is not None else None  # type: ignore[union-attr]
    if not isinstance(key, str) or RANGE_SEP in key:
        return None
    try:
        with dg.partition_loading_context(effective_dt=datetime.now(UTC)):  # a day not yet over counts too
            return key if parts.has_partition_key(key) else None  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - a value of another shape is no key
        return None


def backfill_policy(pb: Playbook) -> dg.BackfillPolicy | None:
    """``partitions.backfill``: single_run (one run for a range; the playbook reads the keys from
    ``workload.<range_key>``), multi_run (one run per key) or N (at most N keys per run). Undeclared: one
    run too, which runs the playbook once per key (each key's own workload and version, in one process)."""
    p = pb.dagster.partitions
    if p is None:
        return None
    if p.backfill is None:
        return dg.BackfillPolicy.single_run()
    if p.backfill == "single_run":
        return dg.BackfillPolicy.single_run()
    return dg.BackfillPolicy.multi_run(1 if p.backfill == "multi_run" else int(p.backfill))


def partition_workload(pb: Playbook, keys: list[str]) -> dict[str, Any]:
    """What a run for ``keys`` sets in the workload: ``workload_key`` is the key (a range's label
    ``first...last``), ``range_key`` (when declared) the list of keys."""
    p = pb.dagster.partitions
    if p is None or not keys:
        return {}
    out: dict[str, Any] = {p.workload_key: keys[0] if len(keys) == 1 else f"{keys[0]}{RANGE_SEP}{keys[-1]}"}
    if p.range_key:
        out[p.range_key] = list(keys)
    return out


def covered_keys(label: str | None, parts: dg.PartitionsDefinition | None) -> set[str]:
    """The partition keys a recorded ``partition_key`` covers: itself, or every key of a range label."""
    if not label:
        return set()
    first, sep, last = label.partition(RANGE_SEP)
    if not sep or parts is None:
        return {label}
    try:
        return set(parts.get_partition_keys_in_range(dg.PartitionKeyRange(first, last)))
    except Exception:  # noqa: BLE001 - a label the current definition no longer knows covers nothing
        return {label}


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
    """A partitioned playbook's storage writes record their partition key in the registry
    (``metadata: {partition_key: '{{ workload.<workload_key> }}'}`` unless the task sets one), and its
    reads of an unversioned ``uri`` read that partition's version (``partition_key:`` the same key)."""
    p = pb.dagster.partitions
    if p is None:
        return pb
    out = pb.model_copy(deep=True)
    out._steps = None  # the copy's step cache must point at the copied steps
    key = "{{ workload." + p.workload_key + " }}"
    for step in out.workflow:
        for task in step.tool:
            if task.kind not in STORAGE_KINDS:
                continue
            if str(task.config.get("op") or "write") == "write":
                meta = task.config.get("metadata")
                meta = dict(meta) if isinstance(meta, Mapping) else {}
                meta.setdefault("partition_key", key)
                task.config["metadata"] = meta
            elif "@" not in str(task.config.get("uri") or "@") and not task.config.get("version"):
                task.config.setdefault("partition_key", key)  # a read of partition P sees P's data
    return out


def with_pinned_reads(pb: Playbook, pins: Mapping[str, str]) -> Playbook:
    """A subset run's copy of the playbook whose reads of an unversioned (or ``@latest``) ``uri`` in ``pins``
    (series -> version) read that version: the one Dagster recorded for a table the run does not write again."""
    if not pins:
        return pb
    out = pb.model_copy(deep=True)
    out._steps = None  # the copy's step cache must point at the copied steps
    for step in out.workflow:
        for task in step.tool:
            series, _, version = str(task.config.get("uri") or "").partition("@")
            if (task.kind in STORAGE_KINDS and str(task.config.get("op") or "write") == "read" and series in pins
                    and version in ("", "latest")):  # fmt: skip
                task.config["uri"] = f"{series}@{pins[series]}"
                task.config.pop("partition_key", None)  # the version is that partition's already
    return out
