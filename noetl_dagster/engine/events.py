"""The event envelope (SEMANTICS.md §7) and the dotted event taxonomy.

Every state change of an execution is one appended :class:`Event`. The
envelope is a plain dataclass so the hot path stays cheap; ``to_dict`` /
``from_dict`` give the JSON form stored by the EventStore adapters.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = "noetl.event.v1"

# control plane (source="server")
EXECUTION_REQUESTED = "playbook.execution.requested"
WORKFLOW_STARTED = "workflow.started"
TOKEN_ENQUEUED = "token.enqueued"
STEP_SCHEDULED = "step.scheduled"
STEP_SKIPPED = "step.skipped"
NEXT_EVALUATED = "next.evaluated"
CTX_PATCHED = "ctx.patched"
WORKFLOW_FINISHED = "workflow.finished"
PLAYBOOK_PROCESSED = "playbook.processed"
# data plane (source="worker")
STEP_STARTED = "step.started"
TASK_STARTED = "task.started"
TASK_DONE = "task.done"
STEP_DONE = "step.done"
STEP_FAILED = "step.failed"
LOOP_STARTED = "loop.started"
LOOP_ITERATION_STARTED = "loop.iteration.started"
LOOP_ITERATION_DONE = "loop.iteration.done"
LOOP_ITERATION_FAILED = "loop.iteration.failed"
LOOP_DONE = "loop.done"
# cursor loops: a frame of rows claimed from the source, and its rows acknowledged back
LOOP_FRAME_CLAIMED = "loop.frame.claimed"
LOOP_FRAME_COMMITTED = "loop.frame.committed"
# a tool call handed to a worker pool (engine.ports.ToolDispatch): the pool worker's record of the
# call it ran (appended before it replies, so a redelivered command is not run again) and the
# dispatcher's record of a command it gave up on (a worker that pulls it later acks it unrun)
COMMAND_DONE = "command.done"
COMMAND_CANCELLED = "command.cancelled"
COMMAND_EVENTS = frozenset({COMMAND_DONE, COMMAND_CANCELLED})

SERVER_EVENTS = frozenset(
    {
        EXECUTION_REQUESTED,
        WORKFLOW_STARTED,
        TOKEN_ENQUEUED,
        STEP_SCHEDULED,
        STEP_SKIPPED,
        NEXT_EVALUATED,
        WORKFLOW_FINISHED,
        PLAYBOOK_PROCESSED,
    }
)
ALL_EVENT_NAMES = SERVER_EVENTS | {
    CTX_PATCHED,
    STEP_STARTED,
    TASK_STARTED,
    TASK_DONE,
    STEP_DONE,
    STEP_FAILED,
    LOOP_STARTED,
    LOOP_ITERATION_STARTED,
    LOOP_ITERATION_DONE,
    LOOP_ITERATION_FAILED,
    LOOP_DONE,
    LOOP_FRAME_CLAIMED,
    LOOP_FRAME_COMMITTED,
    *COMMAND_EVENTS,
}

ENTITY_OF = {
    EXECUTION_REQUESTED: "playbook",
    PLAYBOOK_PROCESSED: "playbook",
    WORKFLOW_STARTED: "workflow",
    WORKFLOW_FINISHED: "workflow",
    CTX_PATCHED: "workflow",
    TOKEN_ENQUEUED: "token",
    STEP_SCHEDULED: "step",
    STEP_SKIPPED: "step",
    STEP_STARTED: "step",
    STEP_DONE: "step",
    STEP_FAILED: "step",
    TASK_STARTED: "task",
    TASK_DONE: "task",
    LOOP_STARTED: "loop",
    LOOP_ITERATION_STARTED: "loop",
    LOOP_ITERATION_DONE: "loop",
    LOOP_ITERATION_FAILED: "loop",
    LOOP_DONE: "loop",
    LOOP_FRAME_CLAIMED: "loop",
    LOOP_FRAME_COMMITTED: "loop",
    NEXT_EVALUATED: "next",
    COMMAND_DONE: "command",
    COMMAND_CANCELLED: "command",
}


_rng = random.Random(os.urandom(32))
# a forked child must not repeat its parent's random stream
os.register_at_fork(after_in_child=lambda: _rng.seed(os.urandom(32)))


def uuid7() -> str:
    """A time-ordered UUIDv7 string (RFC 9562): 48-bit ms timestamp, version, 74 random bits.

    The random bits come from a per-process generator seeded from ``os.urandom`` (and
    reseeded after fork): ids must be unique, not secret, and this is 10x cheaper."""
    return _uuid7_at(time.time_ns() // 1_000_000)


# the id's first 15 characters ("tttttttt-tttt-7") for the millisecond formatted last: one tuple,
# replaced whole, so a thread never pairs a millisecond with another's prefix
_ms_prefix: tuple[int, str] = (-1, "")


# the variant's hex digit ("10" and two random bits) for a random hex digit
_VARIANT_DIGIT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}


def _uuid7_at(ms: int) -> str:
    global _ms_prefix
    p = _ms_prefix
    if p[0] != ms:
        p = _ms_prefix = (ms, "%08x-%04x-7" % ((ms >> 16) & 0xFFFFFFFF, ms & 0xFFFF))  # noqa: UP031
    # 80 random bits as 20 hex digits, sliced: rand_a (12 bits), the variant digit, then 12 + 48 bits
    # (the digit between rand_a and the variant is not used; one format, no shifts and masks)
    r = "%020x" % _rng.getrandbits(80)  # noqa: UP031 - the fastest formatting here
    return f"{p[1]}{r[:3]}-{_VARIANT_DIGIT[r[4]]}{r[5:8]}-{r[8:]}"


def uuid7_from(*parts: str) -> str:
    """A deterministic UUID with the v7 layout, derived from ``parts`` (stable run ids)."""
    digest = uuid.uuid5(uuid.NAMESPACE_URL, "noetl:" + "/".join(parts)).int
    digest &= ~(0xF << 76)
    digest |= 0x7 << 76
    digest &= ~(0b11 << 62)
    digest |= 0b10 << 62
    return str(uuid.UUID(int=digest))


_second_cache: list[Any] = [-1, ""]


def now_iso() -> str:
    """UTC now as ISO 8601 with microseconds (``2026-11-21T05:45:03.123456+00:00``)."""
    return _iso_at(time.time_ns())


def _iso_at(t_ns: int) -> str:
    sec, ns = divmod(t_ns, 1_000_000_000)
    if sec != _second_cache[0]:
        _second_cache[1] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
        _second_cache[0] = sec
    return f"{_second_cache[1]}.{ns // 1000:06d}+00:00"


# the fields a store row holds in columns (``to_stored(envelope=False)`` leaves them out of the body)
ENVELOPE_COLUMNS = ("event_id", "execution_id", "sequence", "name", "timestamp")

_OPTIONAL = (
    "parent_execution_id",
    "entity_id",
    "step",
    "step_run_id",
    "task_run_id",
    "loop_id",
    "iteration",
    "attempt",
)


@dataclass(slots=True)
class Event:
    name: str
    execution_id: str
    data: dict[str, Any] = field(default_factory=dict)
    status: str = "success"  # in_progress | success | error | paused
    entity_id: str | None = None
    step: str | None = None
    step_run_id: str | None = None
    task_run_id: str | None = None
    loop_id: str | None = None
    iteration: int | None = None
    attempt: int | None = None
    parent_execution_id: str | None = None
    tenant_id: str = "default"
    project_id: str = "default"
    event_id: str = None  # type: ignore[assignment]  # None: a new uuid7 (see __post_init__)
    timestamp: str = None  # type: ignore[assignment]  # None: now, from the same clock read as the id
    sequence: int | None = None
    source: str = ""
    entity: str = ""
    schema_version: str = SCHEMA_VERSION
    # the id __post_init__ made up, until a store appends the event (then None); see ``fresh``
    made_id: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.event_id is None or self.timestamp is None:  # one clock read for both (a syscall here)
            t = time.time_ns()
            if self.event_id is None:
                self.event_id = self.made_id = _uuid7_at(t // 1_000_000)
            if self.timestamp is None:
                self.timestamp = _iso_at(t)
        if not self.source:
            self.source = "server" if self.name in SERVER_EVENTS else "worker"
        if not self.entity:
            self.entity = ENTITY_OF.get(self.name, "workflow")

    @property
    def fresh(self) -> bool:
        """The event's id is still the one made up for it and no store has appended it: nobody outside
        this process has seen the id, so a store that numbers the execution's events itself (the local
        files, storage/feather_events.py) may name the event after its sequence instead (issue 46).
        An id given to the event, or set on it later, is never renamed."""
        return self.made_id is not None and self.made_id == self.event_id

    def to_dict(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "sequence": self.sequence,
            "execution_id": self.execution_id,
            "parent_execution_id": self.parent_execution_id,
            "timestamp": self.timestamp,
            "source": self.source,
            "name": self.name,
            "entity": self.entity,
            "entity_id": self.entity_id,
            "status": self.status,
            "step": self.step,
            "step_run_id": self.step_run_id,
            "task_run_id": self.task_run_id,
            "loop_id": self.loop_id,
            "iteration": self.iteration,
            "attempt": self.attempt,
            "tenant_id": self.tenant_id,
            "project_id": self.project_id,
            "schema_version": self.schema_version,
            "data": self.data,
        }

    def to_stored(self, envelope: bool = True) -> dict[str, Any]:
        """The compact form the EventStore keeps: ``to_dict`` without the fields ``from_dict``
        restores by itself (None, the defaults, source/entity derived from the name). A loop
        iteration's events shrink by about a third (issue 19); ``from_dict(to_stored())`` is the
        same event, so replay and readers see no difference. Without ``envelope`` it also leaves
        out what a store keeps in columns of its own (``ENVELOPE_COLUMNS``)."""
        d = {"event_id": self.event_id, "sequence": self.sequence, "execution_id": self.execution_id,
             "timestamp": self.timestamp, "name": self.name} if envelope else {}  # fmt: skip
        # _OPTIONAL spelled out: this runs for every stored event
        if self.parent_execution_id is not None:
            d["parent_execution_id"] = self.parent_execution_id
        if self.entity_id is not None:
            d["entity_id"] = self.entity_id
        if self.step is not None:
            d["step"] = self.step
        if self.step_run_id is not None:
            d["step_run_id"] = self.step_run_id
        if self.task_run_id is not None:
            d["task_run_id"] = self.task_run_id
        if self.loop_id is not None:
            d["loop_id"] = self.loop_id
        if self.iteration is not None:
            d["iteration"] = self.iteration
        if self.attempt is not None:
            d["attempt"] = self.attempt
        if self.status != "success":
            d["status"] = self.status
        if self.tenant_id != "default":
            d["tenant_id"] = self.tenant_id
        if self.project_id != "default":
            d["project_id"] = self.project_id
        if self.schema_version != SCHEMA_VERSION:
            d["schema_version"] = self.schema_version
        if self.source != ("server" if self.name in SERVER_EVENTS else "worker"):
            d["source"] = self.source
        if self.entity != ENTITY_OF.get(self.name, "workflow"):
            d["entity"] = self.entity
        if self.data:
            d["data"] = self.data
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Event:
        return cls(
            name=d["name"],
            execution_id=d["execution_id"],
            data=d.get("data") or {},
            status=d.get("status") or "success",
            entity_id=d.get("entity_id"),
            step=d.get("step"),
            step_run_id=d.get("step_run_id"),
            task_run_id=d.get("task_run_id"),
            loop_id=d.get("loop_id"),
            iteration=d.get("iteration"),
            attempt=d.get("attempt"),
            parent_execution_id=d.get("parent_execution_id"),
            tenant_id=d.get("tenant_id") or "default",
            project_id=d.get("project_id") or "default",
            event_id=d["event_id"],
            timestamp=d["timestamp"],
            sequence=d.get("sequence"),
            source=d.get("source") or "",
            entity=d.get("entity") or "",
            schema_version=d.get("schema_version") or SCHEMA_VERSION,
        )
