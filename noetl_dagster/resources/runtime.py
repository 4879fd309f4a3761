"""What a NoETL op does inside a Dagster run.

An op never holds state of its own: it rebuilds the execution's
:class:`~noetl_dagster.engine.control.Engine` from the event log (the state is
the fold of the events), runs the activations of its steps
(``engine.ready(allowed=steps)`` -> ``run`` -> ``route``), and leaves every
decision in the log. So the ops of one run, a re-execution from failure, a
per-step job launched by the sensor and the local runner all continue the same
execution.

In one process the engine is cached per execution and caught up with the log
incrementally (``read(after_sequence)``), so a 50-op run folds the log once,
not 50 times. When another process appended to the execution meanwhile (the
multiprocess executor, per-step runs) the engine is refolded from scratch so
the state always equals the fold of the log in log order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from noetl_dagster.dsl.model import Playbook
from noetl_dagster.engine import events as E
from noetl_dagster.engine.control import Engine, Services
from noetl_dagster.engine.events import Event, uuid7_from
from noetl_dagster.engine.frame import StepRun
from noetl_dagster.engine.replay import verified_events
from noetl_dagster.engine.state import fold
from noetl_dagster.engine.usage import accumulate
from noetl_dagster.storage.payload import is_ref
from noetl_dagster.util.jsonutil import dumps, plain
from noetl_dagster.util.links import TAG_EXECUTION

log = logging.getLogger("noetl_dagster.dagster")

TAG_PLAYBOOK = "noetl/playbook"
TAG_TENANT = "noetl/tenant"
TAG_PROJECT = "noetl/project"
TAG_STATUS = "noetl/status"
TAG_STEP = "noetl/step"
TAG_KIND = "noetl/kind"
TAG_TOKEN = "noetl/token_id"
TAG_MODE = "noetl/mode"

# requested_by prefixes: who drives an execution (the sensor only launches what nobody else drives)
REQUESTED_BY_DAGSTER = "dagster:"
REQUESTED_BY_DETACHED = "detached:"

INLINE_METADATA_LIMIT = 8 * 1024  # bigger results show as a preview; `$ref` results show the reference
MAX_LOGGED_EVENTS_PER_OP = 1000  # then a count; the event log keeps everything


# -- execution ids ---------------------------------------------------------------------
def execution_id_for_run(run: Any) -> str:
    """The run's ``noetl/execution_id`` tag, else an id derived from the root run (stable across re-executions)."""
    eid = run.tags.get(TAG_EXECUTION)
    if eid:
        return str(eid)
    return uuid7_from("dagster-run", run.root_run_id or run.run_id)


# -- Dagster logs for NoETL events ---------------------------------------------------------
class _OpLog:
    """Routes the events of one execution (and its sub-playbooks) to one op's ``context.log``.

    Events reach the log store in batches (the engine appends at step boundaries), so
    each batch becomes one Dagster log message, one line per event starting with its
    NoETL name: a Dagster log entry costs a write to the instance's event log.
    """

    def __init__(self, execution_id: str, logger: Any):
        self.execution_id = execution_id
        self.logger = logger
        self.logged = 0
        self.suppressed = 0
        self.mine: set[str] = set()  # event ids this op appended to its own execution
        self.task_results: list[tuple[str, Any]] = []  # (step, result) of every successful task, in order
        self.usage: dict[str, dict[str, float]] = {}  # step -> summed measured usage of its task attempts
        self.lock = threading.Lock()
        self._lines: list[str] = []
        self._error = False
        self.children: list[
            tuple[str, str, bool]
        ] = []  # (execution_id, playbook, generated) of sub-playbooks

    def on_event(self, ev: Event) -> None:
        with self.lock:
            if ev.execution_id == self.execution_id:
                self.mine.add(ev.event_id)
                if ev.name == E.TASK_DONE:
                    outcome = ev.data.get("outcome") or {}
                    accumulate(
                        self.usage.setdefault(ev.step or "", {}), (outcome.get("meta") or {}).get("usage")
                    )
                    if ev.status == "success":
                        self.task_results.append((ev.step or "", outcome.get("result")))
            if self.logged >= MAX_LOGGED_EVENTS_PER_OP:
                self.suppressed += 1
                return
            self.logged += 1
            msg = describe_event(ev)
            if ev.execution_id != self.execution_id:
                msg = f"[sub-playbook {ev.execution_id[-12:]}] {msg}"
                if ev.name == E.EXECUTION_REQUESTED and ev.parent_execution_id:
                    d = ev.data or {}
                    gen = bool(d.get("ephemeral"))
                    ref = str(d.get("playbook_id") if gen else d.get("playbook") or d.get("path") or "")
                    self.children.append((ev.execution_id, ref, gen))
                    msg += (f"\n{'generated ' if gen else ''}child execution {ev.execution_id} ({ref}) "
                            f"of {ev.parent_execution_id}, runs inside this op")  # fmt: skip
            self._lines.append(msg)
            self._error = self._error or ev.status == "error"

    def flush(self) -> None:
        with self.lock:
            lines, error = self._lines, self._error
            self._lines, self._error = [], False
        if not lines:
            return
        try:
            (self.logger.error if error else self.logger.info)("\n".join(lines))
        except Exception:  # noqa: BLE001 - logging never breaks an execution
            pass

    def close(self) -> None:
        self.flush()
        if self.suppressed:
            try:
                self.logger.info(
                    f"... {self.suppressed} more NoETL events of this op not shown here "
                    f"(all are in the event log: noetl-dagster events {self.execution_id})"
                )
            except Exception:  # noqa: BLE001
                pass


_active_lock = threading.Lock()
_ACTIVE: dict[str, _OpLog] = {}


def dagster_log_listener(ev: Event) -> None:
    """EventStore listener installed in the resource's services: forwards to the op running the execution."""
    target = _ACTIVE.get(ev.execution_id)
    if target is None and ev.parent_execution_id:
        target = _ACTIVE.get(ev.parent_execution_id)
        if target is not None:
            with _active_lock:
                _ACTIVE[ev.execution_id] = target  # sub-playbook events go to the parent's op
    if target is not None:
        target.on_event(ev)


def child_tags(children: list[tuple[str, str, bool]]) -> dict[str, str]:
    """Run tags naming the sub-executions an op ran (a child runs inside its parent's op, never as a run
    of its own): ``noetl/child_executions`` and, for generated ones, ``noetl/generated_playbooks``."""
    tags = {"noetl/child_executions": ",".join(c[0] for c in children)}
    gen = [c[1] for c in children if c[2]]
    if gen:
        tags["noetl/generated_playbooks"] = ",".join(gen)
    return tags


@contextlib.contextmanager
def op_log(execution_id: str, logger: Any, tag_run: Any = None) -> Iterator[_OpLog]:
    """``tag_run(tags)``, when given, tags the Dagster run with the sub-executions the op ran."""
    sink = _OpLog(execution_id, logger)
    with _active_lock:
        _ACTIVE[execution_id] = sink
    try:
        yield sink
    finally:
        with _active_lock:
            for k in [k for k, v in _ACTIVE.items() if v is sink]:
                del _ACTIVE[k]
        sink.close()
        if tag_run is not None and sink.children:
            try:
                tag_run(child_tags(sink.children))
            except Exception:  # noqa: BLE001 - a tag is informational
                pass


def describe_event(ev: Event) -> str:
    d = ev.data or {}
    where = ev.step or ""
    if ev.iteration is not None:
        where += f"[{ev.iteration}]"
    name = ev.name
    if name in (E.TASK_STARTED, E.TASK_DONE):
        where += f".{d.get('task')}"
        if name == E.TASK_STARTED:
            return f"{name} {where} kind={d.get('kind')} attempt={ev.attempt}"
        out = d.get("outcome") or {}
        meta = out.get("meta") or {}
        msg = f"{name} {where} {out.get('status')} -> {d.get('directive')} ({meta.get('duration_ms')} ms)"
        if out.get("status") == "error":
            err = out.get("error") or {}
            msg += f": {err.get('kind')}: {err.get('message')}"
        return msg
    if name == E.TOKEN_ENQUEUED:
        return f"{name} -> {d.get('step')} from {d.get('from_step') or '(entry)'} token={d.get('token_id')}"
    if name == E.NEXT_EVALUATED:
        fired = ", ".join(f["step"] for f in d.get("fired", [])) or "nothing"
        extra = " (unhandled failure)" if d.get("unhandled_failure") else ""
        errs = f"; errors: {d['errors']}" if d.get("errors") else ""
        return f"{name} {where} on {d.get('event_name')}: fired {fired}{extra}{errs}"
    if name == E.STEP_FAILED:
        err = d.get("error") or {}
        return f"{name} {where}: {err.get('kind')}: {err.get('message')}"
    if name == E.STEP_DONE:
        return f"{name} {where} ({d.get('duration_ms')} ms)"
    if name == E.STEP_SKIPPED:
        return f"{name} {where}: {d.get('reason')}"
    if name == E.LOOP_STARTED:
        return f"{name} {where} total={d.get('total')} mode={d.get('mode')}"
    if name == E.LOOP_DONE:
        res = d.get("result")
        stats = res.get("stats") if isinstance(res, dict) else None
        return f"{name} {where} {stats or ''}"
    if name == E.CTX_PATCHED:
        return f"{name} {where} keys={sorted((d.get('patch') or {}).keys())}"
    if name in (E.WORKFLOW_FINISHED, E.PLAYBOOK_PROCESSED):
        return f"{name} status={d.get('status')}"
    if name == E.WORKFLOW_STARTED:
        return f"{name} entry={d.get('entry')}"
    if name == E.EXECUTION_REQUESTED:
        return f"{name} playbook={d.get('playbook')} by={d.get('requested_by')}"
    return f"{name} {where}".rstrip()


# -- engines rebuilt from the log ----------------------------------------------------------
@dataclass
class _Cached:
    engine: Engine
    synced: int  # every event with sequence <= synced is folded into engine.state


_cache_lock = threading.Lock()
_ENGINES: OrderedDict[tuple[int, str], _Cached] = OrderedDict()
MAX_CACHED_ENGINES = 32


def _new_engine(pb: Playbook, svc: Services, eid: str, events: list[Event]) -> Engine:
    state = fold(events, svc.offloader.resolve)
    svc = services_of_execution(svc, events[0])
    if pb.base_dir:
        svc.catalog.add_dir(pb.base_dir)
    return Engine(pb, svc, execution_id=eid, state=state)


def services_of_execution(svc: Services, first: Event) -> Services:
    """One tenant/project for a whole execution: the one its request recorded (a detached request from
    another tenant keeps its own, whichever code location's runs continue it)."""
    tenant, project = first.tenant_id or svc.tenant, first.project_id or svc.project
    if (tenant, project) == (svc.tenant, svc.project):
        return svc
    return dataclasses.replace(svc, tenant=tenant, project=project)


def attach(pb: Playbook, svc: Services, eid: str) -> Engine | None:
    """The execution's engine, caught up with the log; None when the log has no such execution."""
    key = (id(svc), eid)
    with _cache_lock:
        cached = _ENGINES.get(key)
        if cached is not None:
            _ENGINES.move_to_end(key)
    if cached is not None and cached.engine.playbook is pb:
        new = svc.event_store.read(eid, after_sequence=cached.synced)
        for ev in new:
            cached.engine.state.apply(ev)
        if new:
            cached.synced = new[-1].sequence or cached.synced
        return cached.engine
    try:  # a whole log folded (a sensor's resume, a run's first op): its hash chain verified first
        events = verified_events(svc.event_store, eid)
    except KeyError:
        return None
    eng = _new_engine(pb, svc, eid, events)
    _remember(key, _Cached(eng, events[-1].sequence or 0))
    return eng


def _remember(key: tuple[int, str], entry: _Cached) -> None:
    evicted: list[_Cached] = []
    with _cache_lock:
        old = _ENGINES.pop(key, None)
        if old is not None and old.engine is not entry.engine:
            evicted.append(old)
        _ENGINES[key] = entry
        while len(_ENGINES) > MAX_CACHED_ENGINES:
            evicted.append(_ENGINES.popitem(last=False)[1])
    for e in evicted:
        e.engine.close_resources()


def register_engine(eng: Engine) -> None:
    """Cache an engine this process just started (its whole state is in the log already)."""
    _remember((id(eng.services), eng.execution_id), _Cached(eng, eng.state.sequence))


def forget(svc: Services, eid: str) -> None:
    with _cache_lock:
        cached = _ENGINES.pop((id(svc), eid), None)
    if cached is not None:
        cached.engine.close_resources()


def forget_engines() -> None:
    with _cache_lock:
        entries = list(_ENGINES.values())
        _ENGINES.clear()
    for e in entries:
        e.engine.close_resources()


def sync(eng: Engine, mine: set[str]) -> Engine:
    """Fold what other processes appended during this op; refold from scratch if they interleaved with us."""
    svc = eng.services
    key = (id(svc), eng.execution_id)
    with _cache_lock:
        cached = _ENGINES.get(key)
    synced = cached.synced if cached is not None and cached.engine is eng else 0
    new = svc.event_store.read(eng.execution_id, after_sequence=synced)
    foreign = [ev for ev in new if ev.event_id not in mine]
    if not foreign:
        if new:
            _remember(key, _Cached(eng, new[-1].sequence or synced))
        return eng
    events = verified_events(svc.event_store, eng.execution_id)
    fresh = _new_engine(eng.playbook, svc, eng.execution_id, events)
    fresh._resources = eng._resources  # keep the execution's shared connections (in-memory DuckDB)
    eng._resources = {}
    _remember(key, _Cached(fresh, events[-1].sequence or 0))
    return fresh


@contextlib.contextmanager
def execution_lock(locks_dir: Path, eid: str) -> Iterator[None]:
    """An exclusive lock per execution across processes of this machine (finishing happens once)."""
    path = locks_dir / f"{eid}.lock"
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# -- one op's work -------------------------------------------------------------------------
@dataclass
class StepOutcome:
    step: str
    step_run_id: str
    ok: bool
    error: dict[str, Any] | None
    unhandled: bool  # failed and no arc routed the failure: it fails the execution (and the op)


@dataclass
class OpReport:
    execution_id: str
    engine: Engine | None
    outcomes: list[StepOutcome] = field(default_factory=list)
    finished: str | None = None  # final status when this op finished the execution
    recovered: list[str] = field(default_factory=list)  # step runs re-run after a crash
    task_results: list[tuple[str, Any]] = field(default_factory=list)  # (step, result) of successful tasks
    usage: dict[str, dict[str, float]] = field(
        default_factory=dict
    )  # step -> measured usage (engine/usage.py)

    @property
    def unhandled(self) -> list[StepOutcome]:
        return [o for o in self.outcomes if o.unhandled]

    def pending_steps(self) -> set[str]:
        return work_steps(self.engine.state) if self.engine is not None else set()


def work_steps(st: Any) -> set[str]:
    """Steps with work in the log: pending tokens, unfinished step runs, finished runs never routed."""
    out = {t.step for t in st.tokens.values()} | set(st.running.values())
    out.update(st.step_runs[r]["step"] for r in st.unrouted_runs())
    return out


def run_steps(
    pb: Playbook,
    svc: Services,
    eid: str,
    steps: tuple[str, ...],
    *,
    logger: Any,
    locks_dir: Path,
    region: bool = False,
    on_finish: Callable[[str], None] | None = None,
    tag_run: Callable[[dict[str, str]], None] | None = None,
) -> OpReport:
    """Run every activation of ``steps`` the log holds (recovering crashed step runs first)."""
    report = OpReport(eid, None)
    with op_log(eid, logger, tag_run) as sink:
        try:
            eng = attach(pb, svc, eid)
            if eng is None:
                raise LookupError(
                    f"execution {eid} is not in the event log {svc.event_store.url}; it starts with the job's "
                    "noetl_start op (or `noetl-dagster run --runner dagster --detach`)"
                )
            report.engine = eng
            if eng.state.finished:
                logger.info(
                    f"execution {eid} already {eng.state.status}; nothing to run for {', '.join(steps)}"
                )
                return report

            def record(run: StepRun, fired: list[tuple[str, str]] | None = None) -> None:
                unhandled = not run.ok and (not fired if fired is not None else eng.state.failed)
                report.outcomes.append(StepOutcome(run.step, run.step_run_id, run.ok, run.error, unhandled))

            # step runs a dead run left behind: routed if they finished, run again (same id) if not
            report.recovered = eng.recover(on_step=record, allowed=steps)
            if report.recovered:
                logger.warning(
                    f"recovered step run(s) {', '.join(report.recovered)} left by a run that did not finish"
                )
                sink.flush()
            while True:
                acts = eng.ready(steps)
                if not acts:
                    break
                for act in acts:  # one Dagster log message per activation: scheduled .. routed
                    run = eng.run(act)
                    record(run, eng.route(run))
                    eng.recorder.flush()  # each activation durable (its Dagster log lines follow the log)
                    sink.flush()
                if not region:
                    break
            eng.recorder.flush()  # admission skips are buffered until the next durable append
            report.task_results = sink.task_results
            report.usage = sink.usage
            eng = sync(eng, sink.mine)
            report.engine = eng
            if eng.is_done() and not eng.state.finished:
                with execution_lock(locks_dir, eid):
                    eng = sync(eng, sink.mine)
                    report.engine = eng
                    if eng.is_done() and not eng.state.finished:
                        report.finished = eng.finish()
                if report.finished:
                    if on_finish:
                        on_finish(report.finished)
                    forget(svc, eid)
            return report
        except BaseException:
            forget(svc, eid)  # the cached state may hold events that never reached the log
            raise


def start_execution(
    pb: Playbook,
    svc: Services,
    eid: str,
    workload: dict[str, Any] | None,
    *,
    requested_by: str,
    logger: Any,
    nominal_time: str | None = None,
) -> tuple[Engine, bool]:
    """Record the request and the entry token unless the execution already exists; (engine, started)."""
    with op_log(eid, logger):
        eng = attach(pb, svc, eid)
        if eng is not None:
            if eng.state.playbook and eng.state.playbook != pb.metadata.path:
                raise ValueError(
                    f"execution {eid} belongs to playbook {eng.state.playbook!r}, not {pb.metadata.path!r}"
                )
            return eng, False
        if pb.base_dir:
            svc.catalog.add_dir(pb.base_dir)
        eng = Engine(pb, svc, execution_id=eid)
        try:
            eng.start(workload or {}, requested_by=requested_by, nominal_time=nominal_time)
        except BaseException:
            forget(svc, eid)
            raise
        register_engine(eng)
        return eng, True


# -- what an op shows ------------------------------------------------------------------------
def result_metadata(eng: Engine, step: str) -> dict[str, Any]:
    """Dagster output metadata for a step's last result: inline when small, its reference otherwise."""
    import dagster as dg  # noqa: PLC0415 - keep the module importable without Dagster for the planner

    st = eng.state
    recorded = st.results.get(step)
    md: dict[str, Any] = {
        "noetl/step": step,
        "noetl/status": st.step_status.get(step, "pending"),
        "noetl/runs": st.runs.get(step, 0),
    }
    if is_ref(recorded):
        ref = recorded["$ref"]
        md["result_ref"] = dg.MetadataValue.text(str(ref.get("uri")))
        for k in ("size", "rows", "checksum", "format", "store"):
            if ref.get(k) is not None:
                md[f"result_ref_{k}"] = (
                    ref[k] if isinstance(ref[k], int) else dg.MetadataValue.text(str(ref[k]))
                )
        return md
    value = plain(recorded)
    text = dumps(value)
    if len(text) <= INLINE_METADATA_LIMIT:
        if isinstance(value, (dict, list)):
            md["result"] = dg.MetadataValue.json(value)
        else:
            md["result"] = dg.MetadataValue.text(text)
    else:
        md["result_preview"] = dg.MetadataValue.text(text[:2000] + " ...")
        md["result_size"] = len(text)
    return md


def error_text(err: dict[str, Any] | None) -> str:
    if not err:
        return "failed"
    return f"{err.get('kind') or 'error'}: {err.get('message')}"


def json_safe(value: Any) -> Any:
    return json.loads(dumps(plain(value)))
