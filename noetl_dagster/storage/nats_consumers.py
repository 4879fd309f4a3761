"""The consumers of the NATS event streams (seed 004 §5-7): one process per kind, each restartable.

* ``Projector`` (warm tier): a durable pull consumer per shard (``proj_<name>``, ack-all) feeding
  ``Projection.apply``: a batch's ledger, projections and checkpoint commit in one transaction, then
  the batch is acknowledged. Killed before the commit: nothing of the batch stays and it is delivered
  again. Killed after it: delivered again, and the ledger skips every event.
* ``Archiver`` (cold tier): reads the stream from its last archive checkpoint, gathers each execution
  from its first event, and when a root execution's ``playbook.processed`` (its last event) arrives writes its bundle
  (storage/archive.py: segments, manifest, signature) to the payload store, then publishes its progress
  to ``NOETL_ARCHIVE_ACK_<region>_<shard>``: ``archived_through`` is the highest stream sequence below
  which every event belongs to an archived execution.
* ``Retention`` (the controller): evicts the stream below ``eviction_bound`` (pure, see there).
* ``rebuild``: a projection from the stream, or from the archive bundles alone.

Fault injection for the tests: ``$NOETL_PROJECTOR_STALL`` = ``in_txn:<s>`` or ``before_ack:<s>``
sleeps at that point of every projector batch, ``archived:<s>`` in the archiver after it wrote a batch's
bundles, before it publishes its progress (tests/storage/test_nats_faults.py kills the process there).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from noetl_dagster.engine.chain import GENESIS, event_link
from noetl_dagster.engine.events import PLAYBOOK_PROCESSED, Event
from noetl_dagster.engine.ports import EventStore, ExecutionInfo, StoredEvent
from noetl_dagster.storage.nats_events import NatsStoreConfig, parse_nats_url
from noetl_dagster.storage.nats_projection import STATE, Projection
from noetl_dagster.storage.nats_streams import (
    NatsClient,
    Placement,
    connect,
    decode,
    encode,
    envelope,
    event_of,
)

ARCHIVE = "archive"
log = logging.getLogger(__name__)


def _stall(stage: str) -> None:
    spec = os.environ.get("NOETL_PROJECTOR_STALL", "")
    if spec.startswith(stage + ":"):
        time.sleep(float(spec.split(":", 1)[1]))


def _pull(client: NatsClient, placement: Placement, durable: str | None, start_seq: int | None = None) -> Any:
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy  # noqa: PLC0415

    subject = placement.stream_subjects("evt")[0]
    start = {"deliver_policy": DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": max(1, start_seq or 1)}
    if durable is not None:
        cfg = ConsumerConfig(durable_name=durable, ack_policy=AckPolicy.ALL, ack_wait=30, max_ack_pending=-1,
                             filter_subject=subject, **start)  # fmt: skip
    else:
        cfg = ConsumerConfig(
            ack_policy=AckPolicy.NONE, inactive_threshold=30, filter_subject=subject, **start
        )
    return client.call(
        client.js.pull_subscribe(subject, durable=durable, stream=placement.events_stream, config=cfg)
    )


def _fetch(client: NatsClient, sub: Any, batch: int, timeout: float) -> list[Any]:
    from nats.errors import TimeoutError as NatsTimeout  # noqa: PLC0415

    try:
        return client.call(sub.fetch(batch, timeout=timeout), timeout=timeout + 30)
    except (NatsTimeout, TimeoutError):  # nothing arrived in time (nats-py raises either)
        return []


class Projector:
    """The projection consumer of some shards (``run`` until stopped; ``drain`` until caught up).

    The checkpoint committed with the projections is the truth: at start (and after a failed batch)
    the durable consumer is created again from ``checkpoint + 1``, so events are applied in stream
    order even when a killed process left a batch unacknowledged (JetStream would redeliver it only
    after ``ack_wait``, behind newer ones). One projector per shard and projection name."""

    def __init__(self, url: str, placements: Sequence[Placement], *, name: str = STATE, batch: int = 256):
        self.config: NatsStoreConfig = parse_nats_url(url)
        self.client = connect(self.config.nats_url, name=f"noetl-projector-{name}")
        self.projection = Projection(self.config.projection_url)
        self.name, self.batch, self.placements = name, batch, list(placements)
        self._subs: dict[str, Any] = {}
        for p in self.placements:
            self.client.ensure_streams(p)
            self._subscribe(p)

    def _subscribe(self, p: Placement) -> None:
        from nats.js.errors import NotFoundError  # noqa: PLC0415

        durable = f"proj_{self.name}"
        old = self._subs.pop(p.suffix, None)
        if old is not None:
            self.client.call(old.unsubscribe())
        try:
            self.client.call(self.client.js.delete_consumer(p.events_stream, durable))
        except NotFoundError:
            pass
        start = self.projection.checkpoint(self.name, p.region, p.shard, p.events_stream) + 1
        self._subs[p.suffix] = _pull(self.client, p, durable, start)

    def step(self, timeout: float = 1.0) -> int:
        """One batch per shard; the number of messages handled."""
        handled = 0
        for p in self.placements:
            msgs = _fetch(self.client, self._subs[p.suffix], self.batch, timeout)
            if not msgs:
                continue
            items = [(m.metadata.sequence.stream, decode(m.data)) for m in msgs]
            try:
                self.projection.apply(
                    items, name=self.name, stream=p.events_stream, hook=lambda: _stall("in_txn")
                )
            except Exception:
                self._subscribe(p)  # from the checkpoint again: nothing after a failed batch goes first
                raise
            _stall("before_ack")
            self.client.call(msgs[-1].ack_sync())  # ack-all: the whole batch
            handled += len(msgs)
        return handled

    def drain(self, idle_timeout: float = 0.5) -> int:
        total = 0
        while n := self.step(idle_timeout):
            total += n
        return total

    def run(self, stop: Callable[[], bool] = lambda: False) -> None:
        while not stop():
            try:
                self.step(1.0)
            except Exception as e:  # noqa: BLE001 - the database or server away: retry from the checkpoint
                log.warning("projector %s: %s: %s (retrying)", self.name, type(e).__name__, e)
                time.sleep(1.0)

    def close(self) -> None:
        self.projection.close()
        self.client.close()


# -- cold tier --------------------------------------------------------------------------------------


@dataclass
class _Gathered:
    first_seq: int
    parent: str | None
    records: list[dict[str, Any]] = field(default_factory=list)


class _GatheredStore(EventStore):
    """The executions the archiver gathered, as the EventStore ``archive_execution`` reads."""

    url = "nats-archiver://"

    def __init__(self, gathered: dict[str, _Gathered]):
        self._g = gathered

    def append(self, events: Sequence[Event]) -> list[Event]:
        raise NotImplementedError("read-only")

    def read(self, execution_id: str, after_sequence: int = 0) -> list[Event]:
        return [
            e for _s, e, _h in self.read_chained(execution_id) if e and (e.sequence or 0) > after_sequence
        ]

    def read_chained(self, execution_id: str) -> list[tuple[int, Event | None, bytes | None]]:
        g = self._g.get(execution_id)
        if g is None:
            return []
        return [(int(r["sequence"]), event_of(r), bytes.fromhex(r["hash"]) if r.get("hash") else None)
                for r in g.records]  # fmt: skip

    def tail(self, after_gid: int = 0, limit: int = 1000) -> list[StoredEvent]:
        return []

    def tail_last(self) -> int:
        return 0

    def executions(self, limit: int = 100) -> list[ExecutionInfo]:
        return [
            ExecutionInfo(eid, None, "", None, None, g.parent, len(g.records)) for eid, g in self._g.items()
        ]


class Archiver:
    """The archive consumer of one shard."""

    def __init__(self, url: str, placement: Placement, *, payload_url: str | None = None, batch: int = 512):
        self.config = parse_nats_url(url)
        self.payload_url = payload_url or self.config.payload_url
        if not self.payload_url:
            raise ValueError(
                "the archiver needs a payload store: payload=<URL> in the NATS URL, or --payload"
            )
        self.client = connect(self.config.nats_url, name="noetl-archiver")
        self.placement, self.batch = placement, batch
        self.client.ensure_streams(placement)
        self.projection = Projection(self.config.projection_url)
        ack = self.last_ack()
        self.archived_through = int(ack.get("archived_through", 0))
        self._pending: dict[str, _Gathered] = {}
        self._sub = _pull(self.client, placement, None, self.archived_through + 1)
        self.scanned_through = self.archived_through
        self.archived: list[dict[str, Any]] = []

    def last_ack(self) -> dict[str, Any]:
        return last_archive_ack(self.client, self.placement)

    def step(self, timeout: float = 1.0) -> int:
        msgs = _fetch(self.client, self._sub, self.batch, timeout)
        done: list[dict[str, Any]] = []
        for m in msgs:
            seq = m.metadata.sequence.stream
            self.scanned_through = max(self.scanned_through, seq)
            rec = decode(m.data)
            eid = rec["execution_id"]
            g = self._pending.get(eid)
            if g is None:
                if int(rec["sequence"]) != 1:
                    continue  # its start is below the checkpoint: archived already (a rescan after restart)
                g = self._pending[eid] = _Gathered(seq, rec["payload"].get("parent_execution_id"))
            g.records.append(rec)
            if rec["event_type"] == PLAYBOOK_PROCESSED and g.parent is None:  # the last event of a run
                done.append(self._archive(eid))
        if msgs:
            if done:
                _stall("archived")  # bundles written, progress not yet published
            self._publish_progress(done)
        return len(msgs)

    def _archive(self, execution_id: str) -> dict[str, Any]:
        from noetl_dagster.storage.archive import archive_execution  # noqa: PLC0415

        manifest = archive_execution(execution_id, _GatheredStore(self._pending), self.payload_url)
        for eid in [execution_id, *self._descendants(execution_id)]:
            self._pending.pop(eid, None)
        self.projection.index_archive(manifest, self.placement.region, self.placement.shard)
        uri = manifest["uri"]
        self.archived.append({"execution_id": execution_id, "uri": uri, "status": manifest["status"]})
        return {"execution_id": execution_id, "manifest": uri}

    def _descendants(self, execution_id: str) -> list[str]:
        out, frontier = [], [execution_id]
        while frontier:
            parent = frontier.pop()
            kids = [eid for eid, g in self._pending.items() if g.parent == parent]
            out.extend(kids)
            frontier.extend(kids)
        return out

    def _advance(self) -> int:
        """archived_through: below the first event of every execution not archived yet."""
        low = min((g.first_seq for g in self._pending.values()), default=self.scanned_through + 1)
        self.archived_through = max(self.archived_through, low - 1)
        return self.archived_through

    def _publish_progress(self, done: list[dict[str, Any]]) -> None:
        self._advance()
        body = {"archived_through": self.archived_through, "scanned_through": self.scanned_through,
                "archived": done, "at": datetime.now(UTC).isoformat()}  # fmt: skip
        self.client.call(self.client.js.publish(self.placement.archive_ack_subject(), encode(body),
                                                stream=self.placement.archive_ack_stream))  # fmt: skip

    def drain(self, idle_timeout: float = 0.5) -> int:
        total = 0
        while n := self.step(idle_timeout):
            total += n
        return total

    def close(self) -> None:
        self.projection.close()
        self.client.close()


def last_archive_ack(client: NatsClient, placement: Placement) -> dict[str, Any]:
    from nats.js.errors import NotFoundError  # noqa: PLC0415

    try:
        msg = client.call(
            client.js.get_last_msg(placement.archive_ack_stream, placement.archive_ack_subject())
        )
    except NotFoundError:
        return {}
    return decode(msg.data)


# -- retention -------------------------------------------------------------------------------------


def eviction_bound(
    archived_through: int, checkpoints: Iterable[int], age_bound: int, active_first_seq: int | None
) -> int:
    """The highest stream sequence that may be evicted (0: none), seed 004 §5: archived, passed by every
    required projection, older than the minimum age, and below the first event of every execution still
    running. Each input is an upper bound; a missing checkpoint counts as 0."""
    bound = min(archived_through, age_bound, *(list(checkpoints) or [0]))
    if active_first_seq is not None:
        bound = min(bound, active_first_seq - 1)
    return max(bound, 0)


class Retention:
    """The retention controller of one shard: ``enforce`` evicts what ``eviction_bound`` allows."""

    def __init__(
        self, url: str, placement: Placement, *, min_age_s: float, required: Sequence[str] = (STATE,)
    ):
        self.config = parse_nats_url(url)
        self.client = connect(self.config.nats_url, name="noetl-retention")
        self.projection = Projection(self.config.projection_url)
        self.placement, self.min_age_s, self.required = placement, min_age_s, list(required)
        self.client.ensure_streams(placement)

    def bound(self) -> dict[str, Any]:
        p, stream = self.placement, self.placement.events_stream
        state = self.client.call(self.client.js.stream_info(stream)).state
        archived = int(last_archive_ack(self.client, p).get("archived_through", 0))
        checkpoints = [self.projection.checkpoint(n, p.region, p.shard, stream) for n in self.required]
        age = self._age_bound(state.first_seq, state.last_seq)
        active = self.projection.active_first_seq(p.region, p.shard)
        return {"first_seq": state.first_seq, "last_seq": state.last_seq, "archived_through": archived,
                "checkpoints": dict(zip(self.required, checkpoints, strict=True)), "age_bound": age,
                "active_first_seq": active, "bound": eviction_bound(archived, checkpoints, age, active)}  # fmt: skip

    def _age_bound(self, first: int, last: int) -> int:
        """The last sequence stored at least ``min_age_s`` ago (binary search on message times)."""
        cutoff = time.time() - self.min_age_s
        lo, hi, best = first, last, first - 1
        while lo <= hi and last > 0:
            mid = (lo + hi) // 2
            t = self._time_at(mid)
            if t is None or t <= cutoff:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        return max(best, 0)

    def _time_at(self, seq: int) -> float | None:
        from nats.js.errors import NotFoundError  # noqa: PLC0415

        try:
            msg = self.client.call(self.client.js.get_msg(self.placement.events_stream, seq, next=True))
        except NotFoundError:
            return None
        return msg.time.timestamp() if msg.time else None

    def enforce(self) -> dict[str, Any]:
        b = self.bound()
        if b["bound"] >= b["first_seq"] > 0:
            self.client.call(self.client.js.purge_stream(self.placement.events_stream, seq=b["bound"] + 1))
            b["evicted_through"] = b["bound"]
        return b

    def close(self) -> None:
        self.projection.close()
        self.client.close()


# -- rebuild ---------------------------------------------------------------------------------------


def rebuild_from_stream(url: str, placement: Placement, *, name: str = STATE, reset: bool = True) -> int:
    """Refill a projection from what the shard's stream holds (from its first sequence)."""
    config = parse_nats_url(url)
    projection = Projection(config.projection_url)
    try:
        projection.recreate()
        if reset:
            projection.reset(name)
        with connect(config.nats_url, name="noetl-rebuild") as client:
            sub = _pull(client, placement, None, 1)
            total = 0
            while msgs := _fetch(client, sub, 1024, 0.5):
                items = [(m.metadata.sequence.stream, decode(m.data)) for m in msgs]
                projection.apply(items, name=name, stream=placement.events_stream)
                total += len(items)
                if msgs[-1].metadata.num_pending == 0:
                    break
        return total
    finally:
        projection.close()


def rebuild_from_archive(
    url: str, bundle_uris: Iterable[str], *, name: str = STATE, reset: bool = True
) -> int:
    """Refill a projection from archive bundles alone (verified: checksums, signature, hash chains).
    The envelope fields an archive does not keep (region, cell, shard) follow from tenant and project,
    the chain hashes from the events themselves."""
    from noetl_dagster.storage.archive import read_archive_events  # noqa: PLC0415

    config = parse_nats_url(url)
    projection = Projection(config.projection_url)
    try:
        projection.recreate()
        if reset:
            projection.reset(name)
        total = 0
        for uri in bundle_uris:
            _manifest, events = read_archive_events(uri)
            items = [(None, r) for r in chained_records(events, config)]
            projection.apply(items, name=name)
            total += len(items)
        return total
    finally:
        projection.close()


def chained_records(events: Sequence[Event], config: NatsStoreConfig) -> list[dict[str, Any]]:
    """Envelopes of stored events with their chain hashes recomputed (per execution, in sequence order)."""
    heads: dict[str, bytes] = {}
    out = []
    for ev in sorted(events, key=lambda e: (e.execution_id, e.sequence or 0)):
        h = heads[ev.execution_id] = event_link(heads.get(ev.execution_id, GENESIS), ev.sequence or 0, ev)
        rec = envelope(ev, config.placement(ev.tenant_id, ev.project_id))
        rec["hash"] = h.hex()
        out.append(rec)
    return out


def archive_bundles(payload_url: str) -> list[str]:
    """Every bundle (its directory URI) under a payload store: the archive's own listing."""
    from noetl_dagster.storage.payload import open_payload_store  # noqa: PLC0415

    store = open_payload_store(payload_url)
    return sorted(
        uri[: -len("manifest.json")] for uri in store.list("noetl/") if uri.endswith("/manifest.json")
    )
