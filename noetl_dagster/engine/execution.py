"""What one execution runs against and how the engine's parts see the engine.

:class:`Services` and :class:`Activation` are the control plane's values; :class:`ExecutionEngine` is
``control.Engine`` as the data plane (``worker``, ``loops``) and the driving gate (``durability``)
use it. They type against this Protocol, not against ``control`` (which imports them): the engine
has no import circle, annotations included (tests/architecture/test_layers.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from noetl_dagster.engine.ports import EventStore, ResultOffloader

if TYPE_CHECKING:
    from noetl_dagster.dsl.model import Playbook, Step
    from noetl_dagster.engine.events import Event
    from noetl_dagster.engine.recorder import Recorder
    from noetl_dagster.engine.state import ExecutionState
    from noetl_dagster.engine.trust import Gate


@dataclass
class Services:
    """What an execution runs against (shared with its child executions)."""

    event_store: EventStore
    offloader: ResultOffloader
    data_dir: Path
    catalog: Any  # noetl_dagster.engine.catalog.Catalog
    tenant: str = "default"
    project: str = "default"
    listeners: list[Callable[[Event], None]] = field(default_factory=list)
    logger: Callable[[str], None] | None = None
    keychain_factory: Callable[[Playbook], Any] | None = None
    # loop.cursor drivers by kind (engine.ports.CursorOpener), wired by the runner
    cursor_sources: dict[str, Any] = field(default_factory=dict)
    # in-process kinds of a sandboxed execution run in its worker (engine.ports.SandboxPort); wired by
    # the runner, and a sandboxed execution without one fails its tasks (closed, never unconfined)
    sandbox: Any = None
    # tool calls of some kinds go to a worker pool (engine.ports.ToolDispatch, e.g. the NATS command
    # queue of tools/dispatch_nats.py); None: every kind runs in this process
    dispatch: Any = None
    # --durable: every step boundary is a commit and every barrier an fsync (engine.recorder); by
    # default pure steps between two durability barriers are one commit
    durable: bool = False


@dataclass
class Activation:
    step: str
    step_run_id: str
    token_ids: list[str]
    args: Any


class ExecutionEngine(Protocol):
    """``control.Engine`` as worker, loops and durability see it."""

    playbook: Playbook
    services: Services
    state: ExecutionState
    recorder: Recorder
    worker: Any  # engine.worker.Worker
    gate: Gate | None
    isolation: str | None
    usage_window: Any
    depth: int
    _steps: dict[str, Step]

    @property
    def execution_id(self) -> str: ...

    def log(self, message: str) -> None: ...

    def patch_ctx(self, patch: dict[str, Any], *, source: str, **fields: Any) -> None: ...

    def before_effect(self, step_run_id: str) -> None: ...

    def resource(self, key: str, factory: Callable[[], Any]) -> Any: ...

    def credential(self, name: str) -> dict[str, Any]: ...

    def keychain_namespace(self) -> Any: ...

    def run_child(self, path: str, workload: dict[str, Any], **kw: Any) -> dict[str, Any]: ...

    def close_resources(self) -> None: ...
