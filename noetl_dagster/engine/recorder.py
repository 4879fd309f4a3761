"""Recorder: the one way an execution changes: emit an event, fold it, append it.

Events are folded into the state immediately and appended to the EventStore in
batches, after secret values are redacted and big bodies are offloaded to the
PayloadStore. A batch is appended at each durability barrier (:meth:`Recorder.flush`:
before a task with an effect outside the execution, after the step run that had
one, at the end, on a crash) and every ``batch_size`` events; pure steps between
two barriers go in one batch, so in one commit (docs/events.md "Durability at
side effects"). ``durable`` (``--durable``) appends at every step boundary too.
Listeners (Dagster logs, OpenLineage) see each event once it is durable.

Limits (docs/limits.md): an execution records at most ``max_events`` events
(``executor.spec.max_events``, ``$NOETL_MAX_EVENTS``, default 1,000,000; the engine's
failure record may pass it by a few) and a store refuses one event whose encoded form is
over ``MAX_EVENT_BYTES`` (:func:`check_event_size`). A batch the store refuses is dropped
with the payloads written for it (:meth:`Recorder.discard`); the engine's gate then
records the failure from what the log holds (durability.Driver._crashed).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from noetl_dagster.engine import events as E
from noetl_dagster.engine import logredact
from noetl_dagster.engine.events import Event
from noetl_dagster.engine.ports import EventStore, ResultOffloader
from noetl_dagster.engine.state import ExecutionState
from noetl_dagster.util.jsonstream import json_contains, json_size_bound
from noetl_dagster.util.jsonutil import replace_lone_surrogates

Listener = Callable[[Event], None]
REDACTED = "***"

# one event's encoded size (JSON bytes): big results go to the payload store as $refs, so this
# bounds what cannot (a ctx patch, token args, a workload, an error message)
MAX_EVENT_BYTES = int(os.environ.get("NOETL_MAX_EVENT_BYTES") or 64 * 1024 * 1024)
# events per execution (executor.spec.max_events overrides)
DEFAULT_MAX_EVENTS = int(os.environ.get("NOETL_MAX_EVENTS") or 1_000_000)
FAILURE_RESERVE = 64  # events the failure record may add past max_events


# events whose data is bounded by construction (ids, counters, offloaded results: a $ref or at most the
# inline limit, error messages cut by frame._error): not measured on the hot path. Any other event
# (a ctx patch, token args, a workload, and every event added later) is measured before it is folded
UNMEASURED = frozenset({E.STEP_STARTED, E.TASK_STARTED, E.TASK_DONE, E.STEP_DONE, E.LOOP_ITERATION_STARTED,
                        E.LOOP_ITERATION_DONE, E.LOOP_DONE, E.NEXT_EVALUATED, E.WORKFLOW_FINISHED,
                        E.PLAYBOOK_PROCESSED})  # fmt: skip


def size_bound(v: Any, cap: int, depth: int = 0) -> int:
    """A lower bound of the JSON size of ``v`` that stops past ``cap``: a recursion over small
    plain dicts and lists (the usual event body, about a microsecond), else jsonstream's walk."""
    t = type(v)
    if t is dict:
        n = 4 * len(v) + 1  # quotes, colon and comma per item (keys: at least their quotes)
        for x in v.values():
            tx = type(x)
            if tx is str:
                n += len(x)
            elif (tx is dict or tx is list) and x:
                n += size_bound(x, cap, depth + 1) if depth < 8 and len(x) <= 64 else json_size_bound(x, cap)
                if n > cap:
                    return n
        return n
    if t is list and len(v) <= 64 and depth <= 8:
        n = 3 * len(v) + 1
        for x in v:
            tx = type(x)
            if tx is str:
                n += len(x)
            elif (tx is dict or tx is list) and x:
                n += size_bound(x, cap, depth + 1)
                if n > cap:
                    return n
        return n
    return json_size_bound(v, cap)


class EventTooLarge(ValueError):
    """One event whose encoded form is over MAX_EVENT_BYTES (raised by the stores, before writing)."""


class TooManyEvents(RuntimeError):
    """The execution reached its max_events."""


class RecordingFailed(RuntimeError):
    """The event log refused even the failure record (disk full): the execution is left to the
    next start, which finds it unrecorded and marks it failed (runners.local.reap_unrecorded)."""


def ref_uris(value: Any, out: set[str]) -> set[str]:
    """Add the uri of every ``$ref`` envelope nested in ``value`` to ``out``."""
    stack: list[Any] = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            ref = v.get("$ref")
            if isinstance(ref, dict) and isinstance(ref.get("uri"), str):
                out.add(ref["uri"])
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return out


def too_large(name: str, step: str | None, nbytes: int | None) -> EventTooLarge:
    where = f" of step {step!r}" if step else ""
    size = f"{nbytes:,} bytes encoded, over" if nbytes is not None else "over"
    return EventTooLarge(f"event {name}{where} is {size} the {MAX_EVENT_BYTES:,}-byte limit (NOETL_MAX_EVENT_BYTES); "
                         "keep big values in results (stored by reference), not in ctx, args or workload")  # fmt: skip


def check_event_size(ev: Event, nbytes: int) -> None:
    """Every store calls this with each event's encoded size before it writes the batch."""
    if nbytes > MAX_EVENT_BYTES:
        raise too_large(ev.name, ev.step, nbytes)


class Redactor:
    def __init__(self) -> None:
        self.secrets: set[str] = set()
        self._needles: tuple[str, ...] = ()  # each secret as it appears in JSON text (raw and escaped)

    def add(self, values: Iterable[str]) -> None:
        import base64
        import json
        from urllib.parse import quote, quote_plus

        for v in values:
            if isinstance(v, str) and len(v) >= 3 and v not in self.secrets:
                raw = v.encode("utf-8", "surrogatepass")
                # derived forms a server may echo back: base64 (|b64encode), percent-encoding (a path,
                # a query string as httpx and HTML forms write it: space as '+')
                forms = {v, base64.b64encode(raw).decode(), base64.b64encode(raw).decode().rstrip("="),
                         base64.urlsafe_b64encode(raw).decode().rstrip("="), quote(v, safe=""), quote(v),
                         quote_plus(v)}  # fmt: skip
                logredact.watch(self)  # and out of Python logs while this execution lives
                for f in forms:
                    if len(f) >= 3 and f not in self.secrets:
                        self.secrets.add(f)
                        self._needles = tuple({*self._needles, f, json.dumps(f)[1:-1]})

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def text(self, s: str) -> str:
        for secret in self.secrets:
            if secret in s:
                s = s.replace(secret, REDACTED)
        return s

    def value(self, v: Any) -> Any:
        if not self.secrets:
            return v
        if isinstance(v, str):
            return self.text(v)
        try:  # fast path: one streamed serialization (chunk by chunk, issue 14.8) tells whether any secret is there
            if not json_contains(v, self._needles):
                return v
        except RecursionError:
            raise  # a cyclic value: the walk would recurse for ever too (the task fails, see Worker)
        except Exception:  # noqa: BLE001 - fall back to the walk
            pass
        return self._walk(v)

    def _walk(self, v: Any) -> Any:
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, dict):
            return {(self.text(k) if isinstance(k, str) else k): self._walk(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [self._walk(x) for x in v]
        return v


def payload_prefix(offloader: Any, tenant: str, project: str, execution_id: str = "") -> str:
    """Where the engine keeps a tenant's payloads (and one execution's) in the offloader's store: the
    store's shard prefix, then ``tenant/project/execution/`` (the keys ``Recorder.offload`` writes)."""
    base = f"{getattr(offloader, 'key_prefix', '') or ''}{tenant}/{project}/"
    return f"{base}{execution_id}/" if execution_id else base


class Recorder:
    def __init__(
        self,
        state: ExecutionState,
        store: EventStore,
        offloader: ResultOffloader,
        *,
        tenant: str = "default",
        project: str = "default",
        parent_execution_id: str | None = None,
        listeners: Iterable[Listener] = (),
        redactor: Redactor | None = None,
        batch_size: int = 2000,
        max_events: int | None = None,
        durable: bool = False,
    ):
        self.state = state
        self.store = store
        self.offloader = offloader
        self.tenant = tenant
        self.project = project
        self.parent_execution_id = parent_execution_id
        self.listeners = list(listeners)
        self.redactor = redactor or Redactor()
        self.batch_size = batch_size
        # every step boundary appends and every barrier asks the store for an fsync (--durable)
        self.durable = durable
        self.appends = 0  # batches appended (one commit each on SQLite and Postgres)
        self._unsealed = False  # appended since the store's last barrier
        # a routed step run had an effect and its end is not appended yet (engine.control._run)
        self.effect_pending = False
        # the step run of the first event the store refused (discard), for the failure record
        self.refused_step_run: str | None = None
        self._buffer: list[Event] = []
        self._lock = threading.RLock()
        # an engine continuing an execution from its log (another op, run or process) must not reuse
        # the payload keys of earlier engines: each offload goes with at least one event, so start past them
        self._offload_seq = itertools.count(state.sequence * 1000 + 1)  # next() is atomic: no lock per call
        self.max_events = max_events or DEFAULT_MAX_EVENTS
        self.closing = False  # the engine records a failure: max_events gets FAILURE_RESERVE more
        self._pending_refs: list[str] = []  # payloads offloaded since the last durable append

    @property
    def execution_id(self) -> str:
        return self.state.execution_id

    def offload(self, value: Any, hint: str) -> Any:
        """A value as it should appear in an event: itself, or a ``$ref`` to the payload store."""
        if self.redactor:
            value = self.redactor.value(value)
        n = next(self._offload_seq)
        out = self.offloader.maybe_offload(
            value,
            f"{self.tenant}/{self.project}/{self.execution_id}/{hint}-{n}",
            execution_id=self.execution_id,
            owner=(self.tenant, self.project),
        )  # the reference names its producer, and carries its tenant's signed capability
        if type(out) is dict and "$ref" in out:  # written now: removed again if its event is never durable
            self._pending_refs.append(out["$ref"].get("uri"))
        return out

    def emit(self, name: str, *, data: dict[str, Any] | None = None, **fields: Any) -> Event:
        d = data if data is not None else {}
        if d and name not in UNMEASURED and size_bound(d, MAX_EVENT_BYTES) > MAX_EVENT_BYTES:
            # before it is folded or encoded: a value held by reference (ctx set to a big result)
            # is refused without its text ever being built (orjson crashes when memory runs out)
            raise too_large(name, fields.get("step"), None)
        if d and self.redactor:  # (an empty body holds no secret)
            d = self.redactor.value(d)
        # the one gate every value crosses into the state and the log: a lone surrogate (a JSON
        # escape in a workload, a tool's result) becomes U+FFFD here, as the store keeps it, so the
        # live state and a replay of the log hold the same text
        if d:  # (an empty body needs no encoding to tell)
            d = replace_lone_surrogates(d)
        ev = Event(
            name,
            self.state.execution_id,
            d,
            parent_execution_id=self.parent_execution_id,
            tenant_id=self.tenant,
            project_id=self.project,
            **fields,
        )
        with self._lock:
            if self.state.sequence + len(self._buffer) >= self.max_events and not (
                self.closing and self.state.sequence + len(self._buffer) < self.max_events + FAILURE_RESERVE
            ):
                raise TooManyEvents(f"execution exceeded {self.max_events:,} events (executor.spec.max_events, "
                                    "NOETL_MAX_EVENTS)")  # fmt: skip
            self.state.apply(ev)
            self._buffer.append(ev)
            if len(self._buffer) >= self.batch_size:
                self._flush_locked()
        return ev

    def flush(self) -> None:
        """The durability barrier: everything emitted so far is appended (one commit on SQLite and
        Postgres) and the store makes it survive this process (``EventStore.barrier``)."""
        with self._lock:
            self._flush_locked()
            self.effect_pending = False
            if self._unsealed:
                self.store.barrier(self.durable)
                self._unsealed = False

    def step_boundary(self) -> None:
        """A step was routed: its events wait for the next barrier (pure steps are grouped), unless
        ``durable`` or the store only buffers appends (it applies its own flush policy)."""
        if self.durable:
            self.flush()
        elif self.store.buffers_appends:
            with self._lock:
                self._flush_locked()

    def discard(self) -> int:
        """After the store refused the buffer: append the events before the first one that cannot be
        encoded (a prefix of the log is consistent, as after a kill at that point), drop the rest and
        delete the payloads written for them (no event will reference them; on a full disk this is
        what frees it). Returns how many events were dropped; the engine then rebuilds its state
        from the log (Engine._resync)."""
        from noetl_dagster.util.jsonutil import dumps

        with self._lock:
            batch, self._buffer = self._buffer, []
            refs, self._pending_refs = self._pending_refs, []
            bad = 0
            self.refused_step_run = None
            for bad, ev in enumerate(batch):  # noqa: B007 - the index of the first bad event is the answer
                try:  # the lower bound first: a gigabyte value is not encoded once more to be measured
                    if size_bound(ev.data, MAX_EVENT_BYTES) > MAX_EVENT_BYTES:
                        raise too_large(ev.name, ev.step, None)
                    check_event_size(ev, len(dumps(ev.to_stored())))
                except Exception:  # noqa: BLE001 - this one cannot be stored
                    # its step run fails (durability.Driver._crashed): with pure steps grouped, the
                    # barrier that found it may run in a later step
                    self.refused_step_run = ev.step_run_id
                    break
            else:
                bad = 0  # each encodes (the store itself failed, a full disk): keep none
            kept: set[str] = set()
            if bad:
                try:
                    self.store.append(batch[:bad])
                    for ev in batch[:bad]:
                        ref_uris(ev.data, kept)
                except Exception:  # noqa: BLE001 - nothing more is durable
                    bad = 0
        store = getattr(self.offloader, "store", None)
        for uri in refs:
            if uri in kept:
                continue
            try:
                if uri and store is not None:
                    store.delete(uri)
            except Exception:  # noqa: BLE001, S110 - best effort; the sweep at the next start retries
                pass
        if hasattr(self.offloader, "_last"):
            self.offloader._last = None  # noqa: SLF001 - its cached envelope may name a deleted payload
        return len(batch) - bad

    def _flush_locked(self) -> None:
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, []
        try:
            self.store.append(batch)
        except BaseException:
            self._buffer = batch + self._buffer  # not durable: discard() drops it, with its payloads
            raise
        self._pending_refs.clear()
        self.appends += 1
        self._unsealed = True
        if batch:
            self.state.sequence = max(self.state.sequence, batch[-1].sequence or 0)
        for listener in self.listeners:
            for ev in batch:
                try:
                    listener(ev)
                except Exception:  # noqa: BLE001 - an observer never breaks an execution
                    pass
