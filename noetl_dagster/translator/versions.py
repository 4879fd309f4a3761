"""Versions of declared tables as the catalog knows them: the registry record and the reference
the storing task returned in the execution's event log (the same log the engine folds).

Used by the asset-first multi-asset, the job ops' materializations and the asset checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import dagster as dg

from noetl_dagster.dsl.locator import InvalidLocator, parse_locator
from noetl_dagster.engine import events as E
from noetl_dagster.translator.naming import table_key

if TYPE_CHECKING:  # pragma: no cover
    from noetl_dagster.resources.noetl import NoetlResource

RESOURCE_KEY = "noetl"  # the NoetlResource of a code location


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


def default_asset_key(uri: str) -> dg.AssetKey:
    """The default translator's asset key of a table URI (``NoetlTranslator.get_asset_key``)."""
    return dg.AssetKey(table_key(uri))


def stored_in_execution(
    resource: NoetlResource,
    execution_id: str,
    steps: dict[dg.AssetKey, str] | None = None,
    events: Any = None,
    asset_key: Callable[[str], dg.AssetKey] | None = None,
) -> dict[dg.AssetKey, StoredVersion]:
    """Every table the execution stored, newest last per key, read from its event log (or ``events``,
    already read); ``steps`` (when given) receives the step that stored each one. ``asset_key``: the
    translator's key of a URI (default: :func:`default_asset_key`)."""
    asset_key = asset_key or default_asset_key
    if events is None:
        events = resource.services().event_store.read(execution_id)
    workload = next((dict(e.data.get("workload") or {}) for e in events if e.name == E.WORKFLOW_STARTED), {})
    out: dict[dg.AssetKey, StoredVersion] = {}
    for ev in events:
        if ev.name != E.TASK_DONE or ev.status != "success":
            continue
        outcome = ev.data.get("outcome") or {}
        for ref in stored_refs(outcome.get("result") if isinstance(outcome, Mapping) else None):
            try:
                key = asset_key(ref["uri"])
            except InvalidLocator:
                continue
            out[key] = with_registry(resource, StoredVersion(
                ref["uri"], dict(ref), execution_id=execution_id, stored_at=_time(ev.timestamp), workload=workload,
            ))  # fmt: skip
            if steps is not None and ev.step:
                steps[key] = ev.step
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


@dataclass(frozen=True)
class Recorded:
    """What Dagster's latest materialization of a table (for a partition) recorded: the versioned URI
    and the execution that stored it."""

    uri: str  # versioned noetl:// URI
    execution_id: str | None
    run_id: str

    @property
    def version(self) -> str:
        return self.uri.rpartition("@")[2]


def recorded_version(
    instance: dg.DagsterInstance, key: dg.AssetKey, partition: str | None = None
) -> Recorded | None:
    """The version Dagster's latest materialization of ``key`` (for ``partition``) names, or None (never
    materialized, or by something that recorded no ``noetl/uri``)."""
    flt = dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None)
    records = instance.fetch_materializations(flt, limit=1).records
    mat = records[0].asset_materialization if records else None
    if mat is None:
        return None
    uri, eid = mat.metadata.get("noetl/uri"), mat.metadata.get("noetl/execution_id")
    uri = getattr(uri, "value", uri)
    if not isinstance(uri, str) or "@" not in uri:
        return None
    eid = getattr(eid, "value", eid)
    return Recorded(uri, eid if isinstance(eid, str) else None, records[0].run_id)


def recorded_or_registered(
    instance: dg.DagsterInstance | None, resource: NoetlResource, key: dg.AssetKey, uri: str, partition: str | None,
) -> StoredVersion | None:  # fmt: skip
    """The version of ``key`` Dagster's latest materialization (for ``partition``) recorded, as the catalog
    knows it; None when Dagster recorded none (a version only the store knows is not evaluated)."""
    rec = recorded_version(instance, key, partition) if instance is not None else None
    if rec is None:
        return None
    return latest_version(resource, uri, rec.version)


MAX_PARTITION_WALK = 5000  # versions a partition lookup walks back through at most


def partition_version(
    resource: NoetlResource,
    uri: str,
    key: str,
    parts: dg.PartitionsDefinition | None = None,
    *,
    before: int | None = None,
) -> StoredVersion | None:
    """The newest version (below ``before``) whose recorded ``partition_key`` covers ``key``: partition P's
    data, never a version another partition wrote after it."""
    from noetl_dagster.translator.declare import covered_keys  # noqa: PLC0415 - declare imports nothing of ours

    loc = parse_locator(uri, require_version=False)
    reg = resource.registry(loc.tenant, loc.project)
    series = loc.unversioned().uri
    try:
        newest = reg.resolve(series).version
    except Exception:  # noqa: BLE001 - not stored yet, or not readable from this scope
        return None
    n = _number(newest)
    if n is None:
        return None
    if before is not None:
        n = min(n, before - 1)
    for i in range(n, max(n - MAX_PARTITION_WALK, 0), -1):
        try:
            res = reg.get(reg.resolve(f"{series}@v{i}").resource_id)
        except Exception:  # noqa: BLE001 - a version this scope cannot read is not this partition's
            continue
        label = _text(res.metadata.get("partition_key"))
        if label == key or key in covered_keys(label, parts):
            return latest_version(resource, series, f"v{i}")
    return None


def previous_version(
    resource: NoetlResource, v: StoredVersion, parts: dg.PartitionsDefinition | None = None
) -> StoredVersion | None:
    """The version before ``v``; for a partitioned table, the one before it in the same partition."""
    n = _number(v.ref.get("version"))
    if n is None or n <= 1:
        return None
    if v.partition_key:
        return partition_version(resource, v.uri, v.partition_key, parts, before=n)
    return latest_version(resource, v.uri, f"v{n - 1}")


def _number(version: Any) -> int | None:
    text = str(version or "")
    return int(text[1:]) if text.startswith("v") and text[1:].isdigit() else None


def with_registry(resource: NoetlResource, v: StoredVersion) -> StoredVersion:
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


def _time(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def _text(v: Any) -> str | None:
    return str(v) if v not in (None, "") else None


def stored_refs(result: Any) -> Iterator[dict[str, Any]]:
    """The store references in a task result: itself, or each item of a list / loop aggregate.

    Only top-level references count: a read's result carries the reference it read under
    ``ref``, which is an input, not something this task stored.
    """
    if (
        isinstance(result, dict)
        and isinstance(result.get("uri"), str)
        and result["uri"].startswith("noetl://")
    ):
        yield result
    elif isinstance(result, dict) and isinstance(result.get("results"), list):
        for item in result["results"][:1000]:
            yield from stored_refs(item)
    elif isinstance(result, list):
        for item in result[:1000]:
            if isinstance(item, dict):
                yield from stored_refs(item)
