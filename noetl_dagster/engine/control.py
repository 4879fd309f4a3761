"""Control plane: admission, routing, joins and completion (SEMANTICS.md §5).

:class:`Engine` is one execution's token machine. Its state is the fold of
its events, so any process that replays the log can pick it up: the local
runner drives it to completion in-process; the Dagster runner drives it one
step (or one region of steps) per op.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from noetl_dagster.dsl.executor_spec import final_step, no_next_is_error
from noetl_dagster.dsl.kinds import is_pure
from noetl_dagster.dsl.template_front import TemplateError
from noetl_dagster.dsl.template_lazy import engine_template_env
from noetl_dagster.engine import events as E
from noetl_dagster.engine import usage
from noetl_dagster.engine.durability import Driver
from noetl_dagster.engine.engine_services import EngineServices
from noetl_dagster.engine.events import uuid7
from noetl_dagster.engine.execution import Activation, Services
from noetl_dagster.engine.frame import StepRun, outcome_envelope
from noetl_dagster.engine.graph import StepGraph, analyze
from noetl_dagster.engine.ports import ToolError
from noetl_dagster.engine.recorder import Recorder
from noetl_dagster.engine.scope import Scope, StepResults
from noetl_dagster.engine.state import ExecutionState
from noetl_dagster.engine.trust import (
    UNRESTRICTED,
    DelegatedKeychain,
    Gate,
    Grant,
    grant_for_generated,
    isolation,
    violations,
)
from noetl_dagster.engine.worker import Worker
from noetl_dagster.util.lazylog import LazyLogger

if TYPE_CHECKING:
    from noetl_dagster.dsl.model import Playbook, Step

log = LazyLogger("noetl_dagster.engine")
MAX_PLAYBOOK_DEPTH = 16
# step runs one execution may schedule (docs/limits.md); executor.spec.max_step_runs overrides
DEFAULT_MAX_STEP_RUNS = 10_000


def max_step_runs(playbook: Playbook) -> int:
    value = playbook.executor.spec.get("max_step_runs") if playbook.executor else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return DEFAULT_MAX_STEP_RUNS


def max_events(playbook: Playbook) -> int | None:
    """executor.spec.max_events (events one execution may record), else the recorder's default."""
    value = playbook.executor.spec.get("max_events") if playbook.executor else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


class Engine(Driver, EngineServices):
    def __init__(
        self,
        playbook: Playbook,
        services: Services,
        *,
        execution_id: str | None = None,
        parent_execution_id: str | None = None,
        state: ExecutionState | None = None,
        depth: int = 0,
    ):
        self.playbook = playbook
        self.services = services
        self.depth = depth
        self.graph: StepGraph = analyze(playbook)
        self._steps: dict[str, Step] = dict(
            playbook.steps
        )  # Playbook.step's dict (its cache costs a pydantic getattr)
        self.state = state or ExecutionState(execution_id or uuid7(), services.offloader.resolve)
        self.state.reader = self.state.reader or (services.tenant, services.project)
        self.recorder = Recorder(
            self.state,
            services.event_store,
            services.offloader,
            tenant=services.tenant,
            project=services.project,
            parent_execution_id=parent_execution_id or self.state.parent_execution_id,
            listeners=services.listeners,
            max_events=max_events(playbook),
            durable=services.durable,
        )
        self._effect_runs: set[str] = set()  # step runs that ran a task with an outside effect
        self.worker = Worker(self)
        self.env = engine_template_env()  # Jinja2 at the first template (issue 35)
        self._resources: dict[str, Any] = {}
        self._resources_lock = threading.Lock()
        self._keychain: Any = None
        self._keychain_lock = threading.Lock()
        self._cap = max_step_runs(playbook)  # read per step: the pydantic spec once
        self.grant: Grant = UNRESTRICTED  # narrowed for generated playbooks and their children (engine.trust)
        # this process's CPU for the execution, less its task attempts': the platform line (engine.usage)
        self.usage_window = None if self.state.finished else usage.window(self.state.execution_id)
        self.gate: Gate | None = None  # the run-time trust gate every call passes; set by restrict()
        # "sandbox": tool code runs in the OS sandbox by tenant/project policy or the playbook's own ask
        self.isolation = isolation(playbook, services.tenant, services.project)

    @property
    def execution_id(self) -> str:
        return self.state.execution_id

    # -- services used by the worker ---------------------------------------------------
    def log(self, message: str) -> None:
        if self.services.logger:
            self.services.logger(message)
        else:
            log.info(message)

    def _opens_with_effect(self, step: Step) -> bool:
        """The step's first task has an effect outside the execution (so it runs behind a barrier)."""
        if not step.tool or step.name in self.state.reused:
            return False
        first = step.tool[0]
        return not is_pure(first.kind, first.pure)

    def before_effect(self, step_run_id: str) -> None:
        """A task with an effect outside the execution is about to run: everything recorded so far
        becomes durable first (its step run's id included, which a resume reuses), and the step run
        is routed behind a barrier too (see _route)."""
        self._effect_runs.add(step_run_id)
        self.recorder.flush()

    def patch_ctx(self, patch: dict[str, Any], *, source: str, **fields: Any) -> None:
        if patch:
            fields.setdefault("entity_id", self.execution_id)  # ctx is execution-scoped (entity "workflow")
            self.recorder.emit(E.CTX_PATCHED, data={"patch": patch, "source": source}, **fields)

    # -- control plane -------------------------------------------------------------------
    def _start(
        self, workload: Mapping[str, Any] | None, *, requested_by: str, nominal_time: str | None,
        request: Mapping[str, Any] | None,
    ) -> None:  # fmt: skip
        pb = self.playbook
        overrides = dict(workload or {})
        extra = {"nominal_time": nominal_time} if nominal_time else {}
        self.recorder.emit(
            E.EXECUTION_REQUESTED,
            entity_id=self.execution_id,
            data={
                "playbook": pb.metadata.path,
                "name": pb.metadata.name,
                "file": pb.source_file,
                "workload": overrides,
                "parent_execution_id": self.recorder.parent_execution_id,
                "requested_by": requested_by,
                **extra,
                **dict(request or {}),
            },
        )
        merged = {**pb.workload, **overrides}
        if isinstance(overrides.get("ctx"), dict):  # a request may seed ctx
            merged.pop("ctx", None)
        entry = self.graph.entry
        self.recorder.emit(
            E.WORKFLOW_STARTED, entity_id=self.execution_id, data={"workload": merged, "entry": entry}
        )
        if isinstance(overrides.get("ctx"), dict):
            self.patch_ctx(dict(overrides["ctx"]), source="request")
        self._enqueue(entry, {}, None)
        self.recorder.flush()

    def _enqueue(self, step: str, args: Any, from_step: str | None, token_id: str | None = None) -> str:
        tid = token_id or uuid7()
        self.recorder.emit(
            E.TOKEN_ENQUEUED,
            step=step,
            entity_id=tid,
            data={"token_id": tid, "step": step, "args": args, "from_step": from_step},
        )
        return tid

    def _scope(self, args: Any, **extra: Any) -> Scope:
        st = self.state
        steps = StepResults(lambda: st.results, st.result)
        ns = {
            "workload": st.workload,
            "ctx": st.ctx,
            "iter": {},
            "args": args if args is not None else {},
            "keychain": self.keychain_namespace(),
            "execution_id": self.execution_id,
            "steps": steps,
            **extra,
        }
        chain: list[Mapping[str, Any]] = [args] if isinstance(args, Mapping) else []
        chain += [st.ctx, steps, st.workload]
        return Scope(ns, tuple(chain))

    def _ready(self, allowed: Iterable[str] | None) -> list[Activation]:
        cap = self._cap
        if len(self.state.step_runs) > cap:  # the capped run exists: nothing more is scheduled
            return []
        allowed_set = set(allowed) if allowed is not None else None
        acts: list[Activation] = []
        by_step: dict[str, list[str]] = {}
        for tid, tok in self.state.tokens.items():
            if allowed_set is not None and tok.step not in allowed_set:
                continue
            by_step.setdefault(tok.step, []).append(tid)
        for step, tids in by_step.items():
            if self.graph.is_join(step):
                if not self.graph.join_ready(step, self.state.pending_steps(), self.state.running.values()):
                    continue
                groups = [tids]
                args_of = [[self.state.tokens[t].args for t in tids]]
            else:
                groups = [[t] for t in tids]
                args_of = [self.state.tokens[t].args for t in tids]
            for group, args in zip(groups, args_of, strict=True):
                act = self._admit(step, group, args)
                if act is not None:
                    acts.append(act)
                    if len(self.state.step_runs) > cap:  # this one is the capped run: schedule no more
                        return acts
        pending_all_here = allowed_set is None or all(
            tok.step in allowed_set for tok in self.state.tokens.values()
        )
        if not acts and pending_all_here and not self.state.running and self.state.tokens:
            # only joins waiting on each other (an irreducible cycle): every pending join
            # fires at once with the tokens it has (SEMANTICS §5; order independent)
            for step in sorted(self.state.pending_steps(), key=self.graph.order.index):
                tids = [t for t, tok in self.state.tokens.items() if tok.step == step]
                act = self._admit(step, tids, [self.state.tokens[t].args for t in tids])
                if act is not None:
                    acts.append(act)
                    if len(self.state.step_runs) > cap:
                        return acts
        # not flushed here: a step's events become durable together when it is routed
        return acts

    def _admit(self, step_name: str, token_ids: list[str], args: Any) -> Activation | None:
        step = self._steps[step_name]
        allowed, reason = True, None
        selected = self.state.selected
        if selected is not None and step_name not in selected and step_name != final_step(self.playbook):
            allowed, reason = False, "not selected"  # a subset run (request select): outside what it needs
        elif step.admit:
            scope = self._scope(args)
            allowed, reason = True, "no admit rule matched (default allow)"
            try:
                else_rule = None
                matched = False
                for rule in step.admit:
                    if rule.when is None:
                        else_rule = else_rule or rule
                        continue
                    if self.env.truthy(rule.when, scope):
                        allowed, reason, matched = rule.allow, f"rule {rule.when!r}", True
                        break
                if not matched and else_rule is not None:
                    allowed, reason = else_rule.allow, "else"
            except TemplateError as e:
                allowed, reason = False, f"admission rule failed to render: {e}"
        if not allowed:
            self.recorder.emit(
                E.STEP_SKIPPED,
                step=step_name,
                entity_id=step_name,
                data={"token_ids": token_ids, "reason": reason, "args": args},
            )
            return None
        srid = uuid7()
        self.recorder.emit(
            E.STEP_SCHEDULED,
            step=step_name,
            step_run_id=srid,
            entity_id=srid,
            data={"token_ids": token_ids, "args": args},
        )
        return Activation(step_name, srid, token_ids, args)

    def _run(self, act: Activation) -> StepRun:
        step = self._steps[act.step]
        if self.recorder.effect_pending and not self._opens_with_effect(step):
            # a routed step run had an effect: its end is made durable before this step's code runs
            # (a step opening with an effect makes it durable at that task's barrier, in one commit)
            self.recorder.flush()
        cap = self._cap
        runs = self.state.step_runs
        # the capped run is the one scheduled past the cap, and the last scheduled (see ready)
        if (
            len(runs) > cap
            and act.step_run_id == next(reversed(runs))
            and act.step != final_step(self.playbook)
        ):
            t0 = self.worker.step_begin(step, act.step_run_id)
            err = {"kind": "max_step_runs", "message": f"execution exceeded {cap} step runs (max_step_runs); "
                   "a cycle without a `when` guard?", "retryable": False, "code": None}  # fmt: skip
            return self.worker.step_end(step, act.step_run_id, act.args, False, None, err, "call.error", t0)
        return self.worker.run_step(step, act.step_run_id, act.args)

    def _route(self, run: StepRun) -> list[tuple[str, str]]:
        step: Step = self._steps[run.step]
        router = step.next
        fired: list[dict[str, Any]] = []
        errors: list[str] = []
        capped = not run.ok and isinstance(run.error, dict) and run.error.get("kind") == "max_step_runs"
        if router and router.arcs and not capped:
            outcome = outcome_envelope(run.ok, run.result, run.error)
            event = {
                "name": run.event_name,
                "step": run.step,
                "status": "ok" if run.ok else "error",
                "payload": outcome,
            }
            scope = self._scope(run.args, event=event, outcome=outcome, output=outcome, error=run.error)
            for i, arc in enumerate(router.arcs):
                try:
                    if not self.env.truthy(arc.when, scope):
                        continue
                    args = self.env.render(arc.args, scope) if arc.args is not None else {}
                    patch = {k: self.env.render(v, scope) for k, v in arc.set.ctx.items()} if arc.set else {}
                except TemplateError as e:
                    errors.append(f"arc {i} -> {arc.step}: {e}")
                    continue
                fired.append({"arc": i, "step": arc.step, "token_id": uuid7(), "args": args, "patch": patch})
                if router.mode == "exclusive":
                    break
        dead_end = (
            run.ok and not fired and not errors and not capped and dead_end_is_error(self.playbook, router)
        )
        unhandled = (not run.ok and not fired) or dead_end
        self.recorder.emit(
            E.NEXT_EVALUATED,
            step=run.step,
            step_run_id=run.step_run_id,
            entity_id=run.step_run_id,
            status="error" if unhandled or errors else "success",
            data={
                "event_name": run.event_name,
                "mode": router.mode if router else None,
                "fired": [{"arc": f["arc"], "step": f["step"], "token_id": f["token_id"]} for f in fired],
                "unhandled_failure": unhandled,
                "errors": errors,
                **({"no_match_error": True} if dead_end else {}),
                # the cap ends the execution: the tokens left are dropped, never scheduled
                **({"dropped_tokens": list(self.state.tokens)} if capped and self.state.tokens else {}),
            },
        )
        out = []
        for f in fired:
            if f["patch"]:
                self.patch_ctx(
                    f["patch"], step=run.step, step_run_id=run.step_run_id, source=f"arc:{f['arc']}"
                )
            self._enqueue(f["step"], f["args"], run.step, f["token_id"])
            out.append((f["token_id"], f["step"]))
        if run.step_run_id in self._effect_runs:  # its effect happened: durable before more user code runs
            self._effect_runs.discard(run.step_run_id)
            self.recorder.effect_pending = True  # (see _run)
        self.recorder.step_boundary()
        return out

    def is_done(self) -> bool:
        return not self.state.tokens and not self.state.running

    def _finish(self) -> str:
        run_final_step(self)
        if self.state.finished:  # the final step crashed: the gate recorded the end
            return self.state.status
        status = "failed" if self.state.failed else "completed"
        data: dict[str, Any] = {"status": status}
        platform = usage.platform(self.execution_id)
        if platform is not None:
            data["platform"] = platform
        self.recorder.emit(E.WORKFLOW_FINISHED, entity_id=self.execution_id, status="success" if status == "completed" else "error",
                           data=data)  # fmt: skip
        last = self.state.last_step
        self.recorder.emit(
            E.PLAYBOOK_PROCESSED,
            entity_id=self.execution_id,
            status="success" if status == "completed" else "error",
            data={"status": status, "final_step": last},
        )
        self.recorder.flush()
        return status

    def _recover(self, on_step: Callable[[StepRun], None] | None, allowed: Iterable[str] | None) -> list[str]:
        st = self.state
        resumed: list[str] = []
        only = set(allowed) if allowed is not None else None
        if st.status == "requested" and only is None:  # died before the workflow started
            req = next(
                (
                    e
                    for e in self.services.event_store.read(self.execution_id)
                    if e.name == E.EXECUTION_REQUESTED
                ),
                None,
            )
            overrides = dict((req.data if req else {}).get("workload") or {})
            merged = {**self.playbook.workload, **overrides}
            self.recorder.emit(
                E.WORKFLOW_STARTED,
                entity_id=self.execution_id,
                data={"workload": merged, "entry": self.graph.entry},
            )
            self._enqueue(self.graph.entry, {}, None)
            self.recorder.flush()
            return resumed
        for srid in st.unrouted_runs():
            info = st.step_runs[srid]
            if only is not None and info["step"] not in only:
                continue
            ok = st.step_status.get(info["step"]) == "done"
            step = self._steps[info["step"]]
            result = st.result(info["step"])
            name = "loop.done" if step.loop else ("call.done" if ok else "call.error")
            keep = ok or (step.loop is not None and isinstance(result, dict) and "stats" in result)
            err = None if ok else (result or {}).get("error")
            if not ok and keep:  # a failed loop step keeps its aggregate as result
                err = {"kind": "loop_failed", "message": f"{result['stats'].get('failed')} loop iterations failed",
                       "retryable": False, "code": None}  # fmt: skip
            self.route(StepRun(info["step"], srid, ok, result if keep else None, err, name, info.get("args")))
            resumed.append(srid)
        for srid, step_name in list(st.running.items()):
            if only is not None and step_name not in only:
                continue
            info = st.step_runs[srid]
            run = self.resume_run(srid, step_name, info.get("args"))
            self.route(run)
            resumed.append(srid)
            if on_step:
                on_step(run)
        return resumed

    # -- sub-playbooks -----------------------------------------------------------------------
    def run_child(self, path: str, workload: dict[str, Any], **kw: Any) -> dict[str, Any]:
        """Run a sub-playbook: a catalog ``path``, or an inline (generated) ``definition`` (see run_child)."""
        return run_child(self, path, workload, **kw)


def run_final_step(eng: Engine) -> None:
    """executor.spec.final_step: run it once, now that the workflow is quiescent (also after a
    failure). Its args carry the workflow's status and last step; its own failure fails the run."""
    final = final_step(eng.playbook)
    st = eng.state
    if final is None or st.runs.get(final) or st.step_status.get(final) == "skipped":
        return
    args = {"status": "failed" if st.failed else "completed", "last_step": st.last_step}
    tid = eng._enqueue(final, args, None)  # noqa: SLF001 - the engine's own token machine
    act = eng._admit(final, [tid], args)  # noqa: SLF001 - admission rules apply as to any step
    if act is not None:
        eng.route(eng.run(act))
    eng.recorder.flush()


def dead_end_is_error(pb: Playbook, router: Any) -> bool:
    """executor.spec.no_next_is_error: a success no arc routes fails the run, unless its router says
    the dead end is intended (on_no_match: quiet); a step without arcs is a normal end."""
    return bool(router and router.arcs) and no_next_is_error(pb) and router.spec.get("on_no_match") != "quiet"


def run_child(
    parent: Engine,
    path: str,
    workload: dict[str, Any],
    *,
    return_step: str | None = None,
    definition: Playbook | None = None,
    credentials: list[str] | None = None,
    **_: Any,
) -> dict[str, Any]:
    """Run a child execution of ``parent``: a catalog ``path``, or an inline (generated) ``definition``
    that runs behind the trust boundary of engine.trust (its own grant, a delegated keychain)."""
    if parent.depth + 1 > MAX_PLAYBOOK_DEPTH:
        raise ToolError(f"sub-playbook nesting deeper than {MAX_PLAYBOOK_DEPTH}", kind="playbook_depth")
    request: dict[str, Any] = {}
    if definition is not None:
        from noetl_dagster.dsl.parse import PlaybookInvalid, check_playbook  # noqa: PLC0415 - the validator: generated playbooks only (issue 35)

        try:
            child_pb = check_playbook(definition)
        except PlaybookInvalid as e:
            raise ToolError(f"generated playbook is invalid: {e}", kind="generated_playbook_invalid",
                            result={"issues": [str(i) for i in e.issues]}) from None  # fmt: skip
        from noetl_dagster.dsl.builder import canonical_yaml, playbook_id  # noqa: PLC0415 - the builder API (~5 ms), generated playbooks only

        pid = playbook_id(child_pb)
        grant = grant_for_generated(parent.grant, parent.playbook, credentials)
        label = f"generated playbook {child_pb.metadata.name!r} ({pid})"
        request = {"playbook_id": pid, "ephemeral": True, "definition": canonical_yaml(child_pb),
                   "delegated_credentials": sorted(grant.credentials or ()),
                   "allowed_kinds": sorted(grant.kinds or ()), "allowed_hosts": sorted(grant.hosts or ())}  # fmt: skip
    else:
        child_pb = parent.services.catalog.find(path, parent.playbook.base_dir)
        grant, label = parent.grant, f"sub-playbook {path!r}"
    problems = violations(child_pb, grant, parent.services.tenant) if grant.restricted else []
    if problems:
        raise ToolError(f"{label} refused: " + "; ".join(problems), kind="generated_playbook_refused",
                        result={"violations": problems, **({"playbook_id": request["playbook_id"]} if request else {})})  # fmt: skip
    child = Engine(child_pb, parent.services, parent_execution_id=parent.execution_id, depth=parent.depth + 1)
    child.recorder.redactor.add(
        parent.recorder.redactor.secrets
    )  # what is secret to the parent is secret to the child
    if grant.restricted:
        restrict(child, grant)
        kc = DelegatedKeychain(
            parent.credential, lambda: _secret_values(parent), grant.credentials or frozenset()
        )
        child._keychain = kc.bind(on_secret=child.recorder.redactor.add)  # noqa: SLF001 - the engine's own field
        kc.bind(on_secret=parent.recorder.redactor.add)
    child.start(workload, requested_by=f"playbook:{parent.execution_id}", request=request)
    status = child.drive()
    st = child.state
    step = return_step or st.last_step
    result = st.result(step) if step else None
    extra = {"playbook_id": request["playbook_id"]} if request else {}
    if status != "completed":
        err = result.get("error") if isinstance(result, dict) else None
        raise ToolError(
            f"{label} (execution {child.execution_id}) {status}: {(err or {}).get('message', '')}",
            kind="playbook_failed",
            result={"execution_id": child.execution_id, "status": status, **extra},
        )
    if isinstance(result, dict):
        return {**result, "execution_id": child.execution_id, **extra}
    return {"result": result, "execution_id": child.execution_id, **extra}


def restrict(engine: Engine, grant: Grant) -> None:
    """Narrow ``engine`` to ``grant`` and arm its run-time gate (engine.trust.Gate): local files of a
    restricted execution live in ``<data dir>/generated/<execution id>``."""
    engine.grant = grant
    scope = Path(engine.services.data_dir) / "generated" / engine.execution_id
    engine.gate = Gate(grant, engine.services.tenant, str(scope)) if grant.restricted else None


def restore_generated(engine: Engine, request: Mapping[str, Any]) -> None:
    """A generated child picked up again from its log alone (resume): the grant its request event
    recorded, and a delegated keychain over the stored credentials (the parent is not there)."""
    if not request.get("ephemeral"):
        return
    from noetl_dagster.engine.keychain import Keychain  # noqa: PLC0415 - providers load lazily

    grant = Grant(
        frozenset(request.get("allowed_kinds") or ()),
        frozenset(request.get("delegated_credentials") or ()),
        frozenset(request.get("allowed_hosts") or ()),  # none recorded (an older log): no host
    )
    base = Keychain([]).bind(on_secret=engine.recorder.redactor.add)
    restrict(engine, grant)
    kc = DelegatedKeychain(base.credential, base.secret_values, grant.credentials or frozenset())
    engine._keychain = kc.bind(on_secret=engine.recorder.redactor.add)  # noqa: SLF001 - the engine's own field


def _secret_values(engine: Engine) -> set[str]:
    kc = engine._keychain  # noqa: SLF001 - read only: the secrets this execution's keychain resolved
    return (
        set(kc.secret_values()) if kc is not None and callable(getattr(kc, "secret_values", None)) else set()
    )
