"""Asset-first: the tables playbooks declare are materializable Dagster assets.

A playbook's declared tables (``outputs:`` on its steps, and storage tasks with a
literal ``noetl://`` URI) become one multi-asset per playbook, ``<job>__tables``.
*Materialize* runs the playbook (its workload defaults; a partition key sets
``workload.<partitions.workload_key>``, a backfill range its label and ``workload.<range_key>``)
in the asset's op, then reads what it stored
from the execution's event log and the registry: each table is reported with its
column schema (the Arrow schema as a Dagster ``TableSchema``), row count, byte size,
versioned ``noetl://`` URI, registry version and checksum. Partitions, automation
conditions and freshness policies come from ``executor.spec.dagster`` and the
step's ``outputs``; asset checks from the outputs' ``checks`` (``checks.py``).

Materializing some of a playbook's tables runs only the steps that store them and the steps
before them (``StepGraph.needed_for``); the others are skipped ("not selected") and named in
``noetl/skipped_steps``. A step before them that stores only unselected tables is not run again
(``upstream_reuse``): its recorded execution's result routes on and reads of its tables read the version
Dagster recorded for the partition; a table the run stores though not selected is recorded too, so no
version exists that Dagster does not know. The op logs the execution's NoETL events like a job's ops, and a failure
names the step, task, tool kind and playbook line with the user's traceback (``failures.py``).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import dagster as dg

from noetl_analytics.pricing import Cost
from noetl_dagster.engine import events as E
from noetl_dagster.engine.events import uuid7
from noetl_dagster.engine.graph import analyze
from noetl_dagster.resources.run_costs import cost_tags
from noetl_dagster.resources.runtime import (
    TAG_EXECUTION,
    TAG_MODE,
    TAG_PLAYBOOK,
    TAG_PROJECT,
    TAG_STATUS,
    TAG_TENANT,
    op_log,
)
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.translator.checks import run_partition_keys
from noetl_dagster.translator.cost_summary import summary_materialization
from noetl_dagster.translator.declare import (
    backfill_policy,
    partition_workload,
    partitions_def,
    with_pinned_reads,
)
from noetl_dagster.translator.failures import ROUTED_NOTE, first_failure, routed_failures
from noetl_dagster.translator.ops import (
    RESOURCE_KEY,
    TAG_FAILED_STEPS,
    TAG_HAS_FAILED_STEPS,
    price_table,
    priced_events,
    run_cost_tags,
    table_cost_metadata,
)
from noetl_dagster.translator.versions import recorded_version, stored_in_execution, version_metadata
from noetl_dagster.util.links import execution_url, link_tags

if TYPE_CHECKING:  # pragma: no cover
    from noetl_dagster.resources.noetl import NoetlResource
    from noetl_dagster.translator.build import CompiledPlaybook

TAG_MATERIALIZE_UPSTREAM = "noetl/materialize_upstream"  # "true": a subset runs and records missing upstreams
REQUESTED_BY_ASSET = (
    "dagster-asset:"  # driven inside the asset op (not "dagster:": the router leaves it alone)
)


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
    all_keys = {s.key for s in specs}
    graph = analyze(pb)
    per_key = pb.dagster.partitions is not None and pb.dagster.partitions.backfill is None
    op = c.asset_op
    tags = {"noetl/playbook": c.path, **dict(op.tags)} if op else {"noetl/playbook": c.path}
    run_tags = {
        TAG_PLAYBOOK: c.path,
        TAG_TENANT: c.data.tenant,
        TAG_PROJECT: c.data.project,
        TAG_MODE: c.mode,
    }

    @dg.multi_asset(
        specs=specs, name=op.name if op else f"{c.job_name}__tables", required_resource_keys={RESOURCE_KEY},
        can_subset=True, partitions_def=parts, backfill_policy=backfill_policy(pb),
        description=f"Runs {c.path} (its workload defaults" + (f"; the partition key sets workload.{pkey}" if pkey else "")
        + "; a subset runs only the steps the selected tables need) and reports the tables it stores.",
        op_tags=tags, pool=op.pool if op else None,
    )  # fmt: skip
    def _tables(context):  # noqa: ANN001, ANN202 - Dagster reads the annotation at runtime; none here
        res: NoetlResource = getattr(context.resources, RESOURCE_KEY)
        keys = run_partition_keys(context) if parts is not None else None
        # a range run of a playbook declaring no backfill policy: one execution per key, in this one run
        units = [[k] for k in keys] if keys and len(keys) > 1 and per_key else [keys]
        selected = set(context.selected_asset_keys) & all_keys
        select = None
        if selected != all_keys:  # a subset: the steps storing the selected tables and every step before them
            select = graph.needed_for(s for k in selected for s in c.asset_steps.get(k, ()))
        totals: list[Cost] = []
        recorded: list[dg.AssetMaterialization] = []  # a range's keys, one execution each
        for unit in units:
            yield from _materialize(
                context, res, unit, selected, select, totals, recorded if len(units) > 1 else None
            )
        if recorded:
            # the op's results (the checks after it wait on them) name each key's version; then each key's
            # own materialization, the latest, the one its checks and consumers read
            versions: dict[dg.AssetKey, dict[str, str]] = {}
            for m in recorded:
                versions.setdefault(m.asset_key, {})[str(m.partition)] = str(m.metadata["noetl/uri"].value)
            for key, by_key in versions.items():
                yield dg.MaterializeResult(
                    asset_key=key, metadata={"noetl/partition_versions": dg.MetadataValue.json(by_key)}
                )
            for m in recorded:
                context.log_event(m)
        if totals:
            total = sum(totals[1:], totals[0])  # the run's executions
            prices = price_table(res)
            context.instance.add_run_tags(
                context.run.run_id, {**cost_tags(total, prices), **run_cost_tags(total)}
            )

    def _materialize(context, res, keys, selected, select, totals, recorded):  # noqa: ANN001, ANN202, PLR0913
        """One execution for ``keys``; its tables reported as the op's results, or (``recorded``: one of a
        range's keys) as that partition's materializations, logged after the op's results."""
        svc = res.services()
        workload = partition_workload(pb, keys) if keys else None
        reuse: dict[str, dict[str, Any]] = {}
        run_pb = pb
        if select is not None:
            reuse, pins = upstream_reuse(context, c, select, selected, keys, res)
            run_pb = with_pinned_reads(pb, pins)
            context.log.info(f"subset of {c.path}: {len(selected)} of {len(all_keys)} tables; running steps "
                             f"{', '.join(s for s in graph.order if s in select and s not in reuse)}"
                             + (f"; reusing the recorded results of {', '.join(sorted(reuse))}" if reuse else ""))  # fmt: skip
        eid = uuid7()
        # the run (Materialize, a backfill's) links to the execution's page like a job run (issue 42)
        # and carries the playbook's run tags a job run has (docs/dagster.md "What a run looks like")
        context.instance.add_run_tags(context.run.run_id, {TAG_EXECUTION: eid, **link_tags(eid), **run_tags})
        with op_log(eid, context.log) as sink:  # the NoETL step/task events, as a job run's ops log them
            result = run_playbook(run_pb, workload, services=svc, execution_id=eid, select=select,
                                  requested_by=f"{REQUESTED_BY_ASSET}{context.run.run_id}",
                                  on_step=lambda _run: sink.flush(), reuse=reuse)  # fmt: skip
        events = svc.event_store.read(result.execution_id)
        skipped = [
            e.step
            for e in events
            if e.name == E.STEP_SKIPPED and (e.data or {}).get("reason") == "not selected"
        ]
        context.instance.add_run_tags(context.run.run_id, {TAG_STATUS: result.status})
        if result.status != "completed":
            failure = first_failure(events, pb)
            text = failure.text() if failure else f"{c.path}: execution {result.execution_id} {result.status}"
            md = {"execution_id": result.execution_id, **(failure.metadata() if failure else {})}
            raise dg.Failure(description=text, metadata=md, allow_retries=False) from None
        steps: dict[dg.AssetKey, str] = {}
        stored = stored_in_execution(res, result.execution_id, steps, events, c.asset_key)
        # priced like the ops: this execution's own attempts (a sub-playbook is priced on its own)
        own = [e for e in events if e.execution_id == result.execution_id]
        costs = priced_events(context, res, lambda: own)
        per_step = Counter(steps.get(spec.key) for spec in specs if spec.key in stored)  # tables per step
        missing = [
            k.to_user_string() for k in sorted(selected - set(stored), key=lambda k: k.to_user_string())
        ]
        failure = first_failure(events, pb) if missing else None
        if failure is not None:  # a handled failure (an arc routed on) still lost a selected table
            raise dg.Failure(description=f"{', '.join(missing)} not stored: {failure.text()}",
                             metadata={"execution_id": result.execution_id, **failure.metadata()},
                             allow_retries=False)  # fmt: skip
        routed = routed_failures(events, pb)  # failed steps an arc routed on: green, but not hidden
        for told in routed:
            context.log.error(f"{told.text()}\n{ROUTED_NOTE}")
        if routed:
            context.instance.add_run_tags(context.run.run_id, {TAG_FAILED_STEPS: ",".join(f.step for f in routed),
                                                               TAG_HAS_FAILED_STEPS: "true"})  # fmt: skip
        for key in sorted(set(stored) & all_keys - selected, key=lambda k: k.to_user_string()):
            # a table the run stored though not selected (a step storing a selected one too, or an upstream
            # materialized on request): recorded, so no version exists that Dagster does not know
            md = {**version_metadata(stored[key]), "noetl/step": steps.get(key, ""),
                  "noetl/not_selected": dg.MetadataValue.text("stored by a step the selection ran")}  # fmt: skip
            for pk in keys or [None]:
                context.log_event(dg.AssetMaterialization(asset_key=key, partition=pk, metadata=md))
        on_tables = 0.0
        for spec in specs:
            if spec.key not in selected:
                continue
            v = stored.get(spec.key)
            if v is None:
                context.log.warning(f"{c.path} declares {spec.key.to_user_string()} but execution "
                                    f"{result.execution_id} did not store it")  # fmt: skip
                continue
            md = version_metadata(v)
            step = steps.get(spec.key)
            if step:
                md["noetl/step"] = step
            if skipped:
                md["noetl/skipped_steps"] = dg.MetadataValue.text(", ".join(skipped))
            if url := execution_url(result.execution_id):
                md["noetl/execution_page"] = dg.MetadataValue.url(url)
            if costs is not None and step in costs[1]:
                md.update(table_cost_metadata(costs[1][step], per_step[step]))
                on_tables += costs[1][step].total / per_step[step]
            if recorded is not None:
                recorded.append(dg.AssetMaterialization(asset_key=spec.key, partition=keys[0], metadata=md))
            else:
                yield dg.MaterializeResult(asset_key=spec.key, metadata=md)
        if costs is not None:
            totals.append(sum(costs[1].values(), Cost(currency=costs[0].currency)))
            # what the tables do not carry (steps storing none, the platform line): the cost summary
            context.log_event(
                summary_materialization(c.job_name, result.execution_id, costs[1], on_tables, costs[0])
            )

    return _tables


# -- subsets -----------------------------------------------------------------------------------
def upstream_reuse(
    context: Any, c: CompiledPlaybook, select: set[str], selected: set[dg.AssetKey], keys: list[str] | None,
    res: NoetlResource,
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:  # fmt: skip
    """A subset's steps that store only unselected tables: each is not run again but stands on the result
    its recorded execution logged, and reads of its tables read the version Dagster recorded for the
    run's partition(s). ``(reuse, pins)``: ``{step: {execution_id, result}}``, ``{series: version}``.

    A table with no materialization for a partition fails the run in one line naming it, unless the run
    is tagged ``noetl/materialize_upstream: true`` (then its step runs and the op records it). A recorded
    version is reused only when it is of the declared table and its execution is of this playbook in the
    location's tenant and project (metadata anyone may log never brings in another scope's result)."""
    stores: dict[str, set[dg.AssetKey]] = {}
    for key, steps in c.asset_steps.items():
        for step in steps:
            stores.setdefault(step, set()).add(key)
    upstream = {s: ks for s, ks in stores.items() if s in select and not ks & selected}
    if not upstream or str(context.run.tags.get(TAG_MATERIALIZE_UPSTREAM, "")).lower() == "true":
        return {}, {}
    reuse: dict[str, dict[str, Any]] = {}
    pins: dict[str, str] = {}
    where = lambda pk: f" for partition {pk}" if pk else ""  # noqa: E731
    declared = {s.key: str(s.metadata.get("noetl/uri") or "").partition("@")[0] for s in c.assets}
    again = f"; launch with tag {TAG_MATERIALIZE_UPSTREAM}: true to store it again"
    for step in sorted(upstream):
        eids: set[str | None] = set()
        for key in sorted(upstream[step], key=lambda k: k.to_user_string()):
            versions = set()
            for pk in keys or [None]:
                rec = recorded_version(context.instance, key, pk)
                if rec is None:
                    raise dg.Failure(description=(
                        f"{c.path}: upstream {key.to_user_string()} (step {step}) has no materialization{where(pk)}; "
                        f"materialize it first, or launch with tag {TAG_MATERIALIZE_UPSTREAM}: true"), allow_retries=False)  # fmt: skip
                versions.add(rec.uri)
                eids.add(rec.execution_id)
            if len(versions) > 1:  # a range recorded by different runs: no one result stands for all
                raise dg.Failure(description=(
                    f"{c.path}: upstream {key.to_user_string()} (step {step}) has {len(versions)} recorded versions "
                    f"across this run's partitions; materialize it for the range, or launch with tag "
                    f"{TAG_MATERIALIZE_UPSTREAM}: true"), allow_retries=False)  # fmt: skip
            series, _, version = versions.pop().rpartition("@")
            if series != declared.get(key):
                raise dg.Failure(description=(f"{c.path}: upstream {key.to_user_string()}'s recorded materialization "
                                              f"names {series}, not the table step {step} stores{again}"), allow_retries=False)  # fmt: skip
            pins[series] = version
        eid = next(iter(eids)) if len(eids) == 1 else None
        events = res.services().event_store.read(eid) if eid else []
        ours = bool(events) and all(e.tenant_id == res.tenant and e.project_id == res.project for e in events) and any(
            e.name == E.EXECUTION_REQUESTED and (e.data or {}).get("playbook") == c.path for e in events
        )  # fmt: skip
        done = [e for e in events if e.name == E.STEP_DONE and e.step == step] if ours else []
        if not done:
            raise dg.Failure(description=(
                f"{c.path}: upstream step {step}: the execution that stored its recorded tables "
                f"({', '.join(sorted(str(e) for e in eids))}) has no result of it in this location's event log"
                f"{again}"), allow_retries=False)  # fmt: skip
        reuse[step] = {"execution_id": eid, "result": (done[-1].data or {}).get("result")}
    return reuse, pins
