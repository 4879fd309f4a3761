"""Asset-first: the tables playbooks declare are materializable Dagster assets.

A playbook's declared tables (``outputs:`` on its steps, and storage tasks with a
literal ``noetl://`` URI) become one multi-asset per playbook, ``<job>__tables``.
*Materialize* runs the playbook (its workload defaults; a partition key sets
``workload.<partitions.workload_key>``) in the asset's op, then reads what it stored
from the execution's event log and the registry: each table is reported with its
column schema (the Arrow schema as a Dagster ``TableSchema``), row count, byte size,
versioned ``noetl://`` URI, registry version and checksum. Partitions, automation
conditions and freshness policies come from ``executor.spec.dagster`` and the
step's ``outputs``; asset checks from the outputs' ``checks`` (``checks.py``).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import dagster as dg

from analytics.pricing import Cost
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.translator.declare import partitions_def
from noetl_dagster.translator.ops import (
    RESOURCE_KEY,
    cost_tags,
    priced_events,
    run_cost_tags,
    table_cost_metadata,
)
from noetl_dagster.translator.versions import first_error, stored_in_execution, version_metadata

if TYPE_CHECKING:  # pragma: no cover
    from noetl_dagster.resources.noetl import NoetlResource
    from noetl_dagster.translator.build import CompiledPlaybook

TAG_EXECUTION = "noetl/execution_id"


# -- the multi-asset ---------------------------------------------------------------------------
def playbook_assets(compiled: list[CompiledPlaybook], specs: list[dg.AssetSpec]) -> list[dg.AssetsDefinition]:
    """One multi-asset per playbook over the tables it declares (a table two playbooks declare
    belongs to the first)."""
    owner: dict[dg.AssetKey, str] = {}
    by_pb: dict[str, list[dg.AssetSpec]] = {}
    wanted = {s.key: s for s in specs}
    for c in compiled:
        for a in c.assets:
            if a.key in wanted and a.key not in owner:
                owner[a.key] = c.path
                by_pb.setdefault(c.path, []).append(wanted[a.key])
    return [playbook_multi_asset(c, by_pb[c.path]) for c in compiled if c.path in by_pb]


def playbook_multi_asset(c: CompiledPlaybook, specs: list[dg.AssetSpec]) -> dg.AssetsDefinition:
    pb = c.playbook
    parts = partitions_def(pb)
    pkey = pb.dagster.partitions.workload_key if pb.dagster.partitions else None
    specs = [s.replace_attributes(skippable=True, partitions_def=parts) for s in specs]

    @dg.multi_asset(
        specs=specs, name=f"{c.job_name}__tables", required_resource_keys={RESOURCE_KEY}, can_subset=False,
        partitions_def=parts, description=f"Runs {c.path} (its workload defaults"
        + (f"; the partition key sets workload.{pkey}" if pkey else "") + ") and reports the tables it stores.",
        op_tags={"noetl/playbook": c.path},
    )  # fmt: skip
    def _tables(context):  # noqa: ANN001, ANN202 - Dagster reads the annotation at runtime; none here
        res: NoetlResource = getattr(context.resources, RESOURCE_KEY)
        workload = {pkey: context.partition_key} if pkey and context.has_partition_key else None
        result = run_playbook(pb, workload, services=res.services(), logger=context.log.info)
        context.instance.add_run_tags(context.run.run_id, {TAG_EXECUTION: result.execution_id})
        if result.status != "completed":
            raise dg.Failure(description=f"{c.path}: execution {result.execution_id} {result.status}"
                             + first_error(res, result.execution_id),
                             metadata={"execution_id": result.execution_id}, allow_retries=False)  # fmt: skip
        events = res.services().event_store.read(result.execution_id)
        steps: dict[dg.AssetKey, str] = {}
        stored = stored_in_execution(res, result.execution_id, steps, events)
        # priced like the ops: this execution's own attempts (a sub-playbook is priced on its own)
        own = [e for e in events if e.execution_id == result.execution_id]
        costs = priced_events(context, res, lambda: own)
        per_step = Counter(steps.get(spec.key) for spec in specs if spec.key in stored)  # tables per step
        for spec in specs:
            v = stored.get(spec.key)
            if v is None:
                context.log.warning(f"{c.path} declares {spec.key.to_user_string()} but execution "
                                    f"{result.execution_id} did not store it")  # fmt: skip
                continue
            md = version_metadata(v)
            step = steps.get(spec.key)
            if step:
                md["noetl/step"] = step
            if costs is not None and step in costs[1]:
                md.update(table_cost_metadata(costs[1][step], per_step[step]))
            yield dg.MaterializeResult(asset_key=spec.key, metadata=md)
        if costs is not None:
            total = sum(costs[1].values(), Cost(currency=costs[0].currency))  # the run is the execution
            context.instance.add_run_tags(context.run.run_id, {**cost_tags(total), **run_cost_tags(total)})

    return _tables

