"""Op factories: ``noetl_start``, one op per acyclic step, one region op per cycle.

Edges carry no values (``Nothing``): the tokens are in the event log, and an
output is yielded only towards nodes that have work (see plan.py), so Dagster
skips what no token reaches. Every op takes one fan-in input fed by all its
upstream ops: Dagster skips a fan-in op only when *all* of its sources were
skipped, which is what a join needs (control_flow_workbook's ``end`` runs once
on either branch).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg

import noetl_dagster.translator.naming as naming
from noetl_analytics.pricing import COMPONENTS, Cost, PriceTable, cost_of_events
from noetl_dagster.dsl.locator import InvalidLocator
from noetl_dagster.dsl.model import Playbook
from noetl_dagster.engine.events import EXECUTION_REQUESTED as E_REQUESTED
from noetl_dagster.engine.events import uuid7_from
from noetl_dagster.engine.usage_lines import _REF_EVENTS, BilledRefs, created_refs
from noetl_dagster.resources.run_costs import TAG_PRICE_VERSION, cost_tags, decimal_text, execution_costs
from noetl_dagster.resources.runtime import (
    REQUESTED_BY_DAGSTER,
    TAG_EXECUTION,
    TAG_STATUS,
    OpReport,
    error_text,
    execution_id_for_run,
    execution_lock,
    json_safe,
    result_metadata,
    run_steps,
    start_execution,
    work_steps,
)
from noetl_dagster.translator.checks import (
    declared_check_evaluations,
    run_partition_keys,
    step_check_evaluation,
    step_tables,
)
from noetl_dagster.translator.cost_summary import (
    materialization_cost,
    summary_materialization,
    tables_cost,
)
from noetl_dagster.translator.declare import partition_workload
from noetl_dagster.translator.explain_links import op_summary
from noetl_dagster.translator.failures import ROUTED_NOTE, step_failure
from noetl_dagster.translator.plan import JobPlan, Node
from noetl_dagster.translator.translator import NoetlOpSpec
from noetl_dagster.translator.versions import (
    RESOURCE_KEY,
    StoredVersion,
    default_asset_key,
    stored_refs,
    version_metadata,
    with_registry,
)
from noetl_dagster.util.links import execution_url, link_tags

__all__ = ["RESOURCE_KEY"]  # re-exported: frames, build and assets import it from here
RESULT_OUTPUT = "result"

# run id -> execution id chosen by noetl_start in this process (launchpad runs without the tag)
_RUN_EXECUTION: dict[str, str] = {}
RETRY_NUMBER_TAG = "dagster/retry_number"  # Dagster's tag on a run its daemon launched as a run retry
_run_lock = threading.Lock()


def output_name(node: Node) -> str:
    prefix = "to_cycle_" if node.kind == "region" else "to_"
    return prefix + naming.sanitize(node.first)


def op_tags(spec: NoetlOpSpec) -> dict[str, str]:
    tags = dict(spec.tags)
    for k in sorted(spec.kinds):
        tags[f"dagster/kind/{naming.sanitize(k)}"] = ""
    return tags


def _execution_id(context) -> str:  # noqa: ANN001
    """The run's execution: its tag, else its parent's/root's (re-execution), else one derived from the root run.

    A run that did not carry the tag gets it, so the UI and the router see which execution it drives.
    """
    run = context.dagster_run
    with _run_lock:  # first: a run retry's new execution replaces the tag it copied from its parent
        eid = _RUN_EXECUTION.get(context.run_id)
    if eid:
        return eid
    if run.tags.get(TAG_EXECUTION):
        return str(run.tags[TAG_EXECUTION])
    found, on_self = None, False
    for run_id in (context.run_id, run.parent_run_id, run.root_run_id):
        other = context.instance.get_run_by_id(run_id) if run_id else None
        if other is not None and other.tags.get(TAG_EXECUTION):
            found, on_self = str(other.tags[TAG_EXECUTION]), run_id == context.run_id
            break
    eid = found or execution_id_for_run(run)
    _remember_run(context, eid, tag=not on_self)
    return eid


def _tagged_execution(context) -> bool:  # noqa: ANN001
    """The run (or the run it re-executes) carries an execution id."""
    run = context.dagster_run
    if run.tags.get(TAG_EXECUTION):
        return True
    for run_id in (run.parent_run_id, run.root_run_id):
        other = context.instance.get_run_by_id(run_id) if run_id else None
        if other is not None and other.tags.get(TAG_EXECUTION):
            return True
    return False


def _remember_run(context, eid: str, *, tag: bool) -> None:  # noqa: ANN001
    with _run_lock:
        _RUN_EXECUTION[context.run_id] = eid
    if tag:
        _tag_run(context, {TAG_EXECUTION: eid})


def _tag_run(context: dg.OpExecutionContext, tags: Mapping[str, str]) -> None:
    try:
        context.instance.add_run_tags(context.run_id, dict(tags))
    except Exception as e:  # noqa: BLE001 - a tag is informational
        context.log.warning(f"could not tag run: {e}")


def run_tagger(context: Any) -> Any:
    """``tag(tags)`` merging comma lists into the run's tags (sub-executions an op ran)."""

    def tag(tags: dict[str, str]) -> None:
        run = context.instance.get_run_by_id(context.run_id)
        merged = dict(tags)
        for k, v in tags.items():  # several ops of one run each ran children: keep them all
            old = (run.tags.get(k) if run is not None else None) or ""
            merged[k] = ",".join(x for x in dict.fromkeys([*old.split(","), *v.split(",")]) if x)
        context.instance.add_run_tags(context.run_id, merged)

    return tag


def workload_field(workload: Mapping[str, Any]) -> dg.Field:
    """A typed launchpad config for workload overrides: one field per workload key, its value as default."""
    fields: dict[str, dg.Field] = {}
    for key, value in workload.items():
        if not naming.NAME_RE.match(str(key)):
            continue  # still accepted: the shape is permissive
        fields[str(key)] = dg.Field(_config_type(value), default_value=_config_default(value), is_required=False,
                                    description=f"workload.{key}")  # fmt: skip
    return dg.Field(
        dg.Permissive(fields), is_required=False, description="workload overrides (shallow merge)"
    )


def _config_type(value: Any) -> Any:
    if isinstance(value, bool):
        return dg.Bool
    if isinstance(value, int):
        return dg.Int
    if isinstance(value, float):
        return dg.Float
    if isinstance(value, str):
        return dg.String
    if isinstance(value, Mapping):
        return dg.Permissive()
    return dg.Any


def _config_default(value: Any) -> Any:
    return json_safe(value)


def start_config_schema(pb: Playbook) -> dict[str, dg.Field]:
    return {
        "workload": workload_field(pb.workload),
        "workload_json": dg.Field(
            dg.Noneable(dg.String), default_value=None, is_required=False,
            description="workload overrides as a JSON object (applied after `workload`; any value types)",
        ),
        "execution_id": dg.Field(
            dg.Noneable(dg.String), default_value=None, is_required=False,
            description="continue this execution instead of starting a new one (default: the run's "
            "noetl/execution_id tag, else a new id)",
        ),
    }  # fmt: skip


def workload_overrides(pb: Playbook, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The keys the run config changes (typed fields equal to the playbook's defaults are not overrides)."""
    base = json_safe(pb.workload)
    out = {k: v for k, v in (cfg.get("workload") or {}).items() if k not in base or base[k] != v}
    raw = cfg.get("workload_json")
    if raw:
        try:
            extra = json.loads(raw)
        except ValueError as e:
            raise dg.Failure(f"workload_json is not valid JSON: {e}") from e
        if not isinstance(extra, dict):
            raise dg.Failure("workload_json must be a JSON object")
        out.update(extra)
    return out


def _nominal_time(context: Any) -> str | None:
    """A scheduled run's nominal time (ISO 8601), from the tag Dagster's scheduler sets (hidden,
    ``.dagster/...``, since Dagster 1.x; the visible spelling is still read)."""
    tags = context.dagster_run.tags
    return (
        tags.get(".dagster/scheduled_execution_time") or tags.get("dagster/scheduled_execution_time") or None
    )


def make_start_op(
    pb: Playbook, spec: NoetlOpSpec, plan: JobPlan, node_outputs: dict[str, str]
) -> dg.OpDefinition:
    """``noetl_start``: record the request (typed workload config) or continue the tagged execution."""
    outs = {name: dg.Out(dg.Nothing, is_required=False) for name in node_outputs.values()}

    def _start(context, _inputs):  # noqa: ANN001 - Dagster inspects the bare parameter
        res = getattr(context.resources, RESOURCE_KEY)
        svc = res.services()
        cfg = context.op_config or {}
        if cfg.get("execution_id"):  # the launchpad asked to continue a given execution
            eid = str(cfg["execution_id"])
            _remember_run(context, eid, tag=context.dagster_run.tags.get(TAG_EXECUTION) != eid)
        else:
            eid = _execution_id(context)
        overrides = workload_overrides(pb, cfg)
        keys = run_partition_keys(context) if pb.dagster.partitions is not None else None
        if keys:  # a partitioned run: the key (a range: its label and keys) is a workload value
            overrides.update(partition_workload(pb, keys))
        eng, started = start_execution(
            pb, svc, eid, overrides, requested_by=f"{REQUESTED_BY_DAGSTER}{context.run_id}",
            logger=context.log, nominal_time=_nominal_time(context),
        )  # fmt: skip
        retry = context.dagster_run.tags.get(RETRY_NUMBER_TAG)
        if retry and not cfg.get("execution_id") and eng.state.finished and eng.state.status == "failed":
            # a run retry (dagster/max_retries) of a failed execution: a failed step never runs again in
            # its execution, so the retry is a new execution of the same request (workload, partition)
            failed, eid = eid, uuid7_from("dagster-run", context.run_id)
            _remember_run(context, eid, tag=True)
            eng, started = start_execution(
                pb, svc, eid, overrides, requested_by=f"{REQUESTED_BY_DAGSTER}{context.run_id}",
                logger=context.log, nominal_time=_nominal_time(context),
            )  # fmt: skip
            context.log.info(f"run retry {retry}: execution {failed} failed; this run starts execution {eid}")
        st = eng.state
        links = link_tags(eid)  # the run links to the execution's page (issue 36)
        if any(context.dagster_run.tags.get(k) != v for k, v in links.items()):  # not launched with them
            _tag_run(context, links)
        if started:
            context.log.info(f"execution {eid} started ({pb.metadata.path})")
        else:
            context.log.info(
                f"continuing execution {eid}: status {st.status}, {len(st.tokens)} pending token(s), "
                f"{len(st.running)} unfinished step run(s)"
            )
            if st.status == "requested":  # its requester died before the workflow started
                eng.recover()
            if eng.is_done() and not work_steps(st) and not st.finished:  # the last run died before finishing
                with execution_lock(res.locks_dir(), eid):
                    status = eng.finish()
                _tag_run(context, {TAG_STATUS: status})
        pending = work_steps(st)
        for key in plan.roots:
            if plan.nodes[key].reach & pending:
                yield dg.Output(None, node_outputs[key], metadata={"execution_id": eid})

    # OpDefinition directly (not @op): no signature inspection, which dominates translating many playbooks
    return dg.OpDefinition(
        compute_fn=_start,
        name=spec.name,
        description=spec.description,
        tags=op_tags(spec),
        config_schema=start_config_schema(pb),
        outs=outs,
        required_resource_keys={RESOURCE_KEY},
        retry_policy=spec.retry_policy,
        pool=spec.pool,
    )


def make_node_op(
    pb: Playbook,
    spec: NoetlOpSpec,
    plan: JobPlan | None,
    node: Node,
    node_outputs: dict[str, str],
    *,
    has_input: bool,
    main_job: str | None = None,
    asset_key: Callable[[str], dg.AssetKey] | None = None,
) -> dg.OpDefinition:
    """The op of one step (or one cycle region): run its activations, yield towards the work left.

    ``main_job``: this op is a per-step job's only op; launched by hand (no ``noetl/execution_id``
    tag) it fails with a message naming the job to launch instead. ``asset_key``: the translator's
    key of a stored table's URI (``NoetlTranslator.get_asset_key``)."""
    outs = {name: dg.Out(dg.Nothing, is_required=False) for name in node_outputs.values()}
    outs[RESULT_OUTPUT] = dg.Out(dg.Nothing, is_required=False, description="the step's result (metadata)")
    ins = {"after": dg.In(dg.Nothing)} if has_input else {}
    region = node.kind == "region"

    def _node(context, _inputs):  # noqa: ANN001
        res = getattr(context.resources, RESOURCE_KEY)
        svc = res.services()
        if main_job and not _tagged_execution(context):
            raise dg.Failure(
                description=f"this job runs step {node.first!r} of {pb.metadata.path} for an execution the "
                f"noetl_router sensor routes a token to; it cannot start one. Launch the job {main_job!r} "
                "instead (or `noetl-dagster run --runner dagster --detach`), or set the run tag "
                f"{TAG_EXECUTION}=<id> of an execution with a pending {node.first!r} token.",
                allow_retries=False,
            )
        eid = _execution_id(context)

        pending: dict[str, str] = {}  # the status tag, written with the cost tags in one add_run_tags

        def finished(status: str) -> None:
            pending[TAG_STATUS] = status

        try:
            report = run_steps(pb, svc, eid, node.steps, logger=context.log, locks_dir=res.locks_dir(),
                               tag_run=run_tagger(context),
                               region=region, on_finish=finished)  # fmt: skip
        except LookupError as e:  # the execution is not in the log: a clear failure, not a traceback
            raise dg.Failure(
                description=str(e), metadata={"execution_id": eid}, allow_retries=False
            ) from None
        try:
            yield from _report_outputs(context, report, node, plan, node_outputs, asset_key, pending)
        finally:
            if pending:  # not written with the cost tags (no engine at hand, or reporting failed)
                _tag_run(context, pending)
        bad = report.unhandled
        if bad:
            first = bad[0]
            told = step_failure(
                svc.event_store.read(eid), pb, first.step
            )  # task, playbook line, user traceback
            raise dg.Failure(
                description=told.text() if told else f"step {first.step!r} failed: {error_text(first.error)}",
                metadata={
                    "execution_id": eid,
                    "error": dg.MetadataValue.json(json_safe(first.error or {})),
                    "failed_steps": dg.MetadataValue.text(", ".join(sorted({o.step for o in bad}))),
                    **(told.metadata() if told else {}),
                },
                allow_retries=False,  # the step's outcome is recorded; retrying the op would not run it again
            ) from None

    return dg.OpDefinition(
        compute_fn=_node,
        name=spec.name,
        description=spec.description,
        tags=op_tags(spec),
        ins=ins,
        outs=outs,
        required_resource_keys={RESOURCE_KEY},
        retry_policy=spec.retry_policy,
        pool=spec.pool,
    )


def usage_metadata(usage: dict[str, dict[str, float]], steps: list[str]) -> dict[str, Any]:
    """Measured usage of this op's steps as numeric metadata (Dagster+ Insights reads numeric keys)."""
    total: dict[str, float] = {}
    for s in steps:
        for k, v in usage.get(s, {}).items():
            total[k] = (
                max(total.get(k, 0), v)
                if k.endswith("peak_bytes") or k.endswith("maxrss_bytes")
                else total.get(k, 0) + v
            )
    return {
        f"noetl/usage/{k}": dg.FloatMetadataValue(float(v)) if isinstance(v, float) else int(v)
        for k, v in sorted(total.items())
    }


# -- cost per attempt / step / op / execution (analytics/noetl_analytics/pricing.py: the allocation SQL's formula) --
COST_PREFIX = "noetl/cost/"
_prices_lock = threading.Lock()
# (env file, data dir) -> (source, mtime, PriceTable)
_PRICES: dict[tuple[str, str], tuple[str, float, PriceTable]] = {}


def price_table(resource: Any) -> PriceTable:
    """The run's price table (``$NOETL_DAGSTER_PRICES`` > ``<data dir>/prices.yaml`` > the packaged
    default, as the facts refresh loads it), re-read when the file changes."""
    data_dir = resource.resolved_data_dir() if hasattr(resource, "resolved_data_dir") else None
    key = (os.environ.get("NOETL_DAGSTER_PRICES") or "", str(data_dir or ""))
    with _prices_lock:
        cached = _PRICES.get(key)
    if cached is not None:
        try:
            if Path(cached[0]).stat().st_mtime == cached[1]:
                return cached[2]
        except OSError:
            pass
    table = PriceTable.load(data_dir=data_dir)
    try:
        mtime = Path(table.source).stat().st_mtime
    except OSError:
        mtime = -1.0
    with _prices_lock:
        _PRICES[key] = (table.source, mtime, table)
    return table


def cost_metadata(cost: Cost, share: float = 1.0) -> dict[str, Any]:
    """A :class:`noetl_analytics.pricing.Cost` (times ``share``) as numeric metadata: ``noetl/cost/<currency>``
    (the total, e.g. ``noetl/cost/usd``) and a key per component that cost something, plus the price
    version (text)."""
    cur = cost.currency.lower()
    md: dict[str, Any] = {f"{COST_PREFIX}{cur}": dg.FloatMetadataValue(cost.total * share)}
    for c in (
        COMPONENTS
    ):  # the priced table's categories (analytics/noetl_analytics/pricing.py); a zero one is no line
        if getattr(cost, c):
            md[f"{COST_PREFIX}{c}_{cur}"] = dg.FloatMetadataValue(getattr(cost, c) * share)
    md[f"{COST_PREFIX}attempts"] = cost.attempts
    md[f"{COST_PREFIX}price_version"] = dg.MetadataValue.text(cost.price_version)
    return md


def run_cost_tags(cost: Cost) -> dict[str, str]:
    """Run tags of the run's own attempts: ``noetl/run_cost_<currency>`` and ``noetl/price_version``."""
    cur = cost.currency.lower()
    return {f"noetl/run_cost_{cur}": decimal_text(cost.total), TAG_PRICE_VERSION: cost.price_version or "-"}


def table_cost_metadata(cost: Cost, tables: int) -> dict[str, Any]:
    """A storing step's cost on one of the ``tables`` it stored: an even share, so summing
    ``noetl/cost/<currency>`` over assets (as Insights does) counts each attempt once."""
    md = cost_metadata(cost, 1.0 / tables)
    md[f"{COST_PREFIX}share"] = dg.FloatMetadataValue(1.0 / tables)
    return md


def _single_op_run(context: Any) -> bool:
    try:
        return len(context.job_def.nodes) == 1
    except Exception:  # noqa: BLE001 - no job definition at hand (a direct op invocation)
        return False


def _op_cost_metadata(
    prices: PriceTable, by_step: Mapping[str, Cost], ran: list[str], *, multi: bool
) -> dict[str, Any]:
    """The op's cost (its steps' attempts summed), and each step's total when the op runs several."""
    md = cost_metadata(sum((by_step[s] for s in ran if s in by_step), Cost(currency=prices.currency)))
    if multi:
        cur = prices.currency.lower()
        for s in ran:
            md[f"{s}.cost_{cur}"] = dg.FloatMetadataValue(by_step[s].total if s in by_step else 0.0)
    return md


def _costs(
    context: Any, report: OpReport, keep: list[Any] | None = None
) -> tuple[PriceTable, dict[str, Cost]] | None:
    """(price table, step -> Cost of the attempts of the step runs this op reported) from the execution's
    ``task.done`` events; None (with a warning) when it cannot be priced. ``keep`` gets the events read."""
    runs = {o.step_run_id for o in report.outcomes}
    eng = report.engine
    try:
        prices = price_table(getattr(context.resources, RESOURCE_KEY))
        return prices, window_cost(
            prices, eng.services.event_store, eng.execution_id, eng.state.sequence, runs, keep
        )
    except Exception as e:  # noqa: BLE001 - cost is informational and never fails a step
        context.log.warning(f"no cost metadata: {e}")
        return None


def window_cost(prices: PriceTable, store: Any, execution_id: str, last_sequence: int, runs: set[str],
                keep: list[Any] | None = None) -> dict[str, Cost]:  # fmt: skip
    """What an op's metadata prices for its step runs ``runs`` when the execution's log stood at
    ``last_sequence``: its window of the log, seeded with the references billed before it (the
    sum over an execution's ops is its cost without the platform line; tests/analytics/test_cost_gate.py).
    ``keep`` gets the events read."""
    evs = _events_of_runs(store, execution_id, last_sequence, runs) if runs else []
    if keep is not None:
        keep.extend(evs)
    return cost_of_events(prices, evs, runs, _billed_before(store, execution_id, evs))


def priced_events(
    context: Any,
    resource: Any,
    events: Callable[[], list[Any]],
    runs: set[str] | None = None,
    billed: Callable[[], BilledRefs | None] | None = None,
) -> tuple[PriceTable, dict[str, Cost]] | None:
    """(price table, step -> Cost of the ``task.done`` attempts in ``events()``, of ``runs`` when given);
    None, with a warning, when they cannot be priced: cost is informational and never fails a step."""
    try:
        prices = price_table(resource)
        return prices, cost_of_events(prices, events(), runs, billed() if billed else None)
    except Exception as e:  # noqa: BLE001
        context.log.warning(f"no cost metadata: {e}")
        return None


def _events_of_runs(store: Any, eid: str, last: int, runs: set[str]) -> list[Any]:
    """The tail of the execution's log that holds the step runs ``runs`` (from their ``step.scheduled``
    on): a window from the last sequence the op saw, widened x4 until every run's scheduling is in it,
    so an op reads its own events, not the whole log (which would make a long execution quadratic)."""
    window = 16
    while True:
        after = max(0, last - window)
        events = [e for e in store.read(eid, after_sequence=after) if e.execution_id == eid]
        if after == 0 or runs <= {e.step_run_id for e in events if e.name == "step.scheduled"}:
            return events
        window *= 4


def _billed_before(store: Any, eid: str, evs: list[Any]) -> BilledRefs | None:
    """The stored references the execution billed before the window ``evs`` of its log (an op's
    events): a step passing on an earlier op's reference names it again, billed there, not in this
    op's metadata (usage_lines.BilledRefs). The log before the window is read only when the window
    names a reference."""
    if not evs or evs[0].sequence is None:
        return None
    if not any(
        (e.name in _REF_EVENTS or e.name == "task.done") and created_refs(e.name, e.data) for e in evs
    ):
        return None
    billed = BilledRefs()
    for e in store.read_range(eid, 0, evs[0].sequence - 1):
        if e.execution_id == eid and (e.name in _REF_EVENTS or e.name == "task.done"):
            billed.lines(e.name, e.data, eid)
    return billed


def _execution_costs(
    context: Any, report: OpReport, prices: PriceTable
) -> tuple[dict[str, Cost], str] | None:
    """The whole execution's cost by step (every line of its log, whichever run or op recorded it),
    and who requested it."""
    eng = report.engine
    try:
        events = eng.services.event_store.read(eng.execution_id)
        by = next(
            (str((e.data or {}).get("requested_by") or "") for e in events if e.name == E_REQUESTED), ""
        )
        return execution_costs(events, prices, eng.execution_id), by
    except Exception as e:  # noqa: BLE001 - informational
        context.log.warning(f"no execution cost: {e}")
        return None


def _inside(context: Any, report: OpReport, node: Node, read: list[Any]) -> dict[str, Any]:
    """The link to the execution page, and for a region or a loop the summary of its inside (issue 36)."""
    md: dict[str, Any] = {}
    url = execution_url(report.execution_id)
    if url:
        md["noetl/execution_page"] = dg.MetadataValue.url(url)
    runs = {o.step_run_id for o in report.outcomes}
    try:
        eng = report.engine
        evs = read or _events_of_runs(eng.services.event_store, eng.execution_id, eng.state.sequence, runs)
        summary = op_summary(evs, runs)
    except Exception as e:  # noqa: BLE001 - informational, never fails a step
        context.log.warning(f"no summary of the op's step runs: {e}")
        return md
    if node.kind == "region" or summary["iterations"] or summary["step_runs"] > 1:
        context.log.info(f"{node.first}: {summary['text']}")
        md["noetl/summary"] = summary["text"]
        md.update({"noetl/step_runs": summary["step_runs"], "noetl/iterations": summary["iterations"],
                   "noetl/retries": summary["retries"]})  # fmt: skip
    return md


def _report_outputs(
    context: dg.OpExecutionContext,
    report: OpReport,
    node: Node,
    plan: JobPlan | None,
    node_outputs: dict[str, str],
    asset_key: Callable[[str], dg.AssetKey] | None = None,
    pending: dict[str, str] | None = None,
) -> Iterator[Any]:
    eng = report.engine
    if eng is None:
        return
    ran = []
    for o in report.outcomes:
        if o.step not in ran:
            ran.append(o.step)
    read: list[Any] = []
    priced = _costs(context, report, read) if ran or report.finished else None
    if ran:
        if len(node.steps) == 1:
            md = result_metadata(eng, ran[0])
        else:
            md = {"noetl/steps": ", ".join(ran)}
            for s in ran:
                for k, v in result_metadata(eng, s).items():
                    if k != "noetl/step":
                        md[f"{s}.{k.removeprefix('noetl/')}"] = v
        md["execution_id"] = eng.execution_id
        md.update(_inside(context, report, node, read))
        md.update(usage_metadata(report.usage, ran))
        if priced is not None:
            md.update(_op_cost_metadata(priced[0], priced[1], ran, multi=len(node.steps) > 1))
        if report.recovered:
            md["recovered_step_runs"] = ", ".join(report.recovered)
        yield dg.Output(None, RESULT_OUTPUT, metadata=md)
    tags: dict[str, str] = {}
    if priced is not None and ran and _single_op_run(context):
        # a run of one op (a per-step job the router launched): the run's own cost is the op's
        prices, by_step = priced
        own = sum((by_step[s] for s in ran if s in by_step), Cost(currency=prices.currency))
        tags.update(run_cost_tags(own))
    res = getattr(context.resources, RESOURCE_KEY)
    mats = list(_materializations(eng.execution_id, report.task_results, res,
                                  context.partition_key if context.has_partition_key else None,
                                  eng.state.workload, priced[1] if priced else None, asset_key))  # fmt: skip
    if priced is not None and report.finished:  # the execution is over: its whole cost on the run
        whole = _execution_costs(context, report, priced[0])
        if whole is not None:
            by_step, requested_by = whole
            tags.update(cost_tags(sum(by_step.values(), Cost(currency=priced[0].currency)), priced[0]))
            # requested by this run: no other run holds its tables (a resumed or routed one may)
            only = context.run_id if requested_by == f"{REQUESTED_BY_DAGSTER}{context.run_id}" else None
            _log_summary(context, eng.execution_id, by_step, priced[0], mats, only)
    if pending:
        tags.update(pending)
        pending.clear()
    if tags:
        _tag_run(context, tags)
    for step, v, mat in mats:
        yield mat
        for ev in declared_check_evaluations(
            eng.playbook, res, step, v, mat.asset_key
        ):  # the step's declared checks
            context.log_event(ev)
    _step_outcomes(context, report, read, asset_key or default_asset_key)
    if plan is None:
        return
    pending = report.pending_steps()
    tokens_by_step: dict[str, list[str]] = {}
    for tid, tok in eng.state.tokens.items():
        tokens_by_step.setdefault(tok.step, []).append(tid)
    for key, name in node_outputs.items():
        target = plan.nodes[key]
        if target.reach & pending:
            toks = [t for s in target.steps for t in tokens_by_step.get(s, [])]
            yield dg.Output(None, name, metadata={"tokens": ", ".join(toks) or "(downstream work)"})


def _log_summary(context: Any, eid: str, by_step: dict[str, Cost], prices: PriceTable, mats: list[Any],
                 only_run: str | None) -> None:  # fmt: skip
    """The execution's cost summary (translator/cost_summary.py): what its ops and tables do not carry.
    ``mats``: the finishing op's own table materializations, not logged yet; ``only_run``: the one run
    that ran the execution, when known."""
    try:
        on_tables = tables_cost(context.instance, eid, prices.currency, only_run)
        on_tables += sum(materialization_cost(m, prices.currency) for _, _, m in mats)
        job = context.job_name.split("__step__")[0]  # a per-step job's runs: the playbook job's summary
        context.log_event(summary_materialization(job, eid, by_step, on_tables, prices))
    except Exception as e:  # noqa: BLE001 - informational, never fails a step
        context.log.warning(f"no cost summary: {e}")


TAG_FAILED_STEPS = "noetl/failed_steps"  # the steps that failed while an arc routed the flow on
TAG_HAS_FAILED_STEPS = "noetl/has_failed_steps"  # "true": filter the runs list on it


def _step_outcomes(
    context: Any, report: OpReport, read: list[Any], asset_key: Callable[[str], dg.AssetKey]
) -> None:
    """What the op's steps did to the tables they store (``step_succeeded``), and a failure an arc
    routed on made visible: ERROR log with the user's line, run tags, the failed check (severity ERROR).
    The spec completes such an execution (the run stays green); nothing about the failure is hidden."""
    eng = report.engine
    handled = [o for o in report.outcomes if not o.ok and not o.unhandled]
    events: list[Any] = []
    if handled:
        events = (
            read
            if any(e.name == "step.failed" for e in read)
            else eng.services.event_store.read(eng.execution_id)
        )
    failed: list[str] = []
    for o in report.outcomes:
        if not o.ok and o.unhandled:
            continue  # the op fails with it (make_node_op)
        told = step_failure(events, eng.playbook, o.step) if not o.ok else None
        if not o.ok:
            failed.append(o.step)
            text = told.text() if told else f"step {o.step!r} failed: {error_text(o.error)}"
            context.log.error(f"{text}\n{ROUTED_NOTE}")
        for key in step_tables(eng.playbook, o.step, asset_key):
            context.log_event(step_check_evaluation(key, o.step, told, eng.execution_id,
                                                    None if o.ok else error_text(o.error)))  # fmt: skip
    if failed:
        run_tagger(context)({TAG_FAILED_STEPS: ",".join(dict.fromkeys(failed)), TAG_HAS_FAILED_STEPS: "true"})


def _materializations(
    eid: str,
    task_results: list[tuple[str, Any]],
    resource: Any = None,
    partition: str | None = None,
    workload: Mapping[str, Any] | None = None,
    costs: Mapping[str, Cost] | None = None,
    asset_key: Callable[[str], dg.AssetKey] | None = None,
) -> Iterator[tuple[str, StoredVersion, dg.AssetMaterialization]]:
    """Tasks that stored a table (their result is a ``noetl://`` reference) materialize its asset key,
    with the metadata the asset-first multi-asset reports (schema, rows, bytes, version), and the
    step's cost (``costs``: step -> Cost) split evenly over the tables the step stored, so summing
    ``noetl/cost/usd`` over assets (as Insights does) counts each attempt once."""
    now = datetime.now(UTC)
    stored: list[tuple[str, dict[str, Any], dg.AssetKey]] = []
    for step, result in task_results:
        for info in stored_refs(result):
            try:
                stored.append((step, info, (asset_key or default_asset_key)(info["uri"])))
            except InvalidLocator:
                continue
    per_step: dict[str, int] = {}
    for step, _, _ in stored:
        per_step[step] = per_step.get(step, 0) + 1
    for step, info, key in stored:
        uri = info["uri"]
        v = StoredVersion(uri, dict(info), execution_id=eid, stored_at=now, workload=dict(workload or {}))
        if resource is not None:
            v = with_registry(resource, v)
        md = version_metadata(v)
        md["noetl/step"] = step
        if costs and step in costs:
            md.update(table_cost_metadata(costs[step], per_step[step]))
        yield step, v, dg.AssetMaterialization(asset_key=key, metadata=md, description=f"stored by step {step}",
                                               partition=partition)  # fmt: skip
