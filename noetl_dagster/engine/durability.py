"""No execution is left running (issue 29; DESIGN.md "Guarantees at one gate").

:class:`Driver` is the engine's driving API - ``start``, ``ready``, ``run``, ``route``,
``finish``, ``recover``, ``run_until_quiescent``, ``drive`` - which every runner (local,
Dagster ops, loop frames) calls; each is one gate: an exception escaping the engine's own
code ends the execution ``failed`` through :meth:`Driver._crashed`, so no path leaves it
``running``. Resume (:func:`resume_point`) records nothing the log already holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from noetl_dagster.engine import events as E
from noetl_dagster.engine.frame import StepRun
from noetl_dagster.engine.recorder import (
    EventTooLarge,
    Recorder,
    RecordingFailed,
    TooManyEvents,
    payload_prefix,
    ref_uris,
)
from noetl_dagster.engine.state import ExecutionState, fold
from noetl_dagster.util.lazylog import LazyLogger

if TYPE_CHECKING:
    from noetl_dagster.engine.execution import Activation, Services
    from noetl_dagster.engine.execution import ExecutionEngine as Engine

log = LazyLogger("noetl_dagster.engine")
UNRECORDED_DIR = "unrecorded"  # under the data dir: executions whose failure could not be recorded


class Driver:
    """Mixed into control.Engine (which provides ``_start``, ``_ready``, ``_run``, ``_route``,
    ``_finish`` and ``_recover``): the public driving API, each method a gate."""

    state: ExecutionState
    recorder: Recorder
    services: Services

    def start(
        self,
        workload: Mapping[str, Any] | None = None,
        *,
        requested_by: str = "cli",
        nominal_time: str | None = None,
        request: Mapping[str, Any] | None = None,
    ) -> None:
        """Record the request, merge the workload (shallow override) and enqueue the entry token.

        ``nominal_time`` (ISO 8601) is the time a scheduled execution stands for."""
        try:
            self._start(workload, requested_by=requested_by, nominal_time=nominal_time, request=request)
        except Exception as e:  # noqa: BLE001 - the gate (see _crashed)
            self._crashed(e)

    def ready(self, allowed: Iterable[str] | None = None) -> list[Activation]:
        """Schedule every runnable activation: admission, then step.scheduled (or step.skipped).

        The step-run cap is counted here, before scheduling: once ``max_step_runs`` step runs exist,
        one more is scheduled (it fails with ``max_step_runs`` in run, and its routing drops every
        token left) and nothing after it, whatever the fan-out."""
        if self.state.finished:
            return []
        try:
            return self._ready(allowed)
        except Exception as e:  # noqa: BLE001 - the gate (see _crashed)
            self._crashed(e)
            return []

    def run(self, act: Activation) -> StepRun:
        if self.state.finished:  # a crash ended the execution (see _crashed): nothing runs after it
            return StepRun(
                act.step, act.step_run_id, False, None, _finished_error(self), "call.error", act.args
            )
        try:
            return self._run(act)
        except Exception as e:  # noqa: BLE001 - the gate (see _crashed)
            err = self._crashed(e, act.step_run_id)
            return StepRun(act.step, act.step_run_id, False, None, err, "call.error", act.args)

    def route(self, run: StepRun) -> list[tuple[str, str]]:
        """Evaluate ``next`` on a terminal step event; enqueue tokens; return [(token_id, step)]."""
        if self.state.finished:
            return []
        try:
            return self._route(run)
        except Exception as e:  # noqa: BLE001 - the gate (see _crashed)
            self._crashed(e, run.step_run_id)
            return []

    def finish(self) -> str:
        """Record the terminal pair once nothing remains; returns the final status."""
        if self.state.finished:
            return self.state.status
        try:
            return self._finish()
        except Exception as e:  # noqa: BLE001 - the gate (see _crashed)
            self._crashed(e)
            return self.state.status

    def run_until_quiescent(
        self, allowed: Iterable[str] | None = None, on_step: Callable[[StepRun], None] | None = None
    ) -> None:
        """Run activations (restricted to ``allowed`` steps) until none is runnable."""
        allowed_list = list(allowed) if allowed is not None else None
        while True:
            acts = self.ready(allowed_list)
            if not acts:
                return
            for act in acts:
                run = self.run(act)
                self.route(run)
                if on_step:
                    on_step(run)

    def recover(
        self, on_step: Callable[[StepRun], None] | None = None, allowed: Iterable[str] | None = None
    ) -> list[str]:
        """Continue an execution whose process died, from its durable events alone.

        Finished-but-unrouted step runs are routed; step runs that were scheduled
        but never finished run again under their recorded ``step_run_id`` (so they
        are not counted twice); nothing that had finished runs again. ``allowed``
        restricts recovery to those steps (a Dagster op recovers only its own).
        Returns the step runs it resumed.
        """
        if self.state.finished:
            return []
        try:
            resumed = self._recover(on_step, allowed)
            self.recorder.flush()  # what recovery recorded is durable before anything else runs
            return resumed
        except Exception as e:  # noqa: BLE001 - the gate (see _crashed)
            self._crashed(e)
            return []

    def resume_run(self, step_run_id: str, step_name: str, args: Any) -> StepRun:
        """A step run its dead process left running, run again under its id. What the log holds
        of it is not recorded again: not its step.started, not its loop's loop.started; finished
        iterations keep their logged results and do not run again, and one that had started runs
        again without a second loop.iteration.started (docs/events.md: what is at-least-once)."""
        if self.state.finished:
            return StepRun(step_name, step_run_id, False, None, _finished_error(self), "call.error", args)
        try:
            point = resume_point(self, step_run_id)
            return self.worker.run_step(self._steps[step_name], step_run_id, args, resume=point)
        except Exception as e:  # noqa: BLE001 - the gate (see _crashed)
            err = self._crashed(e, step_run_id)
            return StepRun(step_name, step_run_id, False, None, err, "call.error", args)

    # -- the gate: no execution is left running ---------------------------------------------
    def _crashed(self, exc: BaseException, step_run_id: str | None = None) -> dict[str, Any]:
        """The one place an exception escaping the engine's own code ends the execution (a tool's
        or a template's is an error outcome already, see Worker): a bug, MemoryError, an event the
        store refuses (too big, disk full), max_events. The events the store took are kept; a
        batch it refused is dropped with its payloads and the state is rebuilt from the log (what
        was not durable did not happen); then the step run fails with this error and the
        execution ends ``failed`` (workflow.finished, playbook.processed), and the execution's
        payloads no event references are deleted. When even that cannot be recorded, the
        execution is marked unrecorded for the next start (runners.local.reap_unrecorded) and
        RecordingFailed is raised. Returns the error."""
        err = crash_error(exc)
        rec = self.recorder
        rec.closing = True  # the failure record may pass max_events
        log.info("execution %s: %s", self.execution_id, err["message"])  # the CLI prints the one line
        try:
            refused = None
            try:
                rec.flush()  # what the step recorded so far, when the store takes it
            except Exception:  # noqa: BLE001 - refused: drop it, the log is the truth
                rec.discard()
                refused = rec.refused_step_run  # the step run whose event it refused fails too
                self._resync()
            self._record_failure(err, step_run_id, refused)
        except Exception as e:  # noqa: BLE001 - cannot record at all (disk full)
            rec.discard()
            mark_unrecorded(self.services.data_dir, self.execution_id)
            raise RecordingFailed(
                f"execution {self.execution_id} failed ({err['message']}) and the failure cannot be recorded "
                f"({type(e).__name__}: {str(e)[:200]}); the next run or resume marks it failed"
            ) from None
        try:
            sweep_payloads(self.services, self.execution_id, self.recorder.tenant, self.recorder.project)
        except Exception:  # noqa: BLE001, S110 - best effort (the next start sweeps again)
            pass
        return err

    def _resync(self) -> None:
        """The state as the log holds it (after the store refused a batch that was already folded)."""
        resolver = self.services.offloader.resolve
        events = self.services.event_store.read(self.execution_id)
        st = fold(events, resolver) if events else ExecutionState(self.execution_id, resolver)
        st.parent_execution_id = st.parent_execution_id or self.recorder.parent_execution_id
        self.state = self.recorder.state = st

    def _record_failure(
        self, err: dict[str, Any], step_run_id: str | None, refused: str | None = None
    ) -> None:
        st, rec, eid = self.state, self.recorder, self.execution_id
        if st.finished:
            return
        if st.status == "new":  # nothing was durable: the request first, so the log reads as usual
            pb = self.playbook
            rec.emit(E.EXECUTION_REQUESTED, entity_id=eid, data={"playbook": pb.metadata.path, "name": pb.metadata.name,
                     "file": pb.source_file, "workload": {}, "parent_execution_id": rec.parent_execution_id,
                     "requested_by": "engine"})  # fmt: skip
        record_failure(rec, err, list(dict.fromkeys(x for x in (refused, step_run_id) if x)))

    def drive(self, on_step: Callable[[StepRun], None] | None = None) -> str:
        try:
            self.run_until_quiescent(None, on_step)
            return self.finish()
        finally:
            self.close_resources()


def crash_error(exc: BaseException) -> dict[str, Any]:
    """The error outcome of an exception that escaped the engine's own code (one line)."""
    import errno

    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = text if len(text) <= 400 else text[:397] + "..."
    kind = "internal_error"
    if isinstance(exc, EventTooLarge) or "string or blob too big" in text or "string longer than" in text:
        kind = "event_too_large"
    elif isinstance(exc, TooManyEvents):
        kind = "max_events"
    elif isinstance(exc, MemoryError):
        kind, text = "resource_exhausted", text or "out of memory"
    elif isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        kind = "storage_full"
    elif isinstance(exc, RecursionError):
        kind = "resource_exhausted"
    return {"kind": kind, "message": f"{type(exc).__name__}: {text}" if text else type(exc).__name__,
            "retryable": False, "code": None}  # fmt: skip


def _finished_error(eng: Any) -> dict[str, Any]:
    return {"kind": "execution_finished", "message": f"execution {eng.execution_id} is {eng.state.status}",
            "retryable": False, "code": None}  # fmt: skip


@dataclass
class ResumePoint:
    """What the log holds of one step run that was running when its process died."""

    started: bool = False  # its step.started is in the log
    loop_id: str | None = None  # its step loop's loop.started (not a cursor loop's)
    total: int = 0
    max_in_flight: int = 1
    iterations_started: set[int] = field(default_factory=set)
    finished: dict[int, tuple[bool, Any]] = field(default_factory=dict)  # iteration -> (ok, result)
    ctx_writers: dict[str, int] = field(default_factory=dict)  # parallel loops: ctx key -> iteration


def resume_point(eng: Engine, step_run_id: str) -> ResumePoint:
    rp = ResumePoint()
    step = eng._steps[eng.state.step_runs[step_run_id]["step"]]  # noqa: SLF001 - the engine's own map
    step_loop = step.loop is not None and step.loop.cursor is None
    offloader, reader = eng.services.offloader, (eng.services.tenant, eng.services.project)

    def resolve(value: Any) -> Any:
        return offloader.resolve(value, reader)

    for ev in eng.services.event_store.read(eng.execution_id):
        if ev.step_run_id != step_run_id:
            continue
        name = ev.name
        if name == E.STEP_STARTED:
            rp.started = True
        elif not step_loop:
            continue
        elif name == E.LOOP_STARTED and rp.loop_id is None:  # the step's own loop starts first
            rp.loop_id, rp.total = ev.loop_id, int(ev.data.get("total") or 0)
            rp.max_in_flight = int(ev.data.get("max_in_flight") or 1)
        elif ev.loop_id != rp.loop_id or rp.loop_id is None or ev.iteration is None:
            continue
        elif name == E.LOOP_ITERATION_STARTED:
            rp.iterations_started.add(ev.iteration)
        elif name == E.LOOP_ITERATION_DONE:
            rp.finished[ev.iteration] = (True, resolve(ev.data.get("result")))
        elif name == E.LOOP_ITERATION_FAILED:
            rp.finished[ev.iteration] = (False, {"status": "error", "error": ev.data.get("error")})
        elif name == E.CTX_PATCHED:
            for k in ev.data.get("patch") or {}:
                rp.ctx_writers.setdefault(k, ev.iteration)
    return rp


def record_failure(rec: Recorder, err: dict[str, Any], step_run_ids: Iterable[str]) -> None:
    """The failure record: each step run given fails with ``err`` (unless finished) and is routed
    nowhere (unless routed), then the execution ends ``failed``; appended at once."""
    st, eid = rec.state, rec.execution_id
    for srid in step_run_ids:
        info = st.step_runs.get(srid)
        if info is None:
            continue
        step = info["step"]
        if srid not in st.finished_runs:
            rec.emit(E.STEP_FAILED, step=step, step_run_id=srid, entity_id=srid, status="error",
                     data={"error": err, "duration_ms": 0.0})  # fmt: skip
        if srid not in st.routed_runs:
            rec.emit(E.NEXT_EVALUATED, step=step, step_run_id=srid, entity_id=srid, status="error",
                     data={"event_name": "call.error", "mode": None, "fired": [], "unhandled_failure": True,
                           "errors": [err["message"]]})  # fmt: skip
    rec.emit(E.WORKFLOW_FINISHED, entity_id=eid, status="error", data={"status": "failed", "error": err})
    rec.emit(E.PLAYBOOK_PROCESSED, entity_id=eid, status="error",
             data={"status": "failed", "final_step": st.last_step, "error": err})  # fmt: skip
    rec.flush()


def mark_unrecorded(data_dir: Path | str, execution_id: str) -> None:
    """An empty file named after the execution (a full disk still takes a directory entry), for the
    next start: the execution could not record its failure."""
    try:
        d = Path(data_dir) / UNRECORDED_DIR
        d.mkdir(parents=True, exist_ok=True)
        (d / execution_id).touch()
    except OSError:
        log.error("execution %s could not be recorded nor marked; resume it or mark it by hand", execution_id)


def sweep_payloads(services: Services, execution_id: str, tenant: str, project: str) -> int:
    """Delete the payloads stored under an execution's key prefix that no event of its log
    references (the ones a dead or crashed process wrote for events it never recorded)."""
    offloader = services.offloader
    store = getattr(offloader, "store", None)
    if store is None or not callable(getattr(store, "list", None)):
        return 0
    uris = store.list(payload_prefix(offloader, tenant, project, execution_id))
    if not uris:
        return 0
    referenced: set[str] = set()
    for ev in services.event_store.read(execution_id):
        ref_uris(ev.data, referenced)
    removed = 0
    for uri in uris:
        if uri not in referenced:
            store.delete(uri)
            removed += 1
    return removed
