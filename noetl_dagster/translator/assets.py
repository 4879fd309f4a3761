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

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import dagster as dg

from noetl_dagster.dsl.locator import InvalidLocator, asset_key_for_uri, parse_locator
from noetl_dagster.engine import events as E
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.translator.declare import partitions_def
from noetl_dagster.translator.ops import RESOURCE_KEY, stored_refs

if TYPE_CHECKING:  # pragma: no cover
    from noetl_dagster.resources.noetl import NoetlResource
    from noetl_dagster.translator.build import CompiledPlaybook

TAG_EXECUTION = "noetl/execution_id"


# -- what an execution stored ----------------------------------------------------------------
@dataclass
class StoredVersion:
    """One version of a declared table: its reference (from the event log) and registry record."""

    uri: str  # versioned noetl:// URI
    ref: dict[str, Any]
    columns: list[dict[str, Any]] = field(default_factory=list)
    execution_id: str | None = None
    stored_at: datetime | None = None
    workload: dict[str, Any] = field(default_factory=dict)
    partition_key: str | None = None
    seq: int | None = None

    @property
    def rows(self) -> int | None:
        return self.ref.get("rows") if isinstance(self.ref.get("rows"), int) else None


def stored_in_execution(resource: NoetlResource, execution_id: str) -> dict[dg.AssetKey, StoredVersion]:
    """Every table the execution stored, newest last per key, read from its event log."""
    events = resource.services().event_store.read(execution_id)
    workload = next((dict(e.data.get("workload") or {}) for e in events if e.name == E.WORKFLOW_STARTED), {})
    out: dict[dg.AssetKey, StoredVersion] = {}
    for ev in events:
        if ev.name != E.TASK_DONE or ev.status != "success":
            continue
        outcome = ev.data.get("outcome") or {}
        for ref in stored_refs(outcome.get("result") if isinstance(outcome, Mapping) else None):
            try:
                key = dg.AssetKey(asset_key_for_uri(ref["uri"]))
            except InvalidLocator:
                continue
            out[key] = _with_registry(resource, StoredVersion(
                ref["uri"], dict(ref), execution_id=execution_id, stored_at=_time(ev.timestamp), workload=workload,
            ))  # fmt: skip
    return out


def latest_version(resource: NoetlResource, uri: str, version: str | None = None) -> StoredVersion | None:
    """The newest (or the given) version of a table: the registry's record, then the execution's
    event log for the reference its task returned and the time it was stored."""
    loc = parse_locator(uri, require_version=False)
    reg = resource.registry(loc.tenant, loc.project)
    try:
        plan = reg.resolve(loc.unversioned().uri + (f"@{version}" if version else ""))
        res = reg.get(plan.resource_id)
    except Exception:  # noqa: BLE001 - not stored yet, or not readable from this scope
        return None
    v = StoredVersion(res.uri, {"uri": res.uri, "version": res.version, "rows": plan.rows, "size": plan.size_bytes,
                                "checksum": plan.expected_checksum, "format": plan.format,
                                "schema_fingerprint": plan.schema_fingerprint, "resource_id": res.resource_id},
                      columns=list(res.metadata.get("columns") or []), execution_id=res.execution_id,
                      stored_at=_time(res.created_at), seq=res.seq,
                      partition_key=_text(res.metadata.get("partition_key")))  # fmt: skip
    if res.execution_id:
        logged = {sv.uri: sv for sv in stored_in_execution(resource, res.execution_id).values()}
        hit = logged.get(res.uri)
        if hit is not None:  # the reference and time the event log recorded win
            v.ref, v.stored_at, v.workload = {**v.ref, **hit.ref}, hit.stored_at or v.stored_at, hit.workload
    return v


def previous_version(resource: NoetlResource, v: StoredVersion) -> StoredVersion | None:
    version = str(v.ref.get("version") or "")
    if not (version.startswith("v") and version[1:].isdigit() and int(version[1:]) > 1):
        return None
    return latest_version(resource, v.uri, f"v{int(version[1:]) - 1}")


def _with_registry(resource: NoetlResource, v: StoredVersion) -> StoredVersion:
    rid = v.ref.get("resource_id")
    if not rid:
        return v
    try:
        loc = parse_locator(v.uri, require_version=False)
        res = resource.registry(loc.tenant, loc.project).get(rid)
    except Exception:  # noqa: BLE001 - metadata is best effort; the reference itself is in the log
        return v
    v.columns = list(res.metadata.get("columns") or [])
    v.partition_key = _text(res.metadata.get("partition_key"))
    v.seq = res.seq
    return v


def version_metadata(v: StoredVersion) -> dict[str, Any]:
    """What a materialization carries: schema, rows, bytes, the versioned URI and registry version."""
    ref = v.ref
    md: dict[str, Any] = {"noetl/uri": dg.MetadataValue.text(v.uri)}
    if v.columns:
        md["dagster/column_schema"] = dg.TableSchema(
            columns=[dg.TableColumn(str(c.get("name")), str(c.get("type")),
                                    constraints=dg.TableColumnConstraints(nullable=bool(c.get("nullable", True))))
                     for c in v.columns]
        )  # fmt: skip
    if v.rows is not None:
        md["dagster/row_count"] = dg.MetadataValue.int(v.rows)
    if isinstance(ref.get("size"), int):
        md["noetl/size_bytes"] = dg.MetadataValue.int(ref["size"])
    for k in ("version", "checksum", "format", "schema_fingerprint", "resource_id", "location"):
        if isinstance(ref.get(k), str):
            md[f"noetl/{k}"] = dg.MetadataValue.text(ref[k])
    if v.execution_id:
        md["noetl/execution_id"] = dg.MetadataValue.text(v.execution_id)
    if v.partition_key:
        md["noetl/partition_key"] = dg.MetadataValue.text(v.partition_key)
    if isinstance(ref.get("inputs"), list) and ref["inputs"]:
        md["noetl/inputs"] = dg.MetadataValue.json(ref["inputs"])
    return md


def _first_error(res: NoetlResource, execution_id: str) -> str:
    for ev in res.services().event_store.read(execution_id):
        err = (ev.data.get("outcome") or {}).get("error") if ev.status == "error" else None
        if err:
            return f" at step {ev.step}: {err.get('message', err) if isinstance(err, Mapping) else err}"
    return ""


def _time(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def _text(v: Any) -> str | None:
    return str(v) if v not in (None, "") else None


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
                             + _first_error(res, result.execution_id),
                             metadata={"execution_id": result.execution_id}, allow_retries=False)  # fmt: skip
        stored = stored_in_execution(res, result.execution_id)
        for spec in specs:
            v = stored.get(spec.key)
            if v is None:
                context.log.warning(f"{c.path} declares {spec.key.to_user_string()} but execution "
                                    f"{result.execution_id} did not store it")  # fmt: skip
                continue
            yield dg.MaterializeResult(asset_key=spec.key, metadata=version_metadata(v))

    return _tables
