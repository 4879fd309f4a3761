"""Data plane: run one step's pipeline for one activation (SEMANTICS.md §3, §4).

Renders each task, calls its tool, builds the outcome envelope, applies the
task policy (first match wins; continue | retry | jump | break | fail) with
its writes, and iterates the pipeline over ``loop.in`` when the step (or a
task) has a loop. Every failure becomes an error outcome and events; nothing
raised by a tool or a template escapes.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from noetl_dagster.dsl.kinds import KindError, get_tool, is_pure
from noetl_dagster.dsl.parse_context import MAX_RETRY_ATTEMPTS
from noetl_dagster.dsl.template_front import TemplateError
from noetl_dagster.dsl.template_lazy import engine_template_env
from noetl_dagster.engine import events as E
from noetl_dagster.engine.events import uuid7
from noetl_dagster.engine.frame import (
    DEFAULT_RETRY_ATTEMPTS,
    MAX_PIPELINE_TRANSITIONS,
    CtxConflict,
    StepRun,
    _err_outcome,
    _error,
    _Frame,
    outcome_envelope,
)
from noetl_dagster.engine.loops import LoopPhases
from noetl_dagster.engine.policy import TaskPolicy
from noetl_dagster.engine.ports import ToolError
from noetl_dagster.engine.requests import step_requests
from noetl_dagster.engine.scope import Scope, StepResults, view
from noetl_dagster.engine.usage import Meter, add_offload, network_into

if TYPE_CHECKING:
    from noetl_dagster.dsl.model import Step, Task
    from noetl_dagster.engine.execution import ExecutionEngine as Engine

MAX_NOTE_CHARS = 16 * 1024  # a recorded SQL statement (ctx.note) is bounded: events stay small


class _ToolCtx:
    """The engine's implementation of engine.ports.ToolContext for one task call."""

    def __init__(
        self,
        worker: Worker,
        frame: _Frame,
        task: Task,
        attempt: int,
        scope: Scope,
        notes: dict[str, Any] | None = None,
        task_run_id: str | None = None,
    ):
        self._worker = worker
        self._notes = notes
        self._frame = frame
        self.execution_id = worker.engine.execution_id
        self.step = frame.step.name
        self.task = task.label
        self.attempt = attempt
        self.task_run_id = task_run_id
        self.step_run_id = frame.step_run_id
        self.spec = task.spec
        self.render_context = scope
        self.tenant = worker.engine.services.tenant
        self.project = worker.engine.services.project
        # a generated playbook (engine.trust): tools keep it away from the worker's environment and
        # files; its local files live in its own directory (the gate's scope)
        gate = worker.engine.gate
        self.restricted = gate is not None
        self.scope_dir = gate.scope_dir if gate is not None else None
        self.allow_hosts = gate.grant.hosts if gate is not None else None  # the sandbox's egress proxy
        self.isolation = worker.engine.isolation  # "sandbox": the OS sandbox by policy (tools/sandbox.py)

    @property
    def base_dir(self) -> Any:  # computed when a tool asks (a path operation per task otherwise)
        # a generated playbook's relative files are its own directory's, never the worker's cwd
        return self.scope_dir or self._worker.engine.playbook.base_dir

    @property
    def payloads(self) -> Any:
        return self._worker.engine.services.offloader.store

    @property
    def offloader(self) -> Any:
        return self._worker.engine.services.offloader

    @property
    def event_store(self) -> Any:  # a dispatched call's log (engine.ports.ToolDispatch)
        return self._worker.engine.services.event_store

    @property
    def log_position(self) -> int:
        return self._worker.engine.state.sequence

    @property
    def secrets(self) -> frozenset[str]:
        """The values the execution's events never show (a pool worker redacts what it records)."""
        return frozenset(self._worker.engine.recorder.redactor.secrets)

    @property
    def data_dir(self) -> str:
        return self.scope_dir or str(self._worker.engine.services.data_dir)

    def credential(self, name: str) -> dict[str, Any]:
        return self._worker.engine.credential(name)

    def check_url(self, url: str) -> None:
        """The trust gate's host rule (engine.trust.Gate.url) for a URL a tool is about to request
        beyond its rendered config (a redirect hop); nothing to check for an unrestricted execution."""
        gate = self._worker.engine.gate
        if gate is not None:
            gate.url(url, f"task {self.task!r}")

    def resource(self, key: str, factory: Callable[[], Any]) -> Any:
        return self._worker.engine.resource(key, factory)

    def run_playbook(self, path: str, workload: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
        return self._worker.engine.run_child(path, dict(workload or {}), **kw)

    def run_workbook(self, name: str, inputs: dict[str, Any]) -> Any:
        return self._worker.call_workbook(name, inputs, self._frame, self.render_context)

    def log(self, message: str) -> None:
        self._worker.engine.log(f"[{self.step}.{self.task}] {message}")

    def redact(self, value: str) -> None:
        self._worker.engine.recorder.redactor.add([value])

    def note(self, **meta: Any) -> None:
        """Facts about the call for ``outcome.meta`` of ``task.done`` (a SQL tool's statement, for
        lineage): redacted first, a string cut at MAX_NOTE_CHARS with ``<key>_truncated``."""
        if self._notes is None:
            return
        redactor = self._worker.engine.recorder.redactor
        for key, value in meta.items():
            value = redactor.value(value) if redactor else value
            if isinstance(value, str) and len(value) > MAX_NOTE_CHARS:
                value = value[:MAX_NOTE_CHARS]
                self._notes[f"{key}_truncated"] = True
            self._notes[key] = value


def sandbox_worker(engine: Engine, kind: str, ctx: _ToolCtx) -> Any:
    """The execution's sandboxed worker when a call of ``kind`` runs in it (started at the first such
    call, closed with the execution's resources), else None: the kind runs in this process."""
    if engine.gate is None and engine.isolation != "sandbox":
        return None
    port = engine.services.sandbox
    if port is None:
        raise ToolError(f"task {ctx.task!r}: this execution is sandboxed and the runner wired no sandbox",
                        kind="sandbox_unavailable")  # fmt: skip
    if kind not in port.kinds:
        return None
    return engine.resource("sandbox:worker", lambda: port.start(ctx))


def pool_dispatch(engine: Engine, kind: str) -> Any:
    """The worker pool a call of ``kind`` goes to (engine.ports.ToolDispatch), else None: it runs here.
    A sandboxed execution never leaves its sandbox for the pool."""
    pool = engine.services.dispatch
    if pool is None or kind not in pool.kinds or engine.gate is not None or engine.isolation == "sandbox":
        return None
    return pool


class Worker(LoopPhases, TaskPolicy):
    def __init__(self, engine: Engine):
        self.engine = engine
        self.env = engine_template_env()  # Jinja2 at the first template (issue 35)

    # -- scopes ------------------------------------------------------------------
    def base_scope(
        self, args: Any, iter_scope: dict[str, Any], task_results: dict[str, Any] | None = None
    ) -> Scope:
        eng = self.engine
        st = eng.state
        steps = StepResults(lambda: st.results, st.result)
        ns: dict[str, Any] = {
            "workload": st.workload,
            "ctx": st.ctx,
            "iter": iter_scope,
            "args": args if args is not None else {},
            "keychain": eng.keychain_namespace(),
            "execution_id": eng.execution_id,
            "steps": steps,
        }
        chain: list[Mapping[str, Any]] = []
        if isinstance(args, Mapping):
            chain.append(args)
        chain += [st.ctx, iter_scope]
        if task_results is not None:
            chain.append(task_results)
            ns["results"] = task_results
        chain += [steps, st.workload]
        if st.last_step is not None:
            # bare `result` (NoETL runtime dialect): the most recently finished step's result,
            # last in the chain so any other `result` name wins (a step's own set/policy binds it)
            chain.append({"result": st.result(st.last_step)})
        return Scope(ns, tuple(chain))

    # -- steps -------------------------------------------------------------------
    def run_step(self, step: Step, step_run_id: str, args: Any, resume: Any = None) -> StepRun:
        """``resume`` (durability.ResumePoint): what the log holds of this step run, not recorded again."""
        t0 = (
            time.perf_counter()
            if resume is not None and resume.started
            else self.step_begin(step, step_run_id)
        )
        reused = self.engine.state.reused.get(step.name)
        if reused is not None:  # its tasks do not run: the earlier execution's result routes on as if it had
            services = self.engine.services
            result = services.offloader.resolve(reused.get("result"), (services.tenant, services.project))
            return self.step_end(step, step_run_id, args, True, result, None, "call.done", t0)
        if step.loop is not None:
            frame = _Frame(step, step_run_id, args, {})
            if resume is not None and resume.loop_id is not None:
                ok, result, error = self.resume_loop(step.loop, frame, resume)
            else:
                ok, result, error = self._run_loop(
                    step.loop, frame, lambda f: self._run_pipeline(step.tool, f)
                )
            event_name = "loop.done"
        else:
            frame = _Frame(step, step_run_id, args, {})
            ok, result, error = self._run_pipeline(step.tool, frame)
            event_name = "call.done" if ok else "call.error"
        return self.step_end(step, step_run_id, args, ok, result, error, event_name, t0)

    # The phases of run_step, public so a runner can run a loop step's iterations elsewhere
    # (the Dagster translator's loop frames): step_begin, loop_begin, loop_iteration..., loop_end, step_end.
    def step_begin(self, step: Step, step_run_id: str) -> float:
        self.engine.recorder.emit(E.STEP_STARTED, step=step.name, step_run_id=step_run_id, entity_id=step_run_id,
                                  status="in_progress")  # fmt: skip
        return time.perf_counter()

    def step_end(
        self, step: Step, step_run_id: str, args: Any, ok: bool, result: Any, error: dict[str, Any] | None,
        event_name: str, t0: float,
    ) -> StepRun:  # fmt: skip
        rec = self.engine.recorder
        frame = _Frame(step, step_run_id, args, {})
        if ok and step.set:
            try:
                scope = self.base_scope(args, frame.iter).child(
                    output=outcome_envelope(ok, result, error),
                    outcome=outcome_envelope(ok, result, error),
                    result=result,
                )
                scope.ns[step.name] = result  # the step's own result, before it is recorded
                self._apply_set(step.set.ctx, {}, scope, frame, source="step")
            except (TemplateError, CtxConflict) as e:
                ok, error = (
                    False,
                    _error("template_error" if isinstance(e, TemplateError) else "ctx_conflict", str(e)),
                )
                if event_name == "call.done":
                    event_name = "call.error"
        duration_ms = round((time.perf_counter() - t0) * 1000, 3)
        if ok:
            rec.emit(
                E.STEP_DONE,
                step=step.name,
                step_run_id=step_run_id,
                entity_id=step_run_id,
                data={"result": rec.offload(result, f"{step.name}/result"), "duration_ms": duration_ms},
            )
        else:
            data: dict[str, Any] = {"error": error, "duration_ms": duration_ms}
            if event_name == "loop.done" and result is not None:
                # SEMANTICS §4: a loop step keeps its {results, stats} also when iterations failed
                data["result"] = rec.offload(result, f"{step.name}/result")
            rec.emit(
                E.STEP_FAILED,
                step=step.name,
                step_run_id=step_run_id,
                entity_id=step_run_id,
                status="error",
                data=data,
            )
        return StepRun(step.name, step_run_id, ok, result, error, event_name, args)

    # -- pipeline ----------------------------------------------------------------
    def _run_pipeline(self, tasks: list[Task], frame: _Frame) -> tuple[bool, Any, dict[str, Any] | None]:
        labels = {t.label: i for i, t in enumerate(tasks)}
        task_results: dict[str, Any] = {}
        prev: Any = None
        last_result: Any = None
        pc = 0
        attempt = 1
        transitions = 0
        while pc < len(tasks):
            transitions += 1
            if transitions > MAX_PIPELINE_TRANSITIONS:
                return (
                    False,
                    last_result,
                    _error("pipeline_limit", f"pipeline exceeded {MAX_PIPELINE_TRANSITIONS} task runs"),
                )
            task = tasks[pc]
            scope = self.base_scope(frame.args, frame.iter, task_results)
            scope.ns.update(_prev=prev, _task=task.label, _attempt=attempt)
            outcome = self._call_task(task, frame, scope, attempt)
            status_ok = outcome["status"] == "ok"
            then, rule_error = self._decide(task, outcome, scope)
            if rule_error is not None:  # a rule's `when` failed to render: the task fails
                outcome = outcome | {"status": "error", "error": rule_error}
                status_ok, do = False, "fail"
            else:
                do = then.do if then is not None else ("continue" if status_ok else "fail")
            # writes: the rule's set_ctx / set_iter, then the task's own `set`
            delay = 0.0
            try:
                if do == "retry" or (then is not None and then.set) or task.set:  # else nothing renders here
                    pscope = scope.child(
                        outcome=outcome,
                        output=outcome,
                        error=outcome.get("error"),
                        result=outcome.get("result"),
                    )
                    if (
                        do == "retry"
                    ):  # resolved first: an exhausted retry is a plain continue / fail, writes included
                        max_attempts = min(
                            self._int(then.attempts if then else None, pscope, DEFAULT_RETRY_ATTEMPTS),
                            MAX_RETRY_ATTEMPTS,
                        )
                        if attempt < max_attempts:
                            delay = self._retry_delay(then, attempt, pscope)
                        else:
                            do = "continue" if status_ok else "fail"
                    if then is not None and then.set:
                        self._apply_set(
                            then.set.ctx, then.set.iter, pscope, frame, source=f"rule:{task.label}"
                        )
                    if task.set and do != "retry":
                        tscope = pscope.child(output=view(outcome.get("result")))
                        self._apply_set(
                            task.set.ctx, task.set.iter, tscope, frame, source=f"task:{task.label}"
                        )
            except (TemplateError, CtxConflict) as e:
                kind = "template_error" if isinstance(e, TemplateError) else "ctx_conflict"
                outcome = outcome | {"status": "error", "error": _error(kind, str(e))}
                do, status_ok = "fail", False
            try:
                recorded = self._outcome_event(outcome, frame, task)
            except (ValueError, TypeError, RecursionError, OverflowError) as e:
                # a result JSON cannot hold (a cycle, say) fails the task; it never crashes the execution
                msg = f"task {task.label!r} returned a result that cannot be stored: {type(e).__name__}: {e}"
                outcome = _err_outcome(_error("result_not_serializable", msg)) | {"meta": outcome["meta"]}
                do, status_ok = "fail", False
                recorded = self._outcome_event(outcome, frame, task)
            self.engine.recorder.emit(
                E.TASK_DONE,
                step=frame.step.name,
                step_run_id=frame.step_run_id,
                task_run_id=outcome["meta"]["task_run_id"],
                entity_id=outcome["meta"]["task_run_id"],
                loop_id=frame.loop_id,
                iteration=frame.iteration,
                attempt=attempt,
                status="success" if status_ok else "error",
                data={"task": task.label, "kind": task.kind, "outcome": recorded, "directive": do},
            )
            if do == "retry":
                if delay > 0:
                    time.sleep(delay)
                attempt += 1
                continue
            result = outcome.get("result")
            task_results[task.label] = result
            prev = result
            last_result = result
            attempt = 1
            if do == "continue":
                if not status_ok and then is None:
                    return False, last_result, outcome.get("error")
                pc += 1
            elif do == "jump":
                target = then.to if then else None
                pc = max(pc - 1, 0) if target == "previous" else labels.get(str(target), len(tasks))
            elif do == "break":
                return True, last_result, None
            else:  # fail
                err = outcome.get("error") or _error(
                    "policy_fail", f"task {task.label!r} failed by policy rule"
                )
                return False, last_result, err
        return True, last_result, None

    def _apply_set(
        self, ctx_w: dict[str, Any], iter_w: dict[str, Any], scope: Scope, frame: _Frame, source: str
    ) -> None:
        if ctx_w:
            patch = {k: self.env.render(v, scope) for k, v in ctx_w.items()}
            if frame.ctx_guard is not None and frame.iteration is not None:
                frame.ctx_guard.claim(patch, frame.iteration)
            self.engine.patch_ctx(patch, step=frame.step.name, step_run_id=frame.step_run_id, loop_id=frame.loop_id,
                                  iteration=frame.iteration, source=source)  # fmt: skip
        if iter_w:
            updates = {k: self.env.render(v, scope) for k, v in iter_w.items()}
            frame.iter.update(updates)

    def _outcome_event(self, outcome: dict[str, Any], frame: _Frame, task: Task) -> dict[str, Any]:
        out = {k: v for k, v in outcome.items() if k not in ("data", "response", "result")}
        usage = out["meta"].get("usage") if isinstance(out.get("meta"), dict) else None
        with (
            network_into(usage) if isinstance(usage, dict) else nullcontext()
        ):  # an object-store upload's bytes
            out["result"] = self.engine.recorder.offload(
                outcome.get("result"), f"{frame.step.name}/{task.label}"
            )
        if isinstance(usage, dict):
            add_offload(usage, out["result"])
        return out

    # -- one task call -----------------------------------------------------------
    def _call_task(self, task: Task, frame: _Frame, scope: Scope, attempt: int) -> dict[str, Any]:
        rec = self.engine.recorder
        task_run_id = uuid7()
        started_at = rec.emit(  # outcome.meta.started_at: the task.started event's own timestamp
            E.TASK_STARTED,
            step=frame.step.name,
            step_run_id=frame.step_run_id,
            task_run_id=task_run_id,
            entity_id=task_run_id,
            loop_id=frame.loop_id,
            iteration=frame.iteration,
            attempt=attempt,
            status="in_progress",
            data={"task": task.label, "kind": task.kind},
        ).timestamp
        t0 = time.perf_counter()
        notes: dict[str, Any] = {}  # what the tool noted (ctx.note), for outcome.meta
        meter = Meter(
            self.engine.usage_window
        )  # measured usage, recorded in the event (replay reads it, never re-measures)
        try:
            if task.loop is not None:
                inner = _Frame(
                    frame.step,
                    frame.step_run_id,
                    frame.args,
                    frame.iter,
                    frame.loop_id,
                    frame.iteration,
                    frame.ctx_guard,
                )
                ok, result, error = self._run_loop(
                    task.loop, inner, lambda f: self._task_body_as_pipeline(task, f, attempt)
                )
                outcome = outcome_envelope(ok, result, error)
            else:
                outcome = self._invoke(task, frame, scope, attempt, notes, task_run_id)
        except BaseException:
            meter.stop()  # an interrupt: the attempt ends unrecorded, but no longer counts as running
            raise
        outcome["meta"] = {
            "attempt": attempt,
            "duration_ms": round((time.perf_counter() - t0) * 1000, 3),
            "started_at": started_at,
            "task_run_id": task_run_id,
            "usage": meter.stop(outcome.get("result")),
        }
        if notes:
            outcome["meta"].update(notes)
        requests = self._requests(frame.step)
        if requests:  # priced as max(request, usage) (analytics/noetl_analytics/pricing.py usage_lines)
            outcome["meta"]["requests"] = requests
        return outcome

    def _requests(self, step: Step) -> dict[str, float] | None:
        cache = self.__dict__.setdefault("_requests_cache", {})
        if step.name not in cache:
            cache[step.name] = step_requests(self.engine.playbook, step)
        return cache[step.name]

    def _task_body_as_pipeline(
        self, task: Task, frame: _Frame, attempt: int
    ) -> tuple[bool, Any, dict[str, Any] | None]:
        scope = self.base_scope(frame.args, frame.iter, {})
        outcome = self._invoke(task, frame, scope, attempt)
        return outcome["status"] == "ok", outcome.get("result"), outcome.get("error")

    def _invoke(
        self, task: Task, frame: _Frame, scope: Scope, attempt: int, notes: dict[str, Any] | None = None,
        task_run_id: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        kind = get_tool(task.kind)
        if kind is None:
            return _err_outcome(_error("unknown_kind", f"tool kind {task.kind!r} is not registered"))
        try:
            raw_keys = kind.raw_keys
            config = {k: (v if k in raw_keys else self.env.render(v, scope)) for k, v in task.config.items()}
            if frame.step.input:
                step_input = self.env.render(frame.step.input, scope)
                base = config.get("input") if isinstance(config.get("input"), dict) else {}
                config["input"] = {**base, **step_input}
        except TemplateError as e:
            return _err_outcome(_error("template_error", str(e)))
        if not is_pure(task.kind, task.pure):
            # outside the try: a store that refuses the barrier is the engine's crash (durability
            # gate), not this task's error outcome
            self.engine.before_effect(frame.step_run_id)
        try:
            gate = self.engine.gate
            if gate is not None:  # the trust boundary, at run time, on the rendered config
                gate.check(task.kind, config, f"task {task.label!r}")
            ctx = _ToolCtx(self, frame, task, attempt, scope, notes, task_run_id)
            box = sandbox_worker(self.engine, task.kind, ctx)
            pool = pool_dispatch(self.engine, task.kind) if box is None else None
            if pool is not None:  # the worker pool: task.started is durable before the command leaves
                kind.check_config(config)
                self.engine.recorder.flush()
                result = pool.call(task.kind, config, ctx)
            elif box is None:
                result = kind.invoke(config, ctx)
            else:  # the OS sandbox: the kind runs in the execution's worker process
                kind.check_config(config)
                result = box.call(task.kind, config, ctx)
        except KindError as e:  # config not matching the kind's model, a plugin that did not load
            return _err_outcome(_error(e.kind, str(e)))
        except ToolError as e:
            out = _err_outcome(_error(e.kind, str(e.message), retryable=e.retryable, code=e.code))
            out.update(e.details)
            if e.result is not None:
                out["result"] = out["data"] = out["response"] = e.result
            return out
        except TemplateError as e:
            return _err_outcome(_error("template_error", str(e)))
        except Exception as e:  # noqa: BLE001 - a tool bug is an error outcome, never a crash
            out = _err_outcome(_error("exception", f"{type(e).__name__}: {e}"))
            out["py"] = {
                "exception_type": type(e).__name__,  # innermost: the user's frames
                "traceback": traceback.format_exc(limit=-8)[-MAX_NOTE_CHARS:],
            }
            return out
        return outcome_envelope(True, result, None)

    # -- workbook ----------------------------------------------------------------
    def call_workbook(self, name: str, inputs: dict[str, Any], frame: _Frame, scope: Scope) -> Any:
        entry = self.engine.playbook.workbook_entry(name)
        if entry is None:
            raise ToolError(f"workbook entry {name!r} is not defined", kind="unknown_workbook_entry")
        task = entry.tool
        defaults = task.config.get("input") if isinstance(task.config.get("input"), dict) else {}
        call_input = inputs.get("input") if isinstance(inputs.get("input"), dict) else {}
        merged = {**defaults, **call_input}
        wb_task = task.model_copy(update={"config": {**task.config, "input": merged}})
        # the merged input is read first by bare name too (`{{ summary }}` in a non-python entry)
        wscope = Scope({**scope.ns, "input": merged, "args": merged}, (merged, *scope.chain))
        sub = _Frame(
            frame.step, frame.step_run_id, merged, frame.iter, frame.loop_id, frame.iteration, frame.ctx_guard
        )
        outcome = self._invoke(wb_task, sub, wscope, 1)
        if outcome["status"] != "ok":
            err = outcome.get("error") or {}
            raise ToolError(
                f"workbook entry {name!r} failed: {err.get('message')}",
                kind=err.get("kind") or "workbook_error",
                retryable=bool(err.get("retryable")),
                details={k: outcome[k] for k in ("http", "pg", "py") if k in outcome},
            )
        return outcome.get("result")
