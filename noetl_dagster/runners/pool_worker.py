"""A pool worker (seed 004 H.10's pull model): pulls commands from JetStream and runs their tool kinds.

``noetl-dagster worker`` runs one or more of these processes. Each binds the shared durable pull
consumer (:data:`~noetl_dagster.tools.command_queue.WORKERS_DURABLE`) of the command streams of its
region (every ``NOETL_CMD_<region>_*`` stream, or the shards it is given), so adding a process adds
capacity; the work-queue stream hands each command to one of them.

For one delivered command (``handle``): past its deadline it is dropped; on its delivery number
``max_deliver + 1`` it is dead-lettered (``NOETL_DLQ_<region>_<shard>``, an error reply, a
``command.cancelled`` event); a command the execution's log shows finished is answered from the log
and acked without running (command_queue module docstring: effect once); else the kind runs (a
heartbeat of in-progress acks keeps the message while it does), ``command.done`` is appended to the
log, the reply published and the message acked. A failure of the worker's own plumbing (the event
store unreachable) NAKs the message with a delay growing with its deliveries (another worker, or
this one later, takes it again). SIGTERM stops the pulls and lets the calls in flight finish.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from noetl_dagster.engine.recorder import Redactor
from noetl_dagster.storage import nats_streams as streams
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.tools.command_queue import (
    DEFAULT_MAX_DELIVER,
    MAX_RESULT_BYTES,
    WORKERS_DURABLE,
    Command,
    cancelled_event,
    done_event,
    error_reply,
    recorded,
)
from noetl_dagster.tools.registry import ToolError
from noetl_dagster.tools.remote_call import RemoteContext, call_as_reply
from noetl_dagster.util.jsonutil import dumps

FETCH_WAIT_S = 1.0
DISCOVER_EVERY_S = 10.0  # a region's new shard streams are bound this often
MAX_NAK_DELAY_S = 30.0


def nak_delay(delivered: int) -> float:
    """Backoff of a NAKed command: 1, 2, 4, … seconds by its delivery count, at most 30 s."""
    return min(float(2 ** max(0, delivered - 1)), MAX_NAK_DELAY_S)


class PoolWorker:
    """One worker process' loop. ``run`` returns when ``stop`` is set and the calls in flight ended."""

    def __init__(
        self,
        nats_url: str,
        event_store: Any,
        *,
        region: str | None = None,
        shards: Iterable[str] = (),
        concurrency: int = 1,
        ack_wait: float = 30.0,
        max_deliver: int = DEFAULT_MAX_DELIVER,
        data_dir: str | os.PathLike[str] | None = None,
        worker_id: str | None = None,
        log: Callable[[str], None] | None = None,
    ):
        if concurrency < 1:
            raise ValueError("--concurrency must be at least 1")
        if ack_wait < 1:
            raise ValueError("--ack-wait must be at least 1 second")
        self.region = region or streams.default_region()
        self.shards = sorted(set(shards))
        self.concurrency = concurrency
        self.ack_wait = ack_wait
        self.max_deliver = max_deliver
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
        self.log = log or (lambda line: None)
        self.data_dir = Path(data_dir or os.environ.get("NOETL_DAGSTER_HOME", ".noetl"))
        self.store = event_store if not isinstance(event_store, (str, type(None))) else open_event_store(
            event_store, data_dir=self.data_dir)  # fmt: skip
        self.client = streams.connect(nats_url, name="noetl-worker")
        self.stop = threading.Event()
        self.counts = {"ran": 0, "answered_from_log": 0, "dropped": 0, "dead_lettered": 0, "nak": 0}
        self._subs: dict[str, Any] = {}
        self._inflight: dict[int, Any] = {}
        self._inflight_lock = threading.Lock()
        self._slots = threading.Semaphore(concurrency)
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="noetl-pool")
        self._payloads: Any = None

    # -- binding the command streams ------------------------------------------------------------
    def bind(self) -> list[str]:
        """Bind the shared consumer of every command stream this worker serves; the new stream names."""
        if self.shards:  # named shards: their streams are made when missing (the dispatcher does the same)
            for shard in self.shards:
                self.client.ensure_streams(streams.Placement(self.region, f"{self.region}-a", shard))
        names = [f"NOETL_CMD_{self.region}_{s}" for s in self.shards] if self.shards else self._streams()
        new = [n for n in names if n not in self._subs]
        for name in new:
            self._subs[name] = self.client.call(self._subscribe(name))
        return new

    def _streams(self) -> list[str]:
        prefix = f"NOETL_CMD_{self.region}_"
        infos = self.client.call(self.client.js.streams_info())
        return sorted(i.config.name for i in infos if i.config.name.startswith(prefix))

    async def _subscribe(self, stream: str) -> Any:
        from nats.js.api import AckPolicy, ConsumerConfig  # noqa: PLC0415 - the nats extra

        subject = f"noetl.cmd.{self.region}.{stream.rsplit('_', 1)[-1]}.>"
        config = ConsumerConfig(durable_name=WORKERS_DURABLE, ack_policy=AckPolicy.EXPLICIT,
                                ack_wait=self.ack_wait, max_deliver=-1, filter_subject=subject)  # fmt: skip
        return await self.client.js.pull_subscribe(
            subject, durable=WORKERS_DURABLE, stream=stream, config=config
        )

    # -- the loop -------------------------------------------------------------------------------
    def run(self, max_commands: int | None = None) -> dict[str, int]:
        self.bind()
        beat = threading.Thread(target=self._heartbeat, daemon=True, name="noetl-pool-heartbeat")
        beat.start()
        discovered = time.monotonic()
        taken = 0
        try:
            while not self.stop.is_set() and (max_commands is None or taken < max_commands):
                if not self.shards and time.monotonic() - discovered > DISCOVER_EVERY_S:
                    self.bind()
                    discovered = time.monotonic()
                if not self._subs:
                    self.stop.wait(FETCH_WAIT_S)
                    continue
                for sub in list(self._subs.values()):
                    if self.stop.is_set():
                        break
                    # a free slot before a message is taken from the queue (none is held waiting)
                    if not self._slots.acquire(timeout=0.5):
                        continue
                    msgs = [] if self.stop.is_set() else self._fetch(sub)
                    if not msgs:
                        self._slots.release()
                        continue
                    taken += 1
                    with self._inflight_lock:
                        self._inflight[id(msgs[0])] = msgs[0]
                    self._pool.submit(self._handle_in_slot, msgs[0])
        finally:
            self.stop.set()
            self._pool.shutdown(wait=True)  # the drain: calls in flight finish, reply and ack
            beat.join(5)
            self.client.close()
            self.store.close()
        return dict(self.counts)

    def _fetch(self, sub: Any) -> list[Any]:
        try:  # one message per free slot: a fetched message waits for no other call
            return self.client.call(sub.fetch(1, timeout=FETCH_WAIT_S), timeout=FETCH_WAIT_S + 10)
        except Exception as e:  # noqa: BLE001 - nats' TimeoutError: the queue is empty
            if type(e).__name__ not in ("TimeoutError", "FetchTimeoutError"):
                self.log(f"fetch: {type(e).__name__}: {e}")
                self.stop.wait(FETCH_WAIT_S)
            return []

    def _handle_in_slot(self, msg: Any) -> None:
        try:
            self.handle(msg)
        except Exception as e:  # noqa: BLE001 - one command's failure never ends the worker
            self.log(f"command failed in the worker: {type(e).__name__}: {e}")
            self._nak(msg)
        finally:
            with self._inflight_lock:
                self._inflight.pop(id(msg), None)
            self._slots.release()

    def _heartbeat(self) -> None:
        """In-progress acks for every call in flight, so a long call keeps its message."""
        while not self.stop.wait(self.ack_wait / 3) or self._inflight:
            with self._inflight_lock:
                msgs = list(self._inflight.values())
            for msg in msgs:
                try:
                    self.client.call(msg.in_progress(), timeout=5)
                except Exception:  # noqa: BLE001, S110 - the next beat tries again
                    pass
            if self.stop.is_set():
                time.sleep(min(1.0, self.ack_wait / 3))

    # -- one command ------------------------------------------------------------------------------
    def handle(self, msg: Any) -> str:
        """Answer one delivered command; what happened (``ran``, ``answered_from_log``, ``dropped``,
        ``dead_lettered``)."""
        delivered = int(getattr(msg.metadata, "num_delivered", 1) or 1)
        try:
            command = Command.from_bytes(msg.data)
        except (ValueError, TypeError) as e:
            self._dead_letter_raw(msg, f"not a command: {e}")
            return self._count("dead_lettered")
        if delivered > self.max_deliver:
            self._dead_letter(msg, command, f"delivered {delivered - 1} times without an answer")
            return self._count("dead_lettered")
        if command.deadline and command.deadline < time.time():
            self._reply(command, error_reply("timeout", "the command's deadline passed before a worker took it",
                                             retryable=True, worker=self.worker_id))  # fmt: skip
            self._ack(msg)
            return self._count("dropped")
        found = recorded(self.store, command)
        if found is not None:
            if found["state"] == "done":
                self._reply(command, found["reply"])
            self._ack(msg)
            return self._count("answered_from_log")
        reply = self.execute(command)
        self.store.append([done_event(command, reply)])  # durable before the reply and the ack
        self._reply(command, reply)
        self._ack(msg)
        return self._count("ran")

    def execute(self, command: Command) -> dict[str, Any]:
        """Run the command's kind; the reply (``ok`` and ``result``, or ``error``; logs, notes, secrets)."""
        from noetl_dagster.dsl.kinds import get_tool  # noqa: PLC0415

        ctx = PoolContext(command, self)
        try:
            reply = call_as_reply(get_tool(command.kind), command.config, ctx,
                                  f"tool kind {command.kind!r} is not registered on worker {self.worker_id}")  # fmt: skip
        finally:
            ctx.close()
        reply["worker"] = self.worker_id
        redactor = Redactor()
        redactor.add([*command.redact, *ctx.redactions])
        if redactor:
            reply = {
                **redactor.value({k: v for k, v in reply.items() if k != "redact"}),
                "redact": ctx.redactions,
            }
        if len(dumps(reply)) > MAX_RESULT_BYTES:
            reply = error_reply("result_too_large", f"task {command.task!r}: its result is over "
                                f"{MAX_RESULT_BYTES:,} bytes, the most a pool worker returns", worker=self.worker_id)  # fmt: skip
        return reply

    # -- replies, acks, dead letters ----------------------------------------------------------------
    def _reply(self, command: Command, reply: Mapping[str, Any]) -> None:
        if command.reply_to:
            try:  # core NATS: a dispatcher that is gone finds the answer in the log instead
                self.client.call(
                    self.client.nc.publish(command.reply_to, dumps(dict(reply)).encode()), timeout=10
                )
            except Exception as e:  # noqa: BLE001
                self.log(f"reply to {command.command_id}: {type(e).__name__}: {e}")

    def _ack(self, msg: Any) -> None:
        self.client.call(msg.ack_sync(timeout=5), timeout=10)

    def _nak(self, msg: Any) -> None:
        delivered = int(getattr(msg.metadata, "num_delivered", 1) or 1)
        try:
            self.client.call(msg.nak(delay=nak_delay(delivered)), timeout=10)
            self.counts["nak"] += 1
        except Exception:  # noqa: BLE001, S110 - ack_wait redelivers it anyway
            pass

    def _dead_letter(self, msg: Any, command: Command, reason: str) -> None:
        placement = command.placement(self.region)
        record = {"reason": reason, "worker": self.worker_id, "stream_sequence": msg.metadata.sequence.stream,
                  "command": command.__dict__}  # fmt: skip
        self.client.ensure_streams(placement)
        self.client.call(self.client.js.publish(placement.dlq_subject(command.tenant, command.project, "task"),
                                                dumps(record).encode(), stream=placement.dlq_stream))  # fmt: skip
        try:
            self.store.append([cancelled_event(command, f"dead_lettered: {reason}")])
        except Exception as e:  # noqa: BLE001 - the reply still tells the dispatcher
            self.log(f"dead letter {command.command_id}: the log refused its record: {e}")
        self._ack(msg)  # moved, so gone from the work queue (confirmed) before the dispatcher hears of it
        self._reply(command, error_reply("dead_lettered", f"task {command.task!r}: {reason} (moved to "
                                         f"{placement.dlq_stream})", worker=self.worker_id))  # fmt: skip

    def _dead_letter_raw(self, msg: Any, reason: str) -> None:
        stream = msg.metadata.stream
        dlq = stream.replace("NOETL_CMD_", "NOETL_DLQ_", 1)
        subject = msg.subject.replace("noetl.cmd.", "noetl.dlq.", 1)
        record = {"reason": reason, "worker": self.worker_id, "data": msg.data.decode("utf-8", "replace")}
        self.client.call(self.client.js.publish(subject, dumps(record).encode(), stream=dlq))
        self._ack(msg)

    def _count(self, what: str) -> str:
        self.counts[what] += 1
        return what

    def payloads(self) -> Any:
        if self._payloads is None:
            from noetl_dagster.storage.offload import Offloader  # noqa: PLC0415
            from noetl_dagster.storage.payload import open_payload_store  # noqa: PLC0415

            self._payloads = Offloader(
                open_payload_store(None, data_dir=self.data_dir), data_dir=self.data_dir
            )
        return self._payloads


class PoolContext(RemoteContext):
    """What a tool sees in a pool worker: the command's facts and plain scope; no keychain, no engine."""

    def __init__(self, command: Command, worker: PoolWorker):
        super().__init__()
        self.execution_id = command.execution_id
        self.step = command.step
        self.task = command.task
        self.attempt = command.attempt
        self.spec = command.spec
        self.tenant = command.tenant
        self.project = command.project
        self.render_context = command.context
        self.base_dir = command.base_dir
        self.data_dir = str(worker.data_dir)
        self.scope_dir = None
        self.restricted = False
        self.isolation = None
        self._worker = worker

    @property
    def offloader(self) -> Any:
        return self._worker.payloads()

    @property
    def payloads(self) -> Any:
        return self._worker.payloads().store

    def credential(self, name: str) -> dict[str, Any]:
        raise ToolError(f"credential {name!r}: a pool worker has no keychain (run this kind in the engine's "
                        "process: leave it out of the dispatch kinds)", kind="credential_not_delegated")  # fmt: skip

    def run_playbook(self, path: str, workload: Any, **kw: Any) -> dict[str, Any]:
        raise ToolError("a pool worker cannot start a playbook", kind="dispatch_refused")

    def run_workbook(self, name: str, inputs: Any) -> Any:
        raise ToolError("a pool worker cannot call a workbook entry", kind="dispatch_refused")
