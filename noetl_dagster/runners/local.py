"""The local runner: drives the engine in-process (the reference for every other runner)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from noetl_dagster.dsl.shapes import PlaybookBase  # the model or its twin (dsl/ready.py)
from noetl_dagster.engine.catalog import Catalog
from noetl_dagster.engine.control import Engine, Services, restore_generated
from noetl_dagster.engine.durability import UNRECORDED_DIR, record_failure, sweep_payloads
from noetl_dagster.engine.events import Event
from noetl_dagster.engine.frame import StepRun
from noetl_dagster.engine.ports import EventStore, ExecutionLeased
from noetl_dagster.engine.recorder import Recorder
from noetl_dagster.engine.replay import verified_events
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.storage.locator import RefRefused
from noetl_dagster.storage.offload import Offloader
from noetl_dagster.storage.payload import DEFAULT_INLINE_LIMIT, open_payload_store
from noetl_dagster.tools.cursor_sources import default_cursor_sources
from noetl_dagster.tools.sandbox_worker import SandboxPort
from noetl_dagster.util.jsonutil import plain
from noetl_lineage import listener_from_env

if TYPE_CHECKING:
    from noetl_dagster.dsl.model import Playbook

# Called with (engine) after every execution finishes; tests use it to replay each execution.
FINISHED_HOOKS: list[Callable[[Engine], None]] = []


def load_playbook(path: str | os.PathLike[str]) -> Playbook:
    """The file parser (PyYAML), imported when a run is given a path (``run`` passes a parsed playbook)."""
    from noetl_dagster.dsl.files import load_playbook as parse  # noqa: PLC0415

    return parse(path)


def default_data_dir() -> Path:
    return Path(os.environ.get("NOETL_DAGSTER_HOME", ".noetl"))


@dataclass
class ExecutionResult:
    execution_id: str
    status: str
    ctx: dict[str, Any]
    results: dict[str, Any]
    runs: dict[str, int]
    event_store_url: str = ""
    playbook: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The stable ``--json`` shape of SEMANTICS.md §8."""
        return {
            "execution_id": self.execution_id,
            "status": self.status,
            "ctx": plain(self.ctx),
            "results": plain(self.results),
            "runs": dict(self.runs),
        }

    @classmethod
    def from_engine(cls, eng: Engine) -> ExecutionResult:
        st = eng.state
        return cls(
            execution_id=st.execution_id,
            status=st.status,
            ctx=dict(st.ctx),
            results=readable_results(st),
            runs=dict(st.runs),
            event_store_url=eng.services.event_store.url,
            playbook=eng.playbook.metadata.path,
            extra={"error": st.error}
            if st.error
            else {},  # the engine's gate ended it (durability.Driver._crashed)
        )


def readable_results(st: Any) -> dict[str, Any]:
    """Each step's result as its execution may read it: a reference the locator refuses (a task's
    own ``$ref`` to another tenant's payload) stays the reference, with status ``refused``."""
    out = {}
    for s in st.results:
        try:
            out[s] = st.result(s)
        except RefRefused:
            out[s] = {**st.results[s], "status": "refused"}
    return out


def _listeners_from_env() -> list[Callable[[Event], None]]:
    try:
        listener = listener_from_env()
    except Exception:  # noqa: BLE001 - lineage never stops a playbook
        return []
    return [listener] if listener else []


def build_services(
    *,
    event_store: EventStore | str | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    catalog_dirs: Iterable[str | os.PathLike[str]] = (),
    tenant: str = "default",
    project: str = "default",
    listeners: Iterable[Callable[[Event], None]] = (),
    logger: Callable[[str], None] | None = None,
    inline_limit: int = DEFAULT_INLINE_LIMIT,
    payload_store: Any = None,
    dispatch: Any = None,
) -> Services:
    """``dispatch``: the worker pool tool calls go to (engine.ports.ToolDispatch); default the one
    ``$NOETL_TOOL_DISPATCH`` names (tools/command_queue.py), else every kind runs in this process."""
    ddir = Path(data_dir) if data_dir else default_data_dir()
    store = (
        event_store if isinstance(event_store, EventStore) else open_event_store(event_store, data_dir=ddir)
    )
    # $NOETL_PAYLOAD_STORE_URL (any scheme of the payload registry: s3://, gs://, azure://, …), else <data dir>/payloads
    payloads = payload_store or open_payload_store(None, data_dir=ddir)
    try:  # made now, while the disk has room: durability.Driver._crashed marks in it when it cannot record
        (ddir / UNRECORDED_DIR).mkdir(parents=True, exist_ok=True)
    except OSError:
        pass
    return Services(
        event_store=store,
        offloader=Offloader(payloads, inline_limit, data_dir=ddir),
        data_dir=ddir,
        catalog=Catalog(catalog_dirs),
        tenant=tenant,
        project=project,
        listeners=[*listeners, *_listeners_from_env()],
        logger=logger,
        cursor_sources=default_cursor_sources(),
        sandbox=SandboxPort(),
        dispatch=dispatch if dispatch is not None else _dispatch_from_env(),
    )


def _dispatch_from_env() -> Any:
    if not os.environ.get("NOETL_TOOL_DISPATCH"):
        return None
    from noetl_dagster.tools.command_queue import dispatch_from_env  # noqa: PLC0415 - pool users only

    return dispatch_from_env()


def reap_unrecorded(svc: Services) -> list[str]:
    """At a start: end the executions a process could not record the failure of (a full disk;
    durability.Driver._crashed left a mark) once no live process holds their lease: their step runs left
    running fail, the execution ends ``failed`` and its payloads no event references are deleted.
    Returns the execution ids ended."""
    from noetl_dagster.engine.state import fold

    try:
        marks = sorted(p for p in (Path(svc.data_dir) / UNRECORDED_DIR).iterdir() if p.is_file())
    except OSError:
        return []
    ended: list[str] = []
    for mark in marks:
        eid = mark.name
        try:
            svc.event_store.acquire_lease(eid)
        except ExecutionLeased:  # its process still lives (or another start is reaping it)
            continue
        try:
            events = svc.event_store.read(eid)
            if not events:  # not in this event store: left for a start that opens that one
                continue
            first = events[0]
            state = fold(events, svc.offloader.resolve)
            if not state.finished:
                rec = Recorder(state, svc.event_store, svc.offloader, tenant=first.tenant_id,
                               project=first.project_id, parent_execution_id=first.parent_execution_id)  # fmt: skip
                rec.closing = True
                err = {"kind": "unrecorded", "message": "the process running this execution could not record its "
                       "events (a full disk?) and stopped; marked failed at the next start", "retryable": False,
                       "code": None}  # fmt: skip
                record_failure(rec, err, list(state.running))
            sweep_payloads(svc, eid, first.tenant_id, first.project_id)
            mark.unlink(missing_ok=True)
            ended.append(eid)
        finally:
            svc.event_store.release_lease(eid)
    return ended


def resume_execution(
    execution_id: str,
    *,
    playbook: Playbook | str | os.PathLike[str] | None = None,
    services: Services | None = None,
    event_store: EventStore | str | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    catalog_dirs: Iterable[str | os.PathLike[str]] = (),
    on_step: Callable[[StepRun], None] | None = None,
) -> ExecutionResult:
    """Finish an execution whose process died, from its event log (see Engine.recover)."""
    from noetl_dagster.engine.state import fold

    svc = services or build_services(event_store=event_store, data_dir=data_dir, catalog_dirs=catalog_dirs)
    reap_unrecorded(svc)
    events = verified_events(svc.event_store, execution_id)  # an altered log is refused (ChainBroken)
    state = fold(events, svc.offloader.resolve)
    req = next((e for e in events if e.name == "playbook.execution.requested"), None)
    definition = (req.data.get("definition") if req else None) or ""
    if playbook is None and definition:  # a generated playbook: its canonical YAML is on its request
        from noetl_dagster.dsl.loader import load_yaml_text  # noqa: PLC0415 - PyYAML for generated playbooks only
        from noetl_dagster.dsl.parse import load_playbook_dict  # noqa: PLC0415 - the parser: not on a cached run

        raw, sm = load_yaml_text(str(definition), f"<generated {req.data.get('playbook_id')}>")
        playbook = load_playbook_dict(raw, source_map=sm)
    if playbook is None:
        path = (req.data.get("file") if req else None) or ""
        if not path or not Path(path).is_file():
            raise FileNotFoundError(
                f"execution {execution_id}: its playbook file {path!r} is not available; pass it"
            )
        playbook = path
    pb = playbook if isinstance(playbook, PlaybookBase) else load_playbook(playbook)
    if pb.base_dir:
        svc.catalog.add_dir(pb.base_dir)
    first = events[0]
    svc.tenant, svc.project = first.tenant_id, first.project_id
    if state.finished:
        eng = Engine(pb, svc, state=state, parent_execution_id=first.parent_execution_id)
        restore_generated(eng, req.data if req else {})
        return _finished(eng)
    # one resume at a time per execution: a second one is refused (ExecutionLeased) while this one lives
    svc.event_store.acquire_lease(execution_id)
    try:
        # re-read under the lease: a previous resume may have run
        events = verified_events(svc.event_store, execution_id)
        state = fold(events, svc.offloader.resolve)
        eng = Engine(pb, svc, state=state, parent_execution_id=first.parent_execution_id)
        restore_generated(eng, req.data if req else {})  # a generated child keeps its trust boundary
        if not state.finished:
            eng.recover(on_step)
            eng.drive(on_step)
    finally:
        svc.event_store.release_lease(execution_id)
    return _finished(eng)


def _finished(eng: Engine) -> ExecutionResult:
    for hook in FINISHED_HOOKS:
        hook(eng)
    return ExecutionResult.from_engine(eng)


def run_playbook(
    playbook: Playbook | str | os.PathLike[str],
    workload: Mapping[str, Any] | None = None,
    *,
    event_store: EventStore | str | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    catalog_dirs: Iterable[str | os.PathLike[str]] = (),
    tenant: str = "default",
    project: str = "default",
    listeners: Iterable[Callable[[Event], None]] = (),
    on_step: Callable[[StepRun], None] | None = None,
    logger: Callable[[str], None] | None = None,
    execution_id: str | None = None,
    services: Services | None = None,
    select: Iterable[str] | None = None,
    requested_by: str = "cli",
    reuse: Mapping[str, Any] | None = None,
    durable: bool = False,
) -> ExecutionResult:
    """Run a playbook to completion in this process and return its summary.

    ``durable`` (``run --durable``): every step boundary a commit, every barrier an fsync.

    ``select``: run only these steps (each other step is skipped, reason "not selected"; see
    ``StepGraph.needed_for`` for the steps a set of targets needs). ``reuse``: ``{step: {"execution_id",
    "result"}}``, steps that do not run again: the result an earlier execution recorded routes on."""
    if isinstance(playbook, PlaybookBase):
        # built in Python (no source file): validate it like a file would be (raises PlaybookInvalid)
        if playbook.source_file:
            pb = playbook
        else:
            from noetl_dagster.dsl.parse import check_playbook  # noqa: PLC0415 - the parser: not on a cached run

            pb = check_playbook(playbook)
    else:
        pb = load_playbook(playbook)
    svc = services or build_services(
        event_store=event_store,
        data_dir=data_dir,
        catalog_dirs=catalog_dirs,
        tenant=tenant,
        project=project,
        listeners=listeners,
        logger=logger,
    )
    if durable:
        svc.durable = True
    if pb.base_dir:
        svc.catalog.add_dir(pb.base_dir)
    reap_unrecorded(svc)
    eng = Engine(pb, svc, execution_id=execution_id)
    eng.start(
        workload,
        requested_by=requested_by,
        request={"select": sorted(select), **({"reuse": dict(reuse)} if reuse else {})}
        if select is not None
        else None,
    )
    eng.drive(on_step)
    return _finished(eng)
