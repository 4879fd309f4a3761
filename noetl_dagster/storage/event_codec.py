"""How events are stored and read back: bodies, per-execution sequences, and the compressed segments of a loop.

Shared by the SQLite and Postgres event stores; no connection handling here."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

from noetl_dagster.engine.chain import GENESIS, event_link
from noetl_dagster.engine.events import ENTITY_OF, ENVELOPE_COLUMNS, SCHEMA_VERSION, SERVER_EVENTS, Event
from noetl_dagster.engine.recorder import MAX_EVENT_BYTES, check_event_size
from noetl_dagster.util.jsonutil import dumps, loads, replace_lone_surrogates
from noetl_dagster.util.lazylog import LazyLogger

log = LazyLogger("noetl_dagster.storage")


class EventStoreTooNew(RuntimeError):
    """The store's schema is newer than this version knows: it was written by a newer noetl-dagster,
    and appending with an older one could break what the newer layout relies on (e.g. gid order)."""


def refuse_newer_schema(current: int, known: int, where: str) -> None:
    if current > known:
        raise EventStoreTooNew(
            f"the event store {where} has schema version {current}; this noetl-dagster knows up to {known}"
            " (the store was written by a newer version): upgrade noetl-dagster to use it"
        )


def _clean(value: Any) -> Any:
    """Lone surrogates replaced by U+FFFD (the rule the recorder applies before an event exists, see
    util.jsonutil), so nothing read back from the store can fail to encode as UTF-8 later (output,
    archives, exporters), rows written before that rule included."""
    return replace_lone_surrogates(value)


def decode_body(
    body: Any, where: str, skipped: list[tuple[str, str]] | None = None, columns: Sequence[Any] | None = None
) -> Event | None:
    """One stored row → Event, or None (logged, and added to ``skipped``) when the row cannot be decoded.
    ``columns``: the row's ``ENVELOPE_COLUMNS`` values, for a body written without them (SQLite rows
    since issue 19; a body that has them, as older rows do, keeps its own).

    Readers skip and report a bad row rather than fail: one corrupt execution must not stop
    ``events``/``replay`` of the rest of its log, nor the facts or lineage exports of every other one."""
    try:
        try:
            raw = loads(body)
        except ValueError:  # orjson refuses lone-surrogate escapes the stdlib writer produces
            raw = _clean(json.loads(body))
        if columns is not None and type(raw) is dict and "event_id" not in raw:
            raw.update(zip(ENVELOPE_COLUMNS, columns, strict=True))
        return Event.from_dict(raw)
    except Exception as e:  # noqa: BLE001 - any undecodable row is skipped, never fatal
        msg = f"{type(e).__name__}: {str(e)[:200]}"
        log.warning("skipping undecodable event row %s: %s", where, msg)
        if skipped is not None:
            skipped.append((where, msg))
        return None


def _execution_update(ev: Event) -> tuple[str | None, str | None, str | None]:
    """(playbook, status, finished_at) implied by an event, for the executions index."""
    if ev.name == "playbook.execution.requested":
        return ev.data.get("playbook"), "requested", None
    if ev.name == "workflow.started":
        return None, "running", None
    if ev.name == "workflow.finished":
        return None, ev.data.get("status", "completed"), ev.timestamp
    return None, None, None


_EXECUTION_EVENTS = frozenset({"playbook.execution.requested", "workflow.started", "workflow.finished"})


def sequence_batch(
    events: Sequence[Event],
    existing: dict[str, int],
    last_sequence: Callable[[str], int],
    *,
    encode: bool = True,
) -> tuple[list[tuple[Any, ...]], dict[str, int], dict[str, list[Any]]]:
    """Number a batch inside the adapter's write transaction (shared by every adapter).

    Events already stored keep their sequence; the rest continue each execution's
    sequence (``last_sequence(execution_id)`` is asked once per execution). Returns
    the rows to insert, the last sequence per execution and the executions-index
    updates ``{id: [playbook, status, finished_at, parent, started_at]}``. Without ``encode`` a row
    ends with the Event itself instead of its JSON body (the caller encodes it its own way)."""
    next_seq: dict[str, int] = {}
    rows: list[tuple[Any, ...]] = []
    exec_updates: dict[str, list[Any]] = {}
    for ev in events:
        if ev.event_id in existing:
            ev.sequence = existing[ev.event_id]
            continue
        eid = ev.execution_id
        if eid not in next_seq:
            next_seq[eid] = last_sequence(eid)
        next_seq[eid] += 1
        ev.sequence = next_seq[eid]
        existing[ev.event_id] = ev.sequence
        rows.append(
            (ev.event_id, eid, ev.sequence, ev.name, ev.timestamp, dumps(ev.to_stored()) if encode else ev)
        )
        upd = exec_updates.get(eid)
        if upd is None:
            upd = exec_updates[eid] = [None, None, None, ev.parent_execution_id, ev.timestamp]
        if ev.name not in _EXECUTION_EVENTS:
            continue
        pb, status, fin = _execution_update(ev)
        if pb:
            upd[0] = pb
        if status:
            upd[1] = status
        if fin:
            upd[2] = fin
    return rows, next_seq, exec_updates


def chain_rows(rows: Sequence[tuple[Any, ...]], heads: dict[str, bytes | None]) -> list[bytes]:
    """The chain hash (engine/chain.py) of each new row of ``sequence_batch(encode=False)``, in the
    adapter's write transaction: ``heads`` holds each execution's stored head (None: none yet) and is
    left at the new heads."""
    out: list[bytes] = []
    for r in rows:
        eid = r[1]
        h = heads[eid] = event_link(heads.get(eid) or GENESIS, r[2], r[5])
        out.append(h)
    return out


def segment_chain(
    events: Sequence[tuple[int, Event]], execution_id: str, seq_first: int, seq_last: int,
    marks: bytes | None, head: bytes | None, mark_bytes: int,
) -> list[tuple[int, Event | None, bytes | None]]:  # fmt: skip
    """A decoded segment's positions for ``check_chain``: every sequence it covers (None where an
    item did not decode), with its stored mark, the last one with the full head."""
    by_seq = {ev.sequence: ev for _g, ev in events}
    out: list[tuple[int, Event | None, bytes | None]] = []
    for i, seq in enumerate(range(seq_first, seq_last + 1)):
        stored = (
            head if seq == seq_last else (marks[i * mark_bytes : (i + 1) * mark_bytes] if marks else None)
        )
        out.append((seq, by_seq.get(seq), stored))
    return out


def event_key(event_id: str) -> bytes:
    """The 16 bytes ``noetl_event_key`` indexes an event id by (idempotent appends): a UUID's own
    bytes (uuid7 ids are time-ordered, so new keys land at the end of the B-tree and a commit
    dirties few pages), else a 16-byte digest of the id."""
    s = str(event_id)
    if len(s) == 36 and s[8] == s[13] == s[18] == s[23] == "-" and s == s.lower():  # one spelling per key
        try:
            return bytes.fromhex(s.replace("-", ""))
        except ValueError:
            pass
    return hashlib.blake2b(s.encode("utf-8", "surrogatepass"), digest_size=16).digest()


# The columns of a segment body: every envelope field but the two the segment row holds
# (execution_id; sequence = seq_first + position). One list per field, in event order.
_SEGMENT_COLUMNS = ("event_id", "timestamp", "name", "data", "status", "entity_id", "step", "step_run_id",
                    "task_run_id", "loop_id", "iteration", "attempt", "parent_execution_id", "tenant_id",
                    "project_id", "source", "entity", "schema_version")  # fmt: skip
_SEGMENT_DEFAULTS = {
    "status": "success",
    "tenant_id": "default",
    "project_id": "default",
    "schema_version": SCHEMA_VERSION,
}
_DERIVED = ("source", "entity")  # derived from the name unless set otherwise
_SEGMENT_FIELDS = attrgetter(*_SEGMENT_COLUMNS)


def encode_segment(events: Sequence[Event], compressor: Any) -> bytes:
    """zstd of a columnar JSON object ``{"n": count, "c": {field: [value per event]}}``: a column
    whose values are all None (or all the default) is left out; ``source``/``entity`` only when some
    event's differs from what its name implies. Columns compress far better than per-event objects
    and cost no dict per event to build."""
    cols: dict[str, list[Any]] = {}
    n = len(events)
    names: tuple[str, ...] = ()
    # one attrgetter call per event, then one tuple per field: a getattr per field and event was
    # most of this function's cost on small events
    for f, vals in zip(_SEGMENT_COLUMNS, zip(*map(_SEGMENT_FIELDS, events), strict=True), strict=False):
        if f == "name":
            names = vals
        if f in _DERIVED:
            if list(vals) == [_implied(f, name) for name in names]:
                continue
        elif f in _SEGMENT_DEFAULTS:
            if vals.count(_SEGMENT_DEFAULTS[f]) == n:
                continue
        elif f == "data":
            if not any(vals):
                continue
        elif vals.count(None) == n:
            continue
        cols[f] = list(vals)
    text = dumps({"n": len(events), "c": cols})
    if len(text) > MAX_EVENT_BYTES:  # rare: find the event over the limit (each is checked before any write)
        for e in events:
            check_event_size(e, len(dumps(e.to_stored())))
    return compressor.compress(text.encode("utf-8", "surrogatepass"))


def _implied(field_name: str, name: str) -> str:
    if field_name == "source":
        return "server" if name in SERVER_EVENTS else "worker"
    return ENTITY_OF.get(name, "workflow")


def _segment_items(doc: Any) -> list[dict[str, Any]]:
    """A decoded segment body as one dict per event (columnar, or a list of stored forms)."""
    if isinstance(doc, list):
        return doc
    n, cols = int(doc["n"]), doc["c"]
    items: list[dict[str, Any]] = [{} for _ in range(n)]
    for f, vals in cols.items():
        if len(vals) != n:
            raise ValueError(f"segment column {f!r} has {len(vals)} values for {n} events")
        for d, v in zip(items, vals, strict=True):
            d[f] = v
    return items


def decode_segment(
    body: bytes, execution_id: str, seq_first: int, gid_first: int, where: str,
    skipped: list[tuple[str, str]] | None = None,
) -> list[tuple[int, Event]]:  # fmt: skip
    """One segment row -> [(gid, Event)], in order; an undecodable segment or item is skipped and reported."""
    try:
        import zstandard  # noqa: PLC0415 - segments only: a short run reads none (issue 35)

        raw = zstandard.ZstdDecompressor().decompress(body)
        try:
            doc = loads(raw)
        except ValueError:  # lone surrogates written by the stdlib fallback (see decode_body)
            doc = _clean(json.loads(raw.decode("utf-8", "surrogatepass")))
        items = _segment_items(doc)
    except Exception as e:  # noqa: BLE001 - a corrupt segment is skipped, never fatal
        msg = f"{type(e).__name__}: {str(e)[:200]}"
        log.warning("skipping undecodable event segment %s: %s", where, msg)
        if skipped is not None:
            skipped.append((where, msg))
        return []
    out: list[tuple[int, Event]] = []
    for i, d in enumerate(items):
        try:
            d["execution_id"], d["sequence"] = execution_id, seq_first + i
            out.append((gid_first + i, Event.from_dict(d)))
        except Exception as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {str(e)[:200]}"
            log.warning("skipping undecodable event row %s#%d: %s", where, i, msg)
            if skipped is not None:
                skipped.append((f"{where}#{i}", msg))
    return out
