"""Ports: the small interfaces through which the engine talks to the outside.

The engine depends only on these; adapters (``storage``, ``tools``, ``lineage``,
``analytics``) implement them and a composition root (``runners``, the Dagster
resources) wires them together. Nothing here imports an adapter.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from noetl_dagster.engine.events import Event

# Called with every event after it is recorded (lineage, facts, Dagster logs).
EventListener = Callable[[Event], None]


@dataclass(frozen=True)
class StoredEvent:
    gid: int
    event: Event


@dataclass(frozen=True)
class ExecutionInfo:
    execution_id: str
    playbook: str | None
    status: str
    started_at: str | None
    finished_at: str | None
    parent_execution_id: str | None
    events: int


class ExecutionLeased(RuntimeError):
    """Another live process holds the execution's lease (a second ``resume`` of one execution)."""


class EventStore(ABC):
    """Append-only, ordered event log."""

    url: str

    @abstractmethod
    def append(self, events: Sequence[Event]) -> list[Event]:
        """Append events; sets ``sequence`` on each. Events whose ``event_id`` is
        already stored are skipped (and keep their stored sequence)."""

    @abstractmethod
    def read(self, execution_id: str, after_sequence: int = 0) -> list[Event]:
        """Events of one execution in sequence order."""

    @abstractmethod
    def tail(self, after_gid: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """Events of every execution after a global cursor, in append order."""

    @abstractmethod
    def executions(self, limit: int = 100) -> list[ExecutionInfo]:
        """Most recent executions first."""

    @abstractmethod
    def tail_last(self) -> int:
        """The newest global cursor value (0 when empty)."""

    def iter_all(self, batch: int = 5000) -> Iterator[StoredEvent]:
        gid = 0
        while True:
            rows = self.tail(gid, batch)
            if not rows:
                return
            yield from rows
            gid = rows[-1].gid

    def read_range(self, execution_id: str, after_sequence: int, until_sequence: int) -> list[Event]:
        """Events of one execution with ``after_sequence < sequence <= until_sequence``, in order
        (adapters read only that stretch; this default reads the rest of the log)."""
        return [e for e in self.read(execution_id, after_sequence) if (e.sequence or 0) <= until_sequence]

    def read_chained(self, execution_id: str) -> list[tuple[int, Event | None, bytes | None]]:
        """Every stored position of one execution in sequence order: (sequence, the event or None
        when it cannot be decoded, its stored chain hash or None), for ``engine.chain.check_chain``.
        This default (an adapter without a chain) reports every event unchained."""
        return [(e.sequence or 0, e, None) for e in self.read(execution_id)]

    def summary(self, execution_id: str) -> tuple[int, list[tuple[int, Any]]] | None:
        """The execution's summary as stored with its events (engine/explain_summary.py): (the last
        sequence it folded, its rows), or None (an adapter without summaries, or none yet)."""
        return None

    def put_summary(
        self, execution_id: str, after: int | None, last: int, rows: list[tuple[int, str]]
    ) -> bool:
        """Replace the summary with ``rows`` (folded up to ``last``) if the stored one is still at
        ``after`` (None: there is none); False when it moved meanwhile or the adapter keeps none."""
        return False

    # True for a store whose ``append`` only buffers (the local Feather store): the engine then
    # hands it every step's events and ``barrier`` decides when they reach the file. False (SQLite,
    # Postgres): an append is a commit, so the engine's recorder holds pure steps' events itself
    # and appends them at the next barrier (docs/events.md "Durability at side effects").
    buffers_appends: bool = False

    def barrier(self, durable: bool = True) -> None:  # noqa: B027 - a store whose append commits has nothing to do
        """Everything appended so far survives the death of this process (kill -9); with
        ``durable`` also an OS crash (fsync). The engine calls it before every task with an effect
        outside the execution, after the step run that had one, and at the execution's end."""

    def acquire_lease(self, execution_id: str) -> None:  # noqa: B027 - adapters without leases allow all
        """Take the exclusive lease on one execution (``resume``); raise ExecutionLeased if another live
        process holds it. A lease whose holder died (kill -9) is stale and is taken over."""

    def release_lease(self, execution_id: str) -> None:  # noqa: B027
        """Give the lease back (idempotent)."""

    def close(self) -> None:  # noqa: B027 - optional for adapters without connections
        pass

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ResultOffloader(Protocol):
    """Reference-first results: large values leave the event log as ``$ref`` envelopes."""

    store: Any

    def maybe_offload(
        self, value: Any, key: str, *, execution_id: str | None = None, owner: tuple[str, str] | None = None
    ) -> Any: ...

    def resolve(self, value: Any, reader: tuple[str, str] | None = None) -> Any:
        """``value`` with a ``$ref`` read back, when ``reader`` (tenant, project) may read it."""
        ...


class ToolError(Exception):
    """A tool failed. ``details`` become kind helpers on the outcome (``http``, ``pg``, ``py``)."""

    def __init__(
        self,
        message: str,
        *,
        kind: str = "tool_error",
        retryable: bool = False,
        code: str | int | None = None,
        details: Mapping[str, Any] | None = None,
        result: Any = None,
    ):
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.retryable = retryable
        self.code = code
        self.details = dict(details or {})
        self.result = result


class ToolContext(Protocol):
    """What a tool can see of the running execution (implemented by the engine)."""

    execution_id: str
    step: str
    task: str
    attempt: int
    spec: Mapping[str, Any]  # the task's ``spec`` (policy excluded)
    base_dir: str | None  # directory of the playbook file, for relative paths
    render_context: Mapping[str, Any]  # read-only view of the template namespaces

    def credential(self, name: str) -> dict[str, Any]: ...

    def resource(self, key: str, factory: Callable[[], Any]) -> Any:
        """A per-execution shared object (connection pools), created once."""

    def run_playbook(self, path: str, workload: Mapping[str, Any], **kw: Any) -> dict[str, Any]: ...

    def log(self, message: str) -> None: ...

    def redact(self, value: str) -> None:
        """Mark a secret value: it must never appear in events, logs or output."""

    def note(self, **meta: Any) -> None:
        """Facts about the call (e.g. the SQL it ran) for ``outcome.meta`` of ``task.done``:
        redacted, long strings cut (engine/worker.py). Optional: tools look it up with getattr."""


# -- the sandboxed worker (tools/sandbox_worker.py): in-process kinds of a sandboxed execution ----------


class SandboxWorker(Protocol):
    """One execution's worker process in the OS sandbox."""

    def call(self, kind: str, config: Mapping[str, Any], ctx: ToolContext) -> Any:
        """The tool's result, or ToolError: as the kind's own call in this process would give."""

    def close(self) -> None: ...


class SandboxPort(Protocol):
    """``Services.sandbox``, wired by the runner: the kinds that run in the worker, and its start."""

    kinds: frozenset[str]

    def start(self, ctx: ToolContext) -> SandboxWorker | None:
        """The execution's worker; None where the operator opted out of the sandbox (env-only)."""


# -- the worker pool (tools/dispatch_nats.py): tool calls that run in another process ----------------


class ToolDispatch(Protocol):
    """``Services.dispatch``, wired by the runner: calls of ``kinds`` run in a worker pool, not here.

    The engine records ``task.started`` durably, calls ``call`` and records ``task.done`` from what it
    returns, as for a call in this process, so both give the same trace. Besides the ToolContext
    fields, ``ctx`` carries ``task_run_id`` (the command's idempotency key), ``step_run_id``,
    ``tenant``, ``project``, ``event_store`` (the execution's log: the pool records what it ran there)
    and ``log_position`` (the sequence the log had when the command left)."""

    kinds: frozenset[str]

    def call(self, kind: str, config: Mapping[str, Any], ctx: ToolContext) -> Any:
        """The tool's result, or ToolError: as the kind's own call in this process would give."""

    def close(self) -> None: ...


# -- cursor loops (loop.cursor): pull sources whose rows are claimed in frames ----------------------


@dataclass(frozen=True)
class CursorRow:
    """One claimed row: ``key`` identifies it across processes (resume skips a key already done)."""

    key: str
    value: Any
    handle: Any = None  # driver state (a NATS message)


@dataclass(frozen=True)
class CursorRequest:
    """Everything a driver needs to open a source (templates already rendered)."""

    kind: str
    claim: str
    options: Mapping[str, Any]
    auth: Any  # a credential name, inline record or DSN, as written
    owner: str  # stable across resume: "<execution_id>:<step_run_id>"
    lease_seconds: float
    credential: Callable[[str], dict[str, Any]]  # the keychain
    base_dir: str | None = None
    # a generated playbook's own directory (engine.trust.Gate): relative files resolve there and a
    # driver that can reach files (duckdb) reaches none outside it
    sandbox_dir: str | None = None


class CursorSource(ABC):
    """A claimed-row source. Drivers live in ``noetl_dagster.tools.cursor_*``, wired by the runner."""

    @abstractmethod
    def claim(self, max_rows: int) -> list[CursorRow]:
        """Claim up to ``max_rows`` rows (an empty list: drained)."""

    @abstractmethod
    def ack(self, rows: Sequence[CursorRow]) -> None:
        """The rows are done (their iteration is recorded): never hand them out again."""

    def fail(self, rows: Sequence[CursorRow], error: Mapping[str, Any] | None) -> None:  # noqa: B027
        """The rows' iteration failed (default: leave them to the lease)."""

    def heartbeat(self, rows: Sequence[CursorRow]) -> None:  # noqa: B027
        """Extend the lease of rows still being processed."""

    def close(self) -> None:  # noqa: B027
        pass


CursorOpener = Callable[[CursorRequest], CursorSource]
