"""Recorder: the one way an execution changes: emit an event, fold it, append it.

Events are folded into the state immediately and appended to the EventStore in
batches (at step boundaries and every ``batch_size`` events), after secret
values are redacted and big bodies are offloaded to the PayloadStore.
Listeners (Dagster logs, OpenLineage) see each event once it is durable.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable
from typing import Any

from noetl_dagster.engine import logredact
from noetl_dagster.engine.events import Event
from noetl_dagster.engine.ports import EventStore, ResultOffloader
from noetl_dagster.engine.state import ExecutionState
from noetl_dagster.util.jsonstream import json_contains
from noetl_dagster.util.jsonutil import replace_lone_surrogates

Listener = Callable[[Event], None]
REDACTED = "***"


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
        self._buffer: list[Event] = []
        self._lock = threading.RLock()
        # an engine continuing an execution from its log (another op, run or process) must not reuse
        # the payload keys of earlier engines: each offload goes with at least one event, so start past them
        self._offload_seq = itertools.count(state.sequence * 1000 + 1)  # next() is atomic: no lock per call

    @property
    def execution_id(self) -> str:
        return self.state.execution_id

    def offload(self, value: Any, hint: str) -> Any:
        """A value as it should appear in an event: itself, or a ``$ref`` to the payload store."""
        if self.redactor:
            value = self.redactor.value(value)
        n = next(self._offload_seq)
        return self.offloader.maybe_offload(value, f"{self.tenant}/{self.project}/{self.execution_id}/{hint}-{n}")

    def emit(self, name: str, *, data: dict[str, Any] | None = None, **fields: Any) -> Event:
        d = data if data is not None else {}
        if d and self.redactor:  # (an empty body holds no secret)
            d = self.redactor.value(d)
        # the one gate every value crosses into the state and the log: a lone surrogate (a JSON
        # escape in a workload, a tool's result) becomes U+FFFD here, as the store keeps it, so the
        # live state and a replay of the log hold the same text
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
            self.state.apply(ev)
            self._buffer.append(ev)
            if len(self._buffer) >= self.batch_size:
                self._flush_locked()
        return ev

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, []
        self.store.append(batch)
        if batch:
            self.state.sequence = max(self.state.sequence, batch[-1].sequence or 0)
        for listener in self.listeners:
            for ev in batch:
                try:
                    listener(ev)
                except Exception:  # noqa: BLE001 - an observer never breaks an execution
                    pass
