"""Execution archive bundles (seed 004 §7) and replay from a bundle alone.

A bundle lives in a PayloadStore under the object layout
``noetl/env=…/…/tenant=T/project=P/date=D/execution=ID/``::

    manifest.json                      schema, ids, event range, checksums of every file, final-state digest,
                                       each execution's hash-chain head (``chain``)
    signatures/manifest.sig            the manifest's signature, when a signing key is set (archive_signing)
    events/segment-000001.jsonl.zst    the execution's events (and its sub-playbooks'), zstd JSON lines
    events/segment-000001.sha256       "<hex>  segment-000001.jsonl.zst"
    results/result-manifest.json       every stored result reference ($ref) and each step's final result summary
    lineage/lineage.json               steps, arcs fired, parent/child executions, result references
    metrics/summary.json               durations, counts of steps, task attempts, failures, loop iterations

Archives are immutable: archiving an execution again with the same events is a
no-op; different events under the same bundle raise :class:`ArchiveConflict`.

Tamper evidence (issue 41): an execution whose log fails its hash chain is not archived; each
event line carries its chain hash (``hash``), the manifest each execution's head, and reading a
bundle checks the checksums, the signature (when a verify key is set) and every chain against
the manifest's heads, naming the first bad event.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter, defaultdict
from datetime import UTC, datetime
from typing import Any

import zstandard

from noetl_dagster.engine.chain import ChainReport, chain_hashes, check_chain
from noetl_dagster.engine.events import Event
from noetl_dagster.engine.state import fold
from noetl_dagster.storage import archive_signing
from noetl_dagster.storage.events import EventStore
from noetl_dagster.storage.payload import ChecksumMismatch, PayloadStore, is_ref, open_payload_store
from noetl_dagster.util.jsonutil import dumps, plain

SCHEMA = "noetl.archive-manifest.v1"
SEGMENT_EVENTS = 10_000


class ArchiveConflict(RuntimeError):
    """A different archive already exists for this execution (bundles are immutable)."""


def _hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def state_digest(events: list[Event]) -> tuple[str, dict[str, Any]]:
    """sha256 of the canonical JSON of the state the events fold to (refs left as references)."""
    snap = plain(fold(events).snapshot())
    blob = json.dumps(snap, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + _hex(blob), snap


def _collect_execution(store: EventStore, execution_id: str, hashes: dict[tuple[str, int], str],
                       chains: dict[str, ChainReport]) -> list[Event]:  # fmt: skip
    """The execution's events once its chain verifies (an altered log is not archived: the bundle
    would vouch for the edit); its full hashes go into ``hashes``, its report into ``chains``."""
    entries = store.read_chained(execution_id)
    if not entries:
        raise KeyError(f"no events for execution {execution_id}")
    report = check_chain(execution_id, entries)
    report.raise_if_broken()
    chains[execution_id] = report
    for (seq, _ev, _s), h in zip(entries, chain_hashes(entries), strict=True):
        if h is not None:
            hashes[(execution_id, seq)] = h.hex()
    return [e for _s, e, _h in entries if e is not None]


def _children(store: EventStore, execution_id: str) -> list[str]:
    return [e.execution_id for e in store.executions(100_000) if e.parent_execution_id == execution_id]


def _refs(value: Any, out: list[dict[str, Any]], where: str) -> None:
    if is_ref(value):
        out.append({**value["$ref"], "event": where})
    elif isinstance(value, dict):
        for v in value.values():
            _refs(v, out, where)
    elif isinstance(value, list):
        for v in value:
            _refs(v, out, where)


def _line(e: Event, hashes: dict[tuple[str, int], str]) -> str:
    d = e.to_dict()
    h = hashes.get((e.execution_id, e.sequence or 0))
    if h is not None:
        d["hash"] = h
    return dumps(d)


def _segments(events: list[Event], hashes: dict[tuple[str, int], str]) -> list[tuple[bytes, int, int, int]]:
    out = []
    cctx = zstandard.ZstdCompressor(level=6)
    for i in range(0, len(events), SEGMENT_EVENTS):
        chunk = events[i : i + SEGMENT_EVENTS]
        lines = "".join(_line(e, hashes) + "\n" for e in chunk).encode()
        out.append((cctx.compress(lines), len(chunk), i, i + len(chunk) - 1))
    return out


def _metrics(events: list[Event]) -> dict[str, Any]:
    names = Counter(e.name for e in events)
    first, last = events[0].timestamp, events[-1].timestamp
    dur = None
    try:
        dur = (datetime.fromisoformat(last) - datetime.fromisoformat(first)).total_seconds()
    except ValueError:
        pass
    step_ms: dict[str, float] = {}
    for e in events:
        if e.name in ("step.done", "step.failed") and isinstance(e.data.get("duration_ms"), (int, float)):
            step_ms[e.step or "?"] = step_ms.get(e.step or "?", 0.0) + e.data["duration_ms"]
    return {
        "events": len(events),
        "by_name": dict(names),
        "steps_done": names.get("step.done", 0),
        "steps_failed": names.get("step.failed", 0),
        "task_attempts": names.get("task.done", 0),
        "task_failures": sum(1 for e in events if e.name == "task.done" and e.status == "error"),
        "loop_iterations": names.get("loop.iteration.done", 0) + names.get("loop.iteration.failed", 0),
        "wall_seconds": dur,
        "step_duration_ms": step_ms,
    }


def archive_execution(
    execution_id: str,
    event_store: EventStore,
    to: str | PayloadStore,
    *,
    registry: Any = None,
    include_children: bool = True,
) -> dict[str, Any]:
    """Write the bundle; return the manifest (with ``uri`` and ``status``: written | exists)."""
    from noetl_dagster.dsl.locator import object_prefix

    store = to if isinstance(to, PayloadStore) else open_payload_store(to)
    hashes: dict[tuple[str, int], str] = {}
    chains: dict[str, ChainReport] = {}
    events = _collect_execution(event_store, execution_id, hashes, chains)
    head = events[0]
    if not any(e.name == "workflow.finished" for e in events):
        raise ValueError(f"execution {execution_id} has not finished; archive it once it has (or resume it)")
    children = _children(event_store, execution_id) if include_children else []
    child_events: list[Event] = []
    for c in children:
        child_events.extend(_collect_execution(event_store, c, hashes, chains))
    all_events = events + child_events
    digest, snap = state_digest(events)
    day = head.timestamp[:10]
    prefix = object_prefix(head.tenant_id, head.project_id, date=day, execution_id=execution_id)

    existing_uri = store.uri_for(prefix + "manifest.json")
    if store.exists(existing_uri):
        old = json.loads(store.get_bytes(existing_uri))
        if old.get("final_state_digest") == digest and old.get("event_count") == len(all_events):
            verify_bundle(store, prefix, old)
            return {**old, "uri": store.uri_for(prefix), "status": "exists"}
        raise ArchiveConflict(f"a different archive of {execution_id} already exists at {existing_uri}")

    files: dict[str, str] = {}
    segs = []
    for n, (blob, count, lo, hi) in enumerate(_segments(all_events, hashes), start=1):
        name = f"events/segment-{n:06d}.jsonl.zst"
        store.put_bytes(prefix + name, blob)
        h = _hex(blob)
        store.put_bytes(
            prefix + f"events/segment-{n:06d}.sha256", f"{h}  segment-{n:06d}.jsonl.zst\n".encode()
        )
        files[name] = "sha256:" + h
        segs.append(
            {"path": name, "sha256": "sha256:" + h, "events": count, "first_index": lo, "last_index": hi}
        )

    refs: list[dict[str, Any]] = []
    for e in all_events:
        _refs(e.data, refs, f"{e.execution_id}:{e.sequence}:{e.name}")
    result_manifest = {
        "schema_version": "noetl.result-manifest.v1",
        "resource_uri": f"noetl://{head.tenant_id}/{head.project_id}/results/execution/{execution_id}@v1",
        "producer": {"execution_id": execution_id, "playbook": head.data.get("playbook")},
        "artifacts": refs,
        "step_results": {k: v for k, v in snap["results"].items()},
    }
    fired = [
        {
            "from": e.step,
            "to": [f["step"] for f in e.data.get("fired", [])],
            "event": e.data.get("event_name"),
        }
        for e in events
        if e.name == "next.evaluated"
    ]
    lineage = {
        "execution_id": execution_id,
        "playbook": head.data.get("playbook"),
        "parent_execution_id": head.parent_execution_id,
        "children": children,
        "steps_run": snap["runs"],
        "transitions": fired,
        "outputs": [r["uri"] for r in refs if "uri" in r],
    }
    metrics = _metrics(events)
    for rel, obj in (
        ("results/result-manifest.json", result_manifest),
        ("lineage/lineage.json", lineage),
        ("metrics/summary.json", metrics),
    ):
        blob = json.dumps(obj, indent=2, sort_keys=True, default=str).encode()
        store.put_bytes(prefix + rel, blob)
        files[rel] = "sha256:" + _hex(blob)
    manifest = {
        "schema_version": SCHEMA,
        "execution_id": execution_id,
        "tenant_id": head.tenant_id,
        "project_id": head.project_id,
        "playbook": head.data.get("playbook"),
        "created_at": datetime.now(UTC).isoformat(),
        "final_status": snap["status"],
        "final_state_digest": digest,
        "event_count": len(all_events),
        "event_range": {
            "execution": execution_id,
            "first_sequence": events[0].sequence,
            "last_sequence": events[-1].sequence,
        },
        "children": children,
        "segments": segs,
        "files": files,
        # each execution's chain head: what a restore checks the events against (and the signature covers)
        "chain": {
            eid: {
                k: v
                for k, v in r.to_json().items()
                if k in ("status", "head", "last_sequence", "chained_from")
            }
            for eid, r in chains.items()
        },  # fmt: skip
    }
    manifest_bytes = json.dumps(manifest, indent=2, sort_keys=True).encode()
    store.put_bytes(prefix + "manifest.json", manifest_bytes)
    key = archive_signing.signing_key()
    if key:
        store.put_bytes(prefix + archive_signing.SIGNATURE_PATH, archive_signing.sign(manifest_bytes, key))
    uri = store.uri_for(prefix)
    if registry is not None:
        register_archive(registry, manifest, uri, store.uri_for(prefix + "manifest.json"))
    return {**manifest, "uri": uri, "status": "written", "signed": bool(key)}


def register_archive(registry: Any, manifest: dict[str, Any], bundle_uri: str, manifest_uri: str) -> Any:
    """Record the bundle as an ``execution_archive`` resource in the registry."""
    t, p, eid = manifest["tenant_id"], manifest["project_id"], manifest["execution_id"]
    uri = f"noetl://{t}/{p}/archives/execution_archive/{eid}"
    return registry.register(
        uri,
        kind="execution_archive",
        locations=[{"uri": manifest_uri, "format": "json", "checksum": None}],
        metadata={
            "bundle_uri": bundle_uri,
            "final_status": manifest["final_status"],
            "events": manifest["event_count"],
            "final_state_digest": manifest["final_state_digest"],
        },  # fmt: skip
        execution_id=eid,
    )


def verify_bundle(store: PayloadStore, prefix: str, manifest: dict[str, Any]) -> None:
    for rel, checksum in manifest.get("files", {}).items():
        data = store.get_bytes(store.uri_for(prefix + rel))
        if "sha256:" + _hex(data) != checksum:
            raise ChecksumMismatch(f"archive file {rel} does not match its manifest checksum")


def _split_bundle_uri(uri: str) -> tuple[PayloadStore, str]:
    from urllib.parse import unquote

    root, _, query = uri.partition("?")  # s3://bucket/…/execution=ID/?endpoint_url=… keeps its options
    if root.endswith("manifest.json"):
        root = root[: -len("manifest.json")]
    root = root.rstrip("/")
    if root.startswith("file://"):
        root = unquote(root[len("file://") :])
    return open_payload_store(root + (f"?{query}" if query else "")), ""


def read_archive_events(uri: str) -> tuple[dict[str, Any], list[Event]]:
    """Load and verify a bundle: its signature (when a verify key is set), every file's checksum,
    then its events and their hash chains against the manifest's heads (LogTampered if altered)."""
    manifest, events, _report = _read_verified(uri)
    return manifest, events


def verify_archive(uri: str) -> dict[str, Any]:
    """``noetl-dagster verify --archive``: the bundle's signature and chains (LogTampered if altered)."""
    manifest, _events, report = _read_verified(uri)
    return {"uri": uri, "execution_id": manifest.get("execution_id"), **report}


def _read_verified(uri: str) -> tuple[dict[str, Any], list[Event], dict[str, Any]]:
    store, prefix = _split_bundle_uri(uri)
    manifest_bytes = store.get_bytes(store.uri_for(prefix + "manifest.json"))
    manifest = json.loads(manifest_bytes)
    if manifest.get("schema_version") != SCHEMA:
        raise ValueError(f"{uri}: not a NoETL execution archive (schema {manifest.get('schema_version')!r})")
    sig_uri = store.uri_for(prefix + archive_signing.SIGNATURE_PATH)
    key = archive_signing.verify_key()
    if key:  # first: a bad signature says the manifest (checksums, heads) cannot be trusted at all
        sig = store.get_bytes(sig_uri) if store.exists(sig_uri) else None
        signature = archive_signing.check(manifest_bytes, sig, key, uri)
    else:
        signature = "present, not checked (no verify key)" if store.exists(sig_uri) else "unsigned"
    verify_bundle(store, prefix, manifest)
    dctx = zstandard.ZstdDecompressor()
    events: list[Event] = []
    stored: dict[str, list[tuple[int, Event | None, bytes | None]]] = defaultdict(list)
    for seg in manifest["segments"]:
        blob = store.get_bytes(store.uri_for(prefix + seg["path"]))
        side = (
            store.get_bytes(store.uri_for(prefix + seg["path"].replace(".jsonl.zst", ".sha256")))
            .decode()
            .split()[0]
        )
        if side != _hex(blob):
            raise ChecksumMismatch(f"{seg['path']} does not match its .sha256 sidecar")
        with dctx.stream_reader(io.BytesIO(blob)) as r:
            text = r.read().decode()
        for line in text.splitlines():
            if line:
                d = json.loads(line)
                ev = Event.from_dict(d)
                events.append(ev)
                h = d.get("hash")
                stored[ev.execution_id].append(
                    (ev.sequence or 0, ev, bytes.fromhex(h) if isinstance(h, str) else None)
                )
    heads = manifest.get("chain") or {}
    reports = []
    for eid in dict.fromkeys([manifest["execution_id"], *stored]):
        want = (heads.get(eid) or {}).get("head")
        report = check_chain(eid, sorted(stored[eid], key=lambda x: x[0]), want)
        report.raise_if_broken(f" (archive {uri})")
        reports.append(report.to_json())
    return manifest, events, {"status": "ok", "signature": signature, "executions": reports}


def replay_from_archive(uri: str, *, bodies: bool = False, body_limit: int | None = None) -> dict[str, Any]:
    """Rebuild the execution's final state from the bundle alone and compare with the recorded digest;
    every stored reference of its events is resolved through the payload registry and summed up
    (``bodies``: the references in ``ctx`` replaced by their verified payloads, up to ``body_limit``)."""
    from noetl_dagster.storage.resolve import DEFAULT_BODY_LIMIT, RefResolver  # noqa: PLC0415

    manifest, events = read_archive_events(uri)
    eid = manifest["execution_id"]
    own = [e for e in events if e.execution_id == eid]
    digest, snap = state_digest(own)
    refs: list[dict[str, Any]] = []
    for e in events:
        _refs(e.data, refs, "")
    limit = DEFAULT_BODY_LIMIT if body_limit is None else body_limit
    like = _split_bundle_uri(uri)[0]
    reader = (own[0].tenant_id, own[0].project_id) if own else None  # the references' own tenant reads them
    ctx = (
        RefResolver(like, bodies=True, body_limit=limit, reader=reader).resolve_value(snap["ctx"])
        if bodies
        else snap["ctx"]
    )
    return {
        "execution_id": eid,
        "match": digest == manifest["final_state_digest"],
        "status": snap["status"],
        "recorded_status": manifest["final_status"],
        "state_digest": digest,
        "recorded_digest": manifest["final_state_digest"],
        "events": len(events),
        "children": manifest.get("children", []),
        "runs": snap["runs"],
        "ctx": ctx,
        "references": RefResolver(like, reader=reader).summarize_all(
            {k: v for k, v in r.items() if k != "event"} for r in refs
        ),
    }
