"""The NATS JetStream layout of the event log (seed 004 §4, §5): placement, streams, subjects, envelope.

Shared by the event store (``storage/nats_events.py``), its consumers (projection, archive, retention)
and the command work-queue. Everything here is deterministic from tenant and project:

* placement: ``region`` (``$NOETL_REGION``, default ``local``), ``cell`` (``$NOETL_CELL``, default
  ``<region>-a``) and the logical shard ``s0000``..``s<N-1>`` = sha256(tenant, project[, affinity])
  mod ``$NOETL_SHARD_COUNT`` (default 256). The hash is stable across processes and releases
  (unlike ``hash()``), so every writer and consumer agrees on a tenant's streams.
* streams per region and shard: ``NOETL_EVT_<region>_<shard>`` (append-only events),
  ``NOETL_CMD_<region>_<shard>`` (work queue), ``NOETL_DLQ_<region>_<shard>`` (dead letters),
  ``NOETL_ARCHIVE_ACK_<region>_<shard>`` (archive progress, the last few per subject).
* subjects: ``noetl.<kind>.<region>.<shard>.<tenant>.<project>.<rest>``; tenant, project and the rest
  are escaped into one subject token each (``token``), so a dot or wildcard in a name never splits
  or widens a subject. Events use one subject per execution (``...evt...<execution_id>``): its
  last-subject sequence orders the execution's appends among concurrent writers.
* envelope: the §5 record around an engine ``Event`` (``envelope`` / ``event_of``); ``payload`` is
  the event's stored form, so ``event_of(envelope(e)) == e``.
* ``connect(url)``: a synchronous facade over nats-py (the EventStore port is synchronous): the
  asyncio client runs on a private loop thread and every call waits for its result.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from noetl_dagster.dsl.locator import ObjectLayout, shard_for, shard_name
from noetl_dagster.engine.events import SCHEMA_VERSION, Event
from noetl_dagster.util.jsonutil import dumps, loads

DEFAULT_URL = "nats://127.0.0.1:4222"
DEFAULT_SHARD_COUNT = 256
ENVELOPE_SCHEMA = SCHEMA_VERSION
# JetStream's dedupe window for Nats-Msg-Id (= event_id): a re-sent event within it is not stored twice
DUPLICATE_WINDOW_S = 600.0
ARCHIVE_ACK_HISTORY = 16  # messages kept per archive-ack subject (the last one is the checkpoint)

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,31}$")
_PLAIN_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


class StreamLayoutError(ValueError):
    """A region, cell or shard that cannot name a stream."""


def _checked(kind: str, value: str) -> str:
    if not _NAME_RE.match(value):
        raise StreamLayoutError(
            f"NATS {kind} {value!r}: use 1-32 letters, digits and '-' (it becomes part of a stream name)"
        )
    return value


def token(value: str) -> str:
    """``value`` as one subject token: letters, digits, '-' and '_' kept; any other byte (the subject
    separators '.', '*', '>', whitespace, and '~' itself) written ``~XX`` (hex). Reversible, so two
    names never share a token; the empty string is ``~``."""
    if not value:
        return "~"
    if _PLAIN_TOKEN.match(value):
        return value
    out = []
    for ch in value:
        if ch.isascii() and (ch.isalnum() or ch in "-_"):
            out.append(ch)
        else:
            out.extend(f"~{b:02X}" for b in ch.encode())
    return "".join(out)


def shard_of(
    tenant_id: str, project_id: str, affinity: str | None = None, shard_count: int | None = None
) -> str:
    """The logical shard of seed §4 (``s0042``): the object layout's own ``shard_for`` (dsl/locator.py),
    so a tenant's streams and its object prefix name the same shard."""
    count = shard_count or int(os.environ.get("NOETL_SHARD_COUNT") or DEFAULT_SHARD_COUNT)
    if not 1 <= count <= 10_000:
        raise StreamLayoutError(f"NATS shard count {count}: use 1..10000")
    return shard_name(shard_for(tenant_id, project_id, affinity or "", shard_count=count))


@dataclass(frozen=True)
class Placement:
    """Where a tenant's project lives: region, cell and shard, and the names derived from them."""

    region: str
    cell: str
    shard: str

    def __post_init__(self) -> None:
        _checked("region", self.region)
        _checked("cell", self.cell)
        _checked("shard", self.shard)

    @property
    def suffix(self) -> str:
        return f"{self.region}_{self.shard}"

    @property
    def events_stream(self) -> str:
        return f"NOETL_EVT_{self.suffix}"

    @property
    def commands_stream(self) -> str:
        return f"NOETL_CMD_{self.suffix}"

    @property
    def dlq_stream(self) -> str:
        return f"NOETL_DLQ_{self.suffix}"

    @property
    def archive_ack_stream(self) -> str:
        return f"NOETL_ARCHIVE_ACK_{self.suffix}"

    def _root(self, kind: str) -> str:
        return f"noetl.{kind}.{self.region}.{self.shard}"

    def event_subject(self, tenant_id: str, project_id: str, execution_id: str) -> str:
        return f"{self._root('evt')}.{token(tenant_id)}.{token(project_id)}.{token(execution_id)}"

    def execution_filter(self, execution_id: str) -> str:
        """Every event of one execution in this shard's stream, whatever its tenant and project."""
        return f"{self._root('evt')}.*.*.{token(execution_id)}"

    def command_subject(self, tenant_id: str, project_id: str, kind: str = "task") -> str:
        return f"{self._root('cmd')}.{token(tenant_id)}.{token(project_id)}.{token(kind)}"

    def dlq_subject(self, tenant_id: str, project_id: str, kind: str = "task") -> str:
        return f"{self._root('dlq')}.{token(tenant_id)}.{token(project_id)}.{token(kind)}"

    def archive_ack_subject(self, consumer: str = "archive") -> str:
        return f"{self._root('archive_ack')}.{token(consumer)}"

    def stream_subjects(self, kind: str) -> list[str]:
        return [f"{self._root(kind)}.>"]

    def object_prefix(self, tenant_id: str, project_id: str, env: str = "dev") -> str:
        """The object-store prefix of seed §4 (the archive adds date and execution)."""
        return ObjectLayout(env=env, region=self.region, cell=self.cell).prefix(tenant_id, project_id)


def default_region() -> str:
    return os.environ.get("NOETL_REGION") or "local"


def placement_of(
    tenant_id: str,
    project_id: str,
    *,
    region: str | None = None,
    cell: str | None = None,
    affinity: str | None = None,
    shard_count: int | None = None,
) -> Placement:
    region = region or default_region()
    return Placement(
        region=region,
        cell=cell or os.environ.get("NOETL_CELL") or f"{region}-a",
        shard=shard_of(tenant_id, project_id, affinity, shard_count),
    )


# -- the §5 envelope ---------------------------------------------------------------------------------


def envelope(
    event: Event,
    placement: Placement,
    *,
    causation_id: str | None = None,
    correlation_id: str | None = None,
) -> dict[str, Any]:
    """The seed §5 record of one engine event. ``causation_id``: what caused it (a command's id when a
    worker reports; default the task run, else the step run). ``correlation_id``: the run it belongs
    to (default the root execution: the parent's id for a sub-playbook, else its own)."""
    return {
        "event_id": event.event_id,
        "event_type": event.name,
        "schema_version": event.schema_version,
        "tenant_id": event.tenant_id,
        "project_id": event.project_id,
        "execution_id": event.execution_id,
        "workflow_id": event.parent_execution_id or event.execution_id,
        "step_id": event.step,
        "task_id": event.task_run_id,
        "region": placement.region,
        "cell": placement.cell,
        "shard": placement.shard,
        "causation_id": causation_id or event.task_run_id or event.step_run_id,
        "correlation_id": correlation_id or event.parent_execution_id or event.execution_id,
        "created_at": event.timestamp,
        "sequence": event.sequence,
        "payload": event.to_stored(),
    }


def event_of(record: Mapping[str, Any]) -> Event:
    """The engine event inside an envelope (its ``payload``)."""
    payload = dict(record["payload"])
    if payload.get("sequence") is None and record.get("sequence") is not None:
        payload["sequence"] = record["sequence"]
    return Event.from_dict(payload)


def encode(record: Mapping[str, Any]) -> bytes:
    return dumps(record).encode()


def decode(data: bytes) -> dict[str, Any]:
    return loads(data)


# -- stream definitions ----------------------------------------------------------------------------


def stream_configs(placement: Placement, *, replicas: int = 1) -> list[dict[str, Any]]:
    """The four streams of a shard, as ``add_stream`` keyword arguments. No max_age or max_bytes on
    the event stream: eviction is the retention controller's, gated by archive status (seed §5)."""
    from nats.js.api import RetentionPolicy, StorageType  # noqa: PLC0415 - the nats extra

    common = {"storage": StorageType.FILE, "num_replicas": replicas}
    return [
        {"name": placement.events_stream, "subjects": placement.stream_subjects("evt"),
         "retention": RetentionPolicy.LIMITS, "duplicate_window": DUPLICATE_WINDOW_S, **common},
        {"name": placement.commands_stream, "subjects": placement.stream_subjects("cmd"),
         "retention": RetentionPolicy.WORK_QUEUE, "duplicate_window": DUPLICATE_WINDOW_S, **common},
        {"name": placement.dlq_stream, "subjects": placement.stream_subjects("dlq"),
         "retention": RetentionPolicy.LIMITS, **common},
        {"name": placement.archive_ack_stream, "subjects": placement.stream_subjects("archive_ack"),
         "retention": RetentionPolicy.LIMITS, "max_msgs_per_subject": ARCHIVE_ACK_HISTORY, **common},
    ]  # fmt: skip


# -- the synchronous client ------------------------------------------------------------------------


class NatsClient:
    """One nats-py connection driven from a private event-loop thread; ``call`` runs a coroutine on it
    and waits. ``nc`` and ``js`` are the nats-py client and JetStream context (use them inside
    coroutines passed to ``call``). Thread-safe: calls from many threads share the connection."""

    def __init__(self, url: str = DEFAULT_URL, *, connect_timeout: float = 5.0, name: str = "noetl"):
        self.url = url
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name=f"{name}-nats")
        self._thread.start()
        self._ensured: set[str] = set()
        try:
            self.call(self._connect(connect_timeout, name), timeout=connect_timeout + 5)
        except Exception as e:
            self._stop()
            raise ConnectionError(f"NATS {url}: {type(e).__name__}: {e}") from None

    async def _connect(self, timeout: float, name: str) -> None:
        import nats  # noqa: PLC0415 - the nats extra

        self.nc = await nats.connect(
            self.url, connect_timeout=timeout, max_reconnect_attempts=60, reconnect_time_wait=0.5, name=name
        )
        self.js = self.nc.jetstream()

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float | None = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def ensure_streams(self, placement: Placement, *, replicas: int = 1) -> None:
        """Create the shard's streams when missing (idempotent; cached per process)."""
        if placement.suffix in self._ensured:
            return
        self.call(self._ensure(placement, replicas))
        self._ensured.add(placement.suffix)

    async def ensure_streams_async(self, placement: Placement, *, replicas: int = 1) -> None:
        """``ensure_streams`` from a coroutine on this client's loop."""
        if placement.suffix not in self._ensured:
            await self._ensure(placement, replicas)
            self._ensured.add(placement.suffix)

    async def _ensure(self, placement: Placement, replicas: int) -> None:
        from nats.js.errors import NotFoundError  # noqa: PLC0415

        for cfg in stream_configs(placement, replicas=replicas):
            try:
                await self.js.stream_info(cfg["name"])
            except NotFoundError:
                try:
                    await self.js.add_stream(**cfg)
                except Exception:  # noqa: BLE001 - another process created it meanwhile
                    await self.js.stream_info(cfg["name"])

    async def event_stream_names(self, region: str) -> list[str]:
        """The region's event streams (``NOETL_EVT_<region>_*``), every page of JetStream's name list."""
        prefix, out, offset = f"NOETL_EVT_{region}_", [], 0
        while True:
            req = encode({"offset": offset, "subject": f"noetl.evt.{region}.>"})
            resp = decode((await self.nc.request("$JS.API.STREAM.NAMES", req, timeout=10)).data)
            if "error" in resp:
                raise ConnectionError(f"NATS stream names: {resp['error'].get('description')}")
            names = resp.get("streams") or []
            out += [n for n in names if n.startswith(prefix)]
            offset += len(names)
            if not names or offset >= int(resp.get("total") or 0):
                return sorted(out)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            if getattr(self, "nc", None) is not None and not self.nc.is_closed:
                self.call(self.nc.close(), timeout=5)
        except Exception:  # noqa: BLE001 - closing a dead connection
            pass
        self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> NatsClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def connect(url: str | None = None, **kw: Any) -> NatsClient:
    """A synchronous NATS client (``$NOETL_NATS_URL``, default ``nats://127.0.0.1:4222``)."""
    return NatsClient(url or os.environ.get("NOETL_NATS_URL") or DEFAULT_URL, **kw)
