"""Playbook-declared asset checks, evaluated from the event log.

Each ``outputs[].checks`` entry of a step becomes a Dagster asset check on the
table's asset (one ``multi_asset_check`` per playbook, ``<job>__checks``). A check
reads the version Dagster recorded the way the catalog knows it: the registry record
(columns, rows, partition key) and the execution's event log (the reference the task
returned, when it was stored, the workload), then:

- ``row_count: {min, max}``: the version's row count within bounds;
- ``schema: {columns: {name: type}, stable: true}``: the declared columns exist with
  these Arrow types; ``stable``: no column added, dropped or retyped since the previous version;
- ``freshness: {max_age_minutes}``: the version was stored at most that long ago;
- ``assert: '{{ ... }}'``: a template predicate over ``output`` (the reference: rows, size,
  version, uri...), ``columns``, ``workload``, ``execution_id``, ``partition_key``.

Materializing the asset runs its checks after it in the same run; a check can also be
run alone (the asset's *Checks* tab) to re-evaluate, e.g. freshness. Either way a check evaluates
the version Dagster's latest materialization of the asset recorded (``noetl/uri``; for each of
the run's partitions, that partition's), the one the result is attached to in the catalog, never
a newer version only the store knows; ``stable`` compares with the partition's previous version.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import dagster as dg

from noetl_dagster.dsl.locator import InvalidLocator
from noetl_dagster.dsl.model import OutputCheck, Playbook
from noetl_dagster.dsl.templates import TemplateError, template_env
from noetl_dagster.engine import events as E
from noetl_dagster.resources.runtime import TAG_EXECUTION
from noetl_dagster.translator.declare import partitions_def
from noetl_dagster.translator.failures import code_block, step_failure
from noetl_dagster.translator.versions import (
    RESOURCE_KEY,
    StoredVersion,
    default_asset_key,
    previous_version,
    recorded_or_registered,
)

STEP_CHECK = "step_succeeded"  # a check on every table a step stores: fails when the step failed

if TYPE_CHECKING:  # pragma: no cover
    from noetl_dagster.resources.noetl import NoetlResource
    from noetl_dagster.translator.build import CompiledPlaybook


def playbook_checks(
    compiled: list[CompiledPlaybook], owned: set[dg.AssetKey]
) -> list[dg.AssetChecksDefinition]:
    """One multi-asset check per playbook over the checks its outputs declare (for the tables it owns)."""
    out: list[dg.AssetChecksDefinition] = []
    for c in compiled:
        declared: dict[dg.AssetCheckKey, tuple[str, OutputCheck]] = {}
        specs: list[dg.AssetCheckSpec] = []
        for spec in c.assets:
            output = c.outputs.get(spec.key)
            if spec.key not in owned or output is None:
                continue
            for chk in output.checks:
                key = dg.AssetCheckKey(spec.key, chk.name or chk.kind)
                if key in declared:
                    continue
                declared[key] = (output.uri, chk)
                specs.append(dg.AssetCheckSpec(
                    key.name, asset=spec.key, blocking=chk.blocking, description=chk.description or describe(chk),
                    metadata={"noetl/check": chk.kind, "noetl/playbook": c.path},
                ))  # fmt: skip
        steps: dict[dg.AssetKey, list[str]] = {}  # step_succeeded: the steps storing each owned table
        for step in c.playbook.workflow:
            for key in step_tables(c.playbook, step.name, c.asset_key):
                if key in owned and key in {a.key for a in c.assets}:
                    steps.setdefault(key, []).append(step.name)
        for key, names in steps.items():
            if dg.AssetCheckKey(key, STEP_CHECK) in declared:
                continue
            specs.append(dg.AssetCheckSpec(
                STEP_CHECK, asset=key, blocking=False, description=f"Fails when step {', '.join(names)} (which "
                "stores this table) failed and an arc routed the failure on: the run and the execution still "
                "complete, the table was not written.", metadata={"noetl/check": STEP_CHECK, "noetl/playbook": c.path},
            ))  # fmt: skip
        if specs:
            out.append(_checks_def(c, specs, declared, steps))
    return out


def step_tables(
    pb: Playbook, step: str, asset_key: Callable[[str], dg.AssetKey] = default_asset_key
) -> list[dg.AssetKey]:
    """The tables a step stores under a literal ``noetl://`` URI (a write task's ``uri``, its ``outputs``),
    keyed by ``asset_key`` (the translator's key of a URI)."""
    st = pb.steps.get(step)
    if st is None:
        return []
    uris = [t.config.get("uri") for t in st.tool if str(t.config.get("op") or "write") == "write"]
    uris += [o.uri for o in st.outputs]
    out: list[dg.AssetKey] = []
    for uri in uris:
        if not isinstance(uri, str) or "{{" in uri:
            continue
        try:
            key = asset_key(uri.split("@")[0])
        except InvalidLocator:
            continue
        if key not in out:
            out.append(key)
    return out


def step_check_evaluation(key: dg.AssetKey, step: str, failure: Any = None, eid: str | None = None,
                          message: str | None = None) -> dg.AssetCheckEvaluation:  # fmt: skip
    """``step_succeeded`` of a table as a job op reports it: failed (severity ERROR, the user's error and
    playbook line) when the step storing it failed and an arc routed the failure, else passed."""
    md: dict[str, Any] = {"noetl/step": step}
    if eid:
        md["noetl/execution_id"] = eid
    if failure is None and message is None:
        return dg.AssetCheckEvaluation(asset_key=key, check_name=STEP_CHECK, passed=True, metadata=md,
                                       description=f"step {step!r} succeeded")  # fmt: skip
    md.update(failure.metadata() if failure is not None else {})
    text = failure.text() if failure is not None else str(message)
    # the Checks tab shows the description as one paragraph: the headline there, the whole text (traceback
    # included, line by line) as a markdown code block
    md["noetl/error"] = dg.MetadataValue.md(code_block(text[:8000]))
    headline = failure.headline if failure is not None else text.splitlines()[0] if text else "failed"
    return dg.AssetCheckEvaluation(
        asset_key=key, check_name=STEP_CHECK, passed=False, severity=dg.AssetCheckSeverity.ERROR, metadata=md,
        description=f"{headline[:1500]} (an arc routed the failure: the execution went on without this table; "
        "the traceback is in noetl/error)",
    )  # fmt: skip


def _step_check(res: NoetlResource, c: CompiledPlaybook, key: dg.AssetKey, steps: list[str],
                eid: str | None) -> dg.AssetCheckResult:  # fmt: skip
    """``step_succeeded`` run as a check (after a Materialize, or from the Checks tab): the run's execution,
    else the newest execution of the playbook that ran a step storing the table; its last outcome there."""
    store = res.services().event_store
    candidates = [eid] if eid else [x.execution_id for x in store.executions(200) if x.playbook == c.path]
    for cand in candidates:
        events = [e for e in store.read(cand) if e.execution_id == cand]
        ends = [e for e in events if e.step in steps and e.name in (E.STEP_DONE, E.STEP_FAILED)]
        if not ends:
            continue
        last = ends[-1]
        if last.name == E.STEP_DONE:
            ev = step_check_evaluation(key, last.step, eid=cand)
        else:
            ev = step_check_evaluation(key, last.step, step_failure(events, c.playbook, last.step), cand)
        return dg.AssetCheckResult(asset_key=key, check_name=STEP_CHECK, passed=ev.passed, severity=ev.severity,
                                   description=ev.description, metadata=ev.metadata)  # fmt: skip
    return dg.AssetCheckResult(asset_key=key, check_name=STEP_CHECK, passed=True,
                               description=f"no execution of {c.path} ran {', '.join(steps)} yet")  # fmt: skip


def _checks_def(
    c: CompiledPlaybook,
    specs: list[dg.AssetCheckSpec],
    declared: dict[dg.AssetCheckKey, tuple[str, OutputCheck]],
    steps: dict[dg.AssetKey, list[str]],
) -> dg.AssetChecksDefinition:
    @dg.multi_asset_check(
        specs=specs, name=f"{c.job_name}__checks", can_subset=True, required_resource_keys={RESOURCE_KEY},
        description=f"Checks {c.path} declares on its outputs, evaluated from the event log and the registry.",
    )  # fmt: skip
    def _checks(context):  # noqa: ANN001, ANN202 - Dagster reads the annotation at runtime; none here
        res: NoetlResource = getattr(context.resources, RESOURCE_KEY)
        parts = partitions_def(c.playbook)
        pkeys: list[str | None] = (run_partition_keys(context, parts) if parts is not None else None) or [
            None
        ]
        versions: dict[tuple[str, str | None], StoredVersion | None] = {}
        for key in sorted(
            context.selected_asset_check_keys, key=lambda k: (k.asset_key.to_user_string(), k.name)
        ):
            if key not in declared:  # step_succeeded
                yield _step_check(
                    res, c, key.asset_key, steps[key.asset_key], context.run.tags.get(TAG_EXECUTION)
                )
                continue
            uri, chk = declared[key]
            evals = []
            for pk in pkeys:  # the version Dagster's materialization recorded, not the store's newest
                if (uri, pk) not in versions:
                    versions[(uri, pk)] = recorded_or_registered(
                        context.instance, res, key.asset_key, uri, pk
                    )
                evals.append(_evaluation(res, key, chk, versions[(uri, pk)], parts, pk))
            yield dg.AssetCheckResult(**(evals[0] if len(evals) == 1 else _combined(evals, pkeys)))

    return keeps_check_class(_checks)


class NoetlChecksDefinition(dg.AssetChecksDefinition):
    """Asset checks that stay asset checks when Dagster copies them. Dagster's defs-folder loader updates
    the metadata of a component's checks with ``with_attributes``, which rebuilds them through
    ``AssetsDefinition.dagster_internal_init`` as plain ``AssetsDefinition``s; the repository then turns
    each back into an ``AssetChecksDefinition`` passing the beta ``execution_type`` parameter: a
    BetaWarning at every code-server load of every project whose playbooks declare a check. A copy of
    this class is this class, built without ``execution_type`` (a check has none to set)."""

    @staticmethod
    def dagster_internal_init(**attrs: Any) -> NoetlChecksDefinition:  # type: ignore[override]
        attrs.pop("execution_type", None)
        return NoetlChecksDefinition(**attrs)


def keeps_check_class(checks: dg.AssetChecksDefinition) -> NoetlChecksDefinition:
    """``checks`` as a :class:`NoetlChecksDefinition` (same op, specs and resources)."""
    return NoetlChecksDefinition.dagster_internal_init(**checks.get_attributes_dict())


def run_partition_keys(context: Any, parts: dg.PartitionsDefinition | None = None) -> list[str] | None:
    """The partition keys of the run an op belongs to (one, or a backfill range), else None. An op
    Dagster does not partition (the checks) reads them from the run's partition tags."""
    try:
        if context.has_partition_key_range or context.has_partition_key:
            return list(context.partition_keys)
    except Exception:  # noqa: BLE001 - an unpartitioned op
        pass
    tags = context.run.tags
    if tags.get("dagster/partition"):
        return [str(tags["dagster/partition"])]
    first, last = (
        tags.get("dagster/asset_partition_range_start"),
        tags.get("dagster/asset_partition_range_end"),
    )
    if first and last and parts is not None:
        return list(parts.get_partition_keys_in_range(dg.PartitionKeyRange(first, last)))
    return None


def _combined(evals: list[dict[str, Any]], keys: list[str | None]) -> dict[str, Any]:
    """One result for a check over a range run's partitions: passes when every partition passes."""
    failed = [(k, e) for k, e in zip(keys, evals, strict=True) if not e["passed"]]
    desc = (f"{len(failed)} of {len(keys)} partitions fail: " + "; ".join(f"{k}: {e['description']}" for k, e in failed[:5])
            if failed else f"{len(keys)} partitions pass")  # fmt: skip
    md = {
        "noetl/partitions": dg.MetadataValue.json(
            {str(k): e["description"] for k, e in zip(keys, evals, strict=True)}
        ),
        "noetl/partition_uris": dg.MetadataValue.json(  # the version each key's verdict read
            {str(k): (e.get("metadata") or {}).get("noetl/uri") for k, e in zip(keys, evals, strict=True)}
        ),
    }
    return {**{k: evals[0][k] for k in ("asset_key", "check_name", "severity")}, "passed": not failed,
            "description": desc[:2000], "metadata": md}  # fmt: skip


def describe(chk: OutputCheck) -> str:
    if chk.row_count is not None:
        return "row count within " + ", ".join(f"{k} {v}" for k, v in chk.row_count.items())
    if chk.schema_ is not None:
        parts = []
        if chk.schema_.get("columns"):
            parts.append("columns " + ", ".join(f"{n}: {t}" for n, t in chk.schema_["columns"].items()))
        if chk.schema_.get("stable"):
            parts.append("no schema drift since the previous version")
        return "; ".join(parts) or "schema"
    if chk.freshness is not None:
        return f"stored less than {chk.freshness['max_age_minutes']:g} minutes ago"
    return f"assert {chk.assert_}"


def evaluate(
    res: NoetlResource, key: dg.AssetCheckKey, chk: OutputCheck, v: StoredVersion | None
) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(**_evaluation(res, key, chk, v))


def declared_check_evaluations(
    pb: Playbook, res: NoetlResource, step: str, v: StoredVersion, key: dg.AssetKey
) -> list[dg.AssetCheckEvaluation]:
    """A job run that stored a table (asset ``key``) evaluates the checks its step declares on it (the
    same checks the asset's ``<job>__checks`` runs), so a playbook run shows them too."""
    out: list[dg.AssetCheckEvaluation] = []
    series = v.uri.split("@")[0]
    for o in pb.steps[step].outputs if step in pb.steps else []:
        if o.uri != series:
            continue
        for chk in o.checks:
            out.append(dg.AssetCheckEvaluation(**_evaluation(res, dg.AssetCheckKey(key, chk.name or chk.kind), chk, v,
                                                              partitions_def(pb))))  # fmt: skip
    return out


def _evaluation(
    res: NoetlResource, key: dg.AssetCheckKey, chk: OutputCheck, v: StoredVersion | None,
    parts: dg.PartitionsDefinition | None = None, pkey: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    severity = dg.AssetCheckSeverity.WARN if chk.severity == "warn" else dg.AssetCheckSeverity.ERROR
    base = {"asset_key": key.asset_key, "check_name": key.name, "severity": severity}
    if v is None:
        where = f" for partition {pkey}" if pkey else ""
        return {**base, "passed": False, "description": f"no materialization of {key.asset_key.to_user_string()} "
                f"with a registered version is recorded{where}"}  # fmt: skip
    md: dict[str, Any] = {"noetl/uri": v.uri}
    if v.execution_id:
        md["noetl/execution_id"] = v.execution_id
    if v.partition_key:
        md["noetl/partition_key"] = v.partition_key
    passed, why = _verdict(res, chk, v, md, parts)
    return {**base, "passed": passed, "description": why, "metadata": md}


def _verdict(
    res: NoetlResource,
    chk: OutputCheck,
    v: StoredVersion,
    md: dict[str, Any],
    parts: dg.PartitionsDefinition | None,
) -> tuple[bool, str]:
    if chk.row_count is not None:
        rows = v.rows
        md["rows"] = rows if rows is not None else -1
        lo, hi = chk.row_count.get("min"), chk.row_count.get("max")
        ok = rows is not None and (lo is None or rows >= lo) and (hi is None or rows <= hi)
        return ok, f"{rows} rows (expected {describe(chk).removeprefix('row count within ')})"
    if chk.schema_ is not None:
        return _schema(res, chk.schema_, v, md, parts)
    if chk.freshness is not None:
        if v.stored_at is None:
            return False, "the version has no recorded time"
        age = (datetime.now(UTC) - v.stored_at).total_seconds() / 60
        md["age_minutes"] = round(age, 2)
        limit = chk.freshness["max_age_minutes"]
        return age <= limit, f"stored {age:.1f} minutes ago (limit {limit:g})"
    scope = {"output": v.ref, "columns": v.columns, "workload": v.workload, "execution_id": v.execution_id,
             "partition_key": v.partition_key, "rows": v.rows}  # fmt: skip
    try:
        value = template_env().render_str(chk.assert_ or "", scope)
    except TemplateError as e:
        return False, f"{chk.assert_}: {e}"
    ok = value is True or (isinstance(value, str) and value.strip().lower() == "true")
    md["value"] = str(value)[:200]
    return ok, f"{chk.assert_} -> {value!r}"


def _schema(
    res: NoetlResource,
    decl: dict[str, Any],
    v: StoredVersion,
    md: dict[str, Any],
    parts: dg.PartitionsDefinition | None,
) -> tuple[bool, str]:
    have = {str(c.get("name")): str(c.get("type")) for c in v.columns}
    md["columns"] = dg.MetadataValue.json(have)
    problems: list[str] = []
    for name, typ in (decl.get("columns") or {}).items():
        if name not in have:
            problems.append(f"column {name} missing")
        elif have[name] != typ:
            problems.append(f"column {name} is {have[name]}, declared {typ}")
    if decl.get("stable"):
        prev = previous_version(res, v, parts)
        if prev is not None:
            before = {str(c.get("name")): str(c.get("type")) for c in prev.columns}
            added = sorted(set(have) - set(before))
            dropped = sorted(set(before) - set(have))
            retyped = sorted(n for n in set(have) & set(before) if have[n] != before[n])
            for what, names in (("added", added), ("dropped", dropped), ("retyped", retyped)):
                if names:
                    problems.append(f"{what} since {prev.ref.get('version')}: {', '.join(names)}")
            md["previous_version"] = str(prev.ref.get("version"))
    if problems:
        return False, "schema drift: " + "; ".join(problems)
    return True, f"{len(have)} columns as declared" + (" and unchanged" if decl.get("stable") else "")
