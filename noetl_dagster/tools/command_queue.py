"""The command work queue on NATS JetStream (seed 004 §5, H.10): tool calls handed to a worker pool.

A command is one tool call the engine decided to make: the kind, its rendered config, the
execution, step and task run ids, the attempt, a deadline and where to reply. The dispatcher
(:class:`NatsToolDispatch`, the engine's ``ToolDispatch`` port) publishes it on the execution's
``NOETL_CMD_<region>_<shard>`` stream (work-queue retention; ``Nats-Msg-Id`` = the command id, so a
re-sent command is stored once), waits for the server's ack, then for the worker's reply. A pool
worker (``runners/pool_worker.py``, ``noetl-dagster worker``) pulls it, runs the kind, records a
``command.done`` event in the execution's own event log, replies, and only then acks the message.

Effect once: before running a command the worker reads the log after ``log_position``; a command
whose ``command.done`` (or the engine's ``task.done`` of its task run, or a ``command.cancelled``)
is there is acked without running again: a worker killed after recording but before acking has
its command redelivered, and the next worker answers from the log. A worker killed before
recording leaves nothing, and the redelivered command runs once more (its effect had not finished).

Settings: ``NOETL_TOOL_DISPATCH=nats://host:4222[?kinds=python,http&region=R&timeout=S]`` hands
calls of those kinds (default :data:`DEFAULT_KINDS`) to the pool; without it every kind runs in
the engine's process.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

from noetl_dagster.engine import events as E
from noetl_dagster.engine.events import Event, uuid7
from noetl_dagster.engine.ports import ToolError
from noetl_dagster.storage import nats_streams as streams
from noetl_dagster.tools.remote_call import reply_outcome
from noetl_dagster.util.jsonutil import dumps, loads

DISPATCH_ENV = "NOETL_TOOL_DISPATCH"
# kinds that need nothing of the engine's process but their rendered config and the plain scope
DEFAULT_KINDS = frozenset({"python", "http", "shell", "duckdb", "rhai"})
DEFAULT_TIMEOUT_S = 600.0  # a task's own spec.timeout wins
DEFAULT_MAX_DELIVER = 5  # deliveries before the command is dead-lettered
MAX_RESULT_BYTES = 512 * 1024  # a reply and its command.done event stay well under NATS' 1 MiB
LOG_CHECK_S = 2.0  # a lost reply (core NATS is at-most-once) is found in the log this often
WORKERS_DURABLE = "noetl_workers"  # one durable pull consumer per command stream, shared by the pool
REPLY_KEYS = ("ok", "result", "error", "logs", "notes", "redact", "worker")
DETAIL_KEYS = frozenset({"py", "http", "pg", "duckdb"})


class DispatchConfigError(ValueError):
    """A dispatch URL or worker setting that cannot be used."""


@dataclass
class Command:
    """One tool call as it travels on the command stream (JSON)."""

    command_id: str
    kind: str
    config: dict[str, Any]
    execution_id: str
    tenant: str
    project: str
    step: str
    task: str
    attempt: int
    task_run_id: str | None = None
    step_run_id: str | None = None
    parent_execution_id: str | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)  # the task's plain scope (workload, ctx, …)
    base_dir: str | None = None
    log_position: int = 0  # the worker reads the log after this sequence
    deadline: float = 0.0  # epoch seconds; a worker drops a command past it
    reply_to: str = ""
    redact: list[str] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        return dumps(asdict(self)).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Command:
        raw = loads(data)
        if not isinstance(raw, dict):
            raise ValueError("a command is a JSON object")
        names = cls.__dataclass_fields__
        missing = [n for n in ("command_id", "kind", "execution_id", "step", "task") if not raw.get(n)]
        if missing:
            raise ValueError(f"a command without {', '.join(missing)}")
        return cls(**{k: v for k, v in raw.items() if k in names})

    def placement(self, region: str | None = None) -> streams.Placement:
        return streams.placement_of(self.tenant, self.project, region=region)


# -- the log's record of a command ------------------------------------------------------------------


def recorded(store: Any, command: Command) -> dict[str, Any] | None:
    """What the execution's log holds of ``command`` after its ``log_position``: ``{"state": "done",
    "reply": …}`` (a worker ran it), ``{"state": "cancelled"}``, ``{"state": "finished"}`` (the
    engine recorded its task run) or None (nothing: it may run)."""
    for ev in store.read(command.execution_id, max(0, int(command.log_position or 0) - 1)):
        data = ev.data or {}
        if ev.name == E.COMMAND_DONE and data.get("command_id") == command.command_id:
            return {"state": "done", "reply": data.get("reply") or {}}
        if ev.name == E.COMMAND_CANCELLED and data.get("command_id") == command.command_id:
            return {"state": "cancelled", "reason": data.get("reason")}
        if ev.name == E.TASK_DONE and command.task_run_id and ev.task_run_id == command.task_run_id:
            return {"state": "finished"}
    return None


def command_event(name: str, command: Command, data: dict[str, Any], status: str = "success") -> Event:
    return Event(
        name,
        command.execution_id,
        data,
        status=status,
        entity_id=command.command_id,
        step=command.step,
        step_run_id=command.step_run_id,
        task_run_id=command.task_run_id,
        attempt=command.attempt,
        parent_execution_id=command.parent_execution_id,
        tenant_id=command.tenant,
        project_id=command.project,
    )


def done_event(command: Command, reply: Mapping[str, Any]) -> Event:
    data = {
        "command_id": command.command_id,
        "task": command.task,
        "kind": command.kind,
        "reply": dict(reply),
    }
    return command_event(E.COMMAND_DONE, command, data, "success" if reply.get("ok") else "error")


def cancelled_event(command: Command, reason: str) -> Event:
    data = {"command_id": command.command_id, "task": command.task, "kind": command.kind, "reason": reason}
    return command_event(E.COMMAND_CANCELLED, command, data, "error")


def error_reply(kind: str, message: str, *, retryable: bool = False, worker: str = "") -> dict[str, Any]:
    return {
        "ok": False,
        "error": {"kind": kind, "message": message, "retryable": retryable},
        "worker": worker,
    }


# -- settings ----------------------------------------------------------------------------------------


def parse_dispatch_url(url: str) -> tuple[str, dict[str, str]]:
    """``nats://host:port?kinds=…&region=…&timeout=…`` -> (the server URL, the options)."""
    parts = urlsplit(url)
    if parts.scheme not in ("nats", "tls") or not parts.hostname:
        raise DispatchConfigError(
            f"tool dispatch URL {url!r}: use nats://host:port[?kinds=python,http&region=R]"
        )
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as e:
        raise DispatchConfigError(f"tool dispatch URL {url!r}: {e}") from None
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(options) - {"kinds", "region", "timeout", "max_deliver"}
    if unknown:
        raise DispatchConfigError(f"tool dispatch URL {url!r}: unknown option(s) {sorted(unknown)}")
    return urlunsplit((parts.scheme, parts.netloc, "", "", "")), options


_POOLS: dict[str, NatsToolDispatch] = {}
_POOLS_LOCK = threading.Lock()


def dispatch_from_env(url: str | None = None) -> NatsToolDispatch | None:
    """The process' dispatcher for ``url`` (default ``$NOETL_TOOL_DISPATCH``), None when unset. One per
    URL and process: its connection and reply subscription serve every execution."""
    url = url if url is not None else os.environ.get(DISPATCH_ENV, "")
    if not url:
        return None
    with _POOLS_LOCK:
        pool = _POOLS.get(url)
        if pool is None or pool.closed:
            pool = _POOLS[url] = NatsToolDispatch.from_url(url)
        return pool


# -- the dispatcher ------------------------------------------------------------------------------------


class NatsToolDispatch:
    """``Services.dispatch`` (engine.ports.ToolDispatch) over the NATS command streams.

    Connects at the first call. Thread-safe: parallel loop iterations dispatch at once, each waits for
    its own reply (one inbox subscription per process, replies routed by command id)."""

    def __init__(
        self,
        nats_url: str = streams.DEFAULT_URL,
        *,
        kinds: frozenset[str] = DEFAULT_KINDS,
        region: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ):
        self.nats_url = nats_url
        self.kinds = frozenset(kinds)
        self.region = region
        self.timeout = timeout
        self.closed = False
        self._client: Any = None
        self._inbox = ""
        self._waiting: dict[str, queue.SimpleQueue[dict[str, Any]]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str) -> NatsToolDispatch:
        nats_url, options = parse_dispatch_url(url)
        kinds = (
            frozenset(k.strip() for k in options.get("kinds", "").split(",") if k.strip()) or DEFAULT_KINDS
        )
        try:
            timeout = float(options.get("timeout") or DEFAULT_TIMEOUT_S)
        except ValueError:
            raise DispatchConfigError(f"tool dispatch URL {url!r}: timeout is not a number") from None
        return cls(nats_url, kinds=kinds, region=options.get("region") or None, timeout=timeout)

    # the connection and the reply inbox ---------------------------------------------------------
    def _connected(self) -> Any:
        with self._lock:
            if self._client is None:
                try:
                    client = streams.connect(self.nats_url, name="noetl-dispatch")
                except ConnectionError as e:
                    raise ToolError(
                        f"worker pool: {e}", kind="dispatch_unavailable", retryable=True
                    ) from None
                self._inbox = client.nc.new_inbox()
                client.call(client.nc.subscribe(f"{self._inbox}.*", cb=self._on_reply))
                self._client = client
            return self._client

    async def _on_reply(self, msg: Any) -> None:
        waiter = self._waiting.get(msg.subject.rsplit(".", 1)[-1])
        if waiter is not None:
            try:
                waiter.put(loads(msg.data))
            except ValueError:
                waiter.put(error_reply("dispatch_protocol", "the worker's reply is not JSON"))

    # one call ---------------------------------------------------------------------------------------
    def command(self, kind: str, config: Mapping[str, Any], ctx: Any) -> Command:
        """The command of one call (its id: the task run's, so a re-sent call is the same command)."""
        spec = dict(getattr(ctx, "spec", None) or {})
        timeout = float(spec.get("timeout") or spec.get("timeout_seconds") or self.timeout)
        scope = getattr(ctx, "render_context", None)
        command_id = getattr(ctx, "task_run_id", None) or uuid7()
        return Command(
            command_id=command_id, kind=kind, config=dict(config), execution_id=str(ctx.execution_id),
            tenant=getattr(ctx, "tenant", None) or "default", project=getattr(ctx, "project", None) or "default",
            step=ctx.step, task=ctx.task, attempt=int(ctx.attempt or 1), task_run_id=getattr(ctx, "task_run_id", None),
            step_run_id=getattr(ctx, "step_run_id", None), spec=spec,
            context=scope.plain() if hasattr(scope, "plain") else {},
            base_dir=str(ctx.base_dir) if getattr(ctx, "base_dir", None) else None,
            log_position=int(getattr(ctx, "log_position", 0) or 0), deadline=time.time() + timeout,
            redact=sorted(getattr(ctx, "secrets", ()) or ()),
        )  # fmt: skip

    def call(self, kind: str, config: Mapping[str, Any], ctx: Any) -> Any:
        command = self.command(kind, config, ctx)
        reply = self.send(command, getattr(ctx, "event_store", None))
        return reply_outcome(
            reply, ctx, detail_keys=DETAIL_KEYS, default_message="the worker pool failed the task"
        )

    def send(self, command: Command, store: Any = None) -> dict[str, Any]:
        """Publish ``command`` (acknowledged by the server before this waits) and wait for its reply,
        checking ``store`` (the execution's log) for it now and then; past the deadline the command is
        cancelled in the log and the call fails with a retryable ``timeout``."""
        client = self._connected()
        placement = command.placement(self.region)
        command.reply_to = f"{self._inbox}.{command.command_id}"
        waiter: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._waiting[command.command_id] = waiter
        try:
            try:
                client.ensure_streams(placement)
                client.call(client.js.publish(
                    placement.command_subject(command.tenant, command.project, "task"), command.to_bytes(),
                    stream=placement.commands_stream, headers={"Nats-Msg-Id": command.command_id}))  # fmt: skip
            except Exception as e:  # noqa: BLE001 - a server that does not take the command
                raise ToolError(f"worker pool: the command was not queued on {placement.commands_stream}: "
                                f"{type(e).__name__}: {e}", kind="dispatch_unavailable", retryable=True) from None  # fmt: skip
            while True:
                left = command.deadline - time.time()
                if left <= 0:
                    return self._give_up(command, store)
                try:
                    return waiter.get(timeout=min(left, LOG_CHECK_S))
                except queue.Empty:
                    pass
                found = recorded(store, command) if store is not None else None
                if found is not None and found["state"] == "done":
                    return found["reply"]
        finally:
            self._waiting.pop(command.command_id, None)

    def _give_up(self, command: Command, store: Any) -> dict[str, Any]:
        if store is not None:
            found = recorded(store, command)
            if found is not None and found["state"] == "done":  # it finished as the deadline passed
                return found["reply"]
            try:  # a worker that pulls it later acks it unrun
                store.append([cancelled_event(command, "deadline")])
            except Exception:  # noqa: BLE001, S110 - the worker's own deadline check still drops it
                pass
        return error_reply("timeout", f"the worker pool did not answer task {command.task!r} before its "
                           "deadline (the command was cancelled)", retryable=True)  # fmt: skip

    def close(self) -> None:
        with self._lock:
            self.closed = True
            client, self._client = self._client, None
        if client is not None:
            client.close()
