"""EventStore on NATS JetStream (hot tier) read through Postgres projections (warm tier), seed 004 §5-6.

URL (docs/configuration.md "Event store")::

    nats://127.0.0.1:4222?projection=<postgresql URL, percent-encoded>&payload=<payload store URL>
        [&region=local][&cell=local-a][&shards=256]

* ``append`` publishes each event to its execution's subject in ``NOETL_EVT_<region>_<shard>`` (the
  shard of its tenant and project) and returns only once the server has acknowledged it. Sequence and
  hash chain (engine/chain.py) are numbered here from the execution's last message; the publish carries
  ``Nats-Expected-Last-Subject-Sequence``, so two processes appending to one execution (Dagster steps)
  cannot both take a number: the loser re-reads the last message and numbers again. ``Nats-Msg-Id``
  is the event id: a re-sent event within the stream's duplicate window is acknowledged as a duplicate
  and keeps its stored sequence.
* reads (``read``, ``tail``, ``executions``) come from the projection the projector process keeps
  (storage/nats_consumers.py). ``read`` of an execution whose newest events the projector has not
  applied yet takes them from the stream (read-your-writes for the running execution).
* leases are session advisory locks in the projection database (a killed holder's lock goes with
  its connection), as the Postgres store's are.
* ``payload``: the payload store the archive consumer writes bundles to (the store itself does not
  use it; consumers opened from the same URL do).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from noetl_dagster.engine.chain import GENESIS, event_link
from noetl_dagster.engine.events import Event
from noetl_dagster.engine.ports import EventStore, ExecutionInfo, StoredEvent
from noetl_dagster.storage.nats_projection import Projection
from noetl_dagster.storage.nats_streams import (
    NatsClient,
    Placement,
    connect,
    decode,
    encode,
    envelope,
    event_of,
    placement_of,
)
from noetl_dagster.storage.pg_leases import AdvisoryLeases
from noetl_dagster.storage.postgres_events import split_schema

WRONG_LAST_SEQUENCE = 10071  # JetStream's err_code when Nats-Expected-Last-Subject-Sequence does not hold
MAX_RENUMBER = 50


@dataclass(frozen=True)
class NatsStoreConfig:
    nats_url: str
    projection_url: str
    payload_url: str | None
    region: str | None
    cell: str | None
    shard_count: int | None

    def placement(self, tenant_id: str, project_id: str) -> Placement:
        return placement_of(
            tenant_id, project_id, region=self.region, cell=self.cell, shard_count=self.shard_count
        )


def parse_nats_url(url: str) -> NatsStoreConfig:
    """The parts of a ``nats://`` event-store URL; ValueError naming what is missing or unknown."""
    parts = urlsplit(url)
    if parts.scheme not in ("nats", "tls"):
        raise ValueError(f"not a NATS event store URL: {url.split('://')[0]}://...")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(query) - {"projection", "payload", "region", "cell", "shards"})
    if unknown:
        raise ValueError(f"NATS event store URL: unknown parameter(s) {', '.join(unknown)} "
                         "(known: projection, payload, region, cell, shards)")  # fmt: skip
    projection = query.get("projection") or ""
    if not projection.startswith(("postgresql://", "postgres://")):
        raise ValueError(
            "NATS event store URL needs projection=<postgresql://... percent-encoded> (the warm tier it reads from)"
        )
    shards = query.get("shards")
    if shards is not None and not shards.isdigit():
        raise ValueError(f"NATS event store URL: shards={shards!r} is not a number")
    return NatsStoreConfig(
        nats_url=urlunsplit((parts.scheme, parts.netloc, "", "", "")),
        projection_url=projection,
        payload_url=query.get("payload") or None,
        region=query.get("region") or None,
        cell=query.get("cell") or None,
        shard_count=int(shards) if shards else None,
    )


@dataclass
class _Head:
    """What this process knows of an execution's end in the stream."""

    placement: Placement
    subject: str
    stream_seq: int = 0  # the execution subject's last stream sequence (0: none)
    sequence: int = 0
    hash: bytes | None = None
    recent: dict[int, int] = field(default_factory=dict)  # sequence -> stream sequence, this process' appends


class NatsEventStore(EventStore):
    def __init__(self, url: str, *, client: NatsClient | None = None, projection: Projection | None = None):
        self.url = url
        self.config = parse_nats_url(url)
        self.client = client or connect(self.config.nats_url)
        try:
            self.projection = projection or Projection(self.config.projection_url)
        except Exception:
            self.client.close()
            raise
        self._heads: dict[str, _Head] = {}
        self._lock = threading.Lock()
        self._leases = AdvisoryLeases(split_schema(self.config.projection_url)[0], self.projection.schema)

    # -- append (hot tier) ---------------------------------------------------------------------------

    def append(self, events: Sequence[Event]) -> list[Event]:
        if not events:
            return []
        with self._lock:  # one numbering at a time in this process (other processes: expected-last-seq)
            self.client.call(self._append(events), timeout=60)
        return list(events)

    async def _append(self, events: Sequence[Event]) -> None:
        from nats.js.errors import BadRequestError  # noqa: PLC0415

        js = self.client.js
        for ev in events:
            for _ in range(MAX_RENUMBER):
                head = self._heads.get(ev.execution_id) or await self._load_head(ev)
                seq = head.sequence + 1
                ev.sequence = seq
                h = event_link(head.hash or GENESIS, seq, ev)
                rec = envelope(ev, head.placement)
                rec["hash"] = h.hex()
                headers = {
                    "Nats-Msg-Id": ev.event_id,
                    "Nats-Expected-Last-Subject-Sequence": str(head.stream_seq),
                }
                try:
                    ack = await js.publish(head.subject, encode(rec), stream=head.placement.events_stream,
                                           headers=headers)  # fmt: skip
                except BadRequestError as e:
                    if e.err_code != WRONG_LAST_SEQUENCE:
                        raise
                    self._heads.pop(ev.execution_id, None)  # another writer appended: number again
                    continue
                if ack.duplicate:  # already stored: keep its number
                    stored = await js.get_msg(head.placement.events_stream, ack.seq)
                    ev.sequence = decode(stored.data)["sequence"]
                    if ack.seq > head.stream_seq:
                        self._heads.pop(ev.execution_id, None)
                    break
                head.stream_seq, head.sequence, head.hash = ack.seq, seq, h
                head.recent[seq] = ack.seq
                if len(head.recent) > 4096:
                    head.recent.pop(next(iter(head.recent)))
                break
            else:
                raise RuntimeError(f"execution {ev.execution_id}: could not number an event after "
                                   f"{MAX_RENUMBER} tries (writers racing)")  # fmt: skip

    async def _load_head(self, ev: Event) -> _Head:
        from nats.js.errors import NotFoundError  # noqa: PLC0415

        placement = self.config.placement(ev.tenant_id, ev.project_id)
        await self.client.ensure_streams_async(placement)
        subject = placement.event_subject(ev.tenant_id, ev.project_id, ev.execution_id)
        head = _Head(placement, subject)
        try:
            last = await self.client.js.get_last_msg(placement.events_stream, subject)
            rec = decode(last.data)
            head.stream_seq, head.sequence = last.seq, int(rec["sequence"])
            head.hash = bytes.fromhex(rec["hash"]) if rec.get("hash") else None
        except NotFoundError:  # a new execution, or one whose stream range retention evicted
            known = self.projection.locate(ev.execution_id)
            if known is not None and known[4]:
                chained = self.projection.read_chained(ev.execution_id)
                head.sequence = known[4]
                head.hash = chained[-1][2] if chained else None
        self._heads[ev.execution_id] = head
        return head

    # -- reads (warm tier, stream for what it has not applied yet) -----------------------------------

    def read(self, execution_id: str, after_sequence: int = 0) -> list[Event]:
        return [e for _s, e, _h in self._merged(execution_id, after_sequence) if e is not None]

    def read_range(self, execution_id: str, after_sequence: int, until_sequence: int) -> list[Event]:
        return [e for e in self.read(execution_id, after_sequence) if (e.sequence or 0) <= until_sequence]

    def read_chained(self, execution_id: str) -> list[tuple[int, Event | None, bytes | None]]:
        return self._merged(execution_id, 0)

    def _merged(self, execution_id: str, after: int) -> list[tuple[int, Event | None, bytes | None]]:
        """The projected events, completed from the stream where the projection has not caught up
        (its tail, or a hole a projector restart has not refilled yet)."""
        rows = self.projection.read_chained(execution_id, after)
        contiguous = all(r[0] == after + i + 1 for i, r in enumerate(rows))
        last = rows[-1][0] if rows and contiguous else after
        extra = self._unprojected_records(execution_id, last)
        if not extra:
            return rows
        merged = {r[0]: r for r in rows}
        for r in extra:
            merged.setdefault(r[0], r)
        return [merged[k] for k in sorted(merged)]

    def _unprojected_records(self, execution_id: str, after: int) -> list[tuple[int, Event, bytes | None]]:
        """Events of the execution numbered after ``after`` that are in the stream (not projected yet)."""
        head = self._heads.get(execution_id)
        if head is not None and head.sequence <= after:
            return []
        # what the database knows is asked here, not on the client's loop (it would stall every caller)
        known = self.projection.locate(execution_id) if head is None else None
        start = head.recent.get(after + 1) if head is not None else None
        if start is None and after:
            start = self.projection.stream_seq_of(execution_id, after)
            start = start + 1 if start else None
        return self.client.call(self._stream_after(execution_id, after, head, known, start or 1), timeout=60)

    async def _stream_after(
        self, execution_id: str, after: int, head: _Head | None, known: tuple[str, str, str, str, int] | None,
        start: int,
    ) -> list[tuple[int, Event, bytes | None]]:  # fmt: skip
        from nats.js.errors import NotFoundError  # noqa: PLC0415

        js = self.client.js
        where = await self._locate(execution_id, head, known)
        if where is None:
            return []
        stream, subject = where
        if head is None:  # one round trip tells whether the stream has anything past ``after``
            try:
                last = await js.get_last_msg(stream, subject)
            except NotFoundError:
                return []
            if int(decode(last.data)["sequence"]) <= after:
                return []
        out: list[tuple[int, Event, bytes | None]] = []
        seq = start
        while True:
            try:
                msg = await js.get_msg(stream, seq, next=True, subject=subject)
            except NotFoundError:
                return out
            rec = decode(msg.data)
            if int(rec["sequence"]) > after:
                h = rec.get("hash")
                out.append((int(rec["sequence"]), event_of(rec), bytes.fromhex(h) if h else None))
            seq = msg.seq + 1

    async def _locate(
        self, execution_id: str, head: _Head | None, known: tuple[str, str, str, str, int] | None
    ) -> tuple[str, str] | None:
        """(stream, subject) of an execution: this process' head, the projection, else a scan
        of the region's event streams (an execution another process started and nothing projected)."""
        if head is not None:
            return head.placement.events_stream, head.subject
        if known is not None:  # where the projector saw it (its region and shard, not recomputed)
            p = Placement(region=known[2], cell=f"{known[2]}-a", shard=known[3])
            return p.events_stream, p.event_subject(known[0], known[1], execution_id)
        region = self.config.region or placement_of("default", "default").region
        prefix = f"NOETL_EVT_{region}_"
        for name in await self.client.event_stream_names(region):
            probe = Placement(region=region, cell=f"{region}-a", shard=name[len(prefix) :])
            found = await self.client.js.stream_info(
                name, subjects_filter=probe.execution_filter(execution_id)
            )
            if found.state.subjects:
                return name, next(iter(found.state.subjects))
        return None

    def summary(self, execution_id: str) -> tuple[int, list[tuple[int, Any]]] | None:
        return self.projection.summary(execution_id)

    def put_summary(
        self, execution_id: str, after: int | None, last: int, rows: list[tuple[int, str]]
    ) -> bool:
        return self.projection.put_summary(execution_id, after, last, rows)

    def tail(self, after_gid: int = 0, limit: int = 1000) -> list[StoredEvent]:
        return self.projection.tail(after_gid, limit)

    def tail_last(self) -> int:
        return self.projection.tail_last()

    def executions(self, limit: int = 100) -> list[ExecutionInfo]:
        return self.projection.executions(limit)

    # -- leases (projection database) ----------------------------------------------------------------

    def acquire_lease(self, execution_id: str) -> None:
        self._leases.acquire(execution_id)

    def release_lease(self, execution_id: str) -> None:
        self._leases.release(execution_id)

    def close(self) -> None:
        self._leases.release_all()
        self.projection.close()
        self.client.close()

    def __repr__(self) -> str:
        return f"NatsEventStore({self.config.nats_url}, projection schema {self.projection.schema!r})"
