"""Execution state as a fold of the event log.

The runners change state only by appending events; :meth:`ExecutionState.apply`
is the single place an event changes state, so replaying the log rebuilds
exactly the state a live run had (tokens, ctx, loop positions, results, status).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from noetl_dagster.engine import events as E
from noetl_dagster.engine.events import Event


@dataclass
class Token:
    token_id: str
    step: str
    args: Any
    from_step: str | None = None


@dataclass
class LoopPosition:
    loop_id: str
    step: str | None
    total: int
    done: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    finished: bool = False

    def snapshot(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "total": self.total,
            "done": sorted(self.done),
            "failed": sorted(self.failed),
            "finished": self.finished,
        }


class ExecutionState:
    def __init__(self, execution_id: str, resolver: Callable[[Any, Any], Any] | None = None):
        self.execution_id = execution_id
        self.parent_execution_id: str | None = None
        self.playbook: str | None = None
        self.status = "new"  # new | requested | running | completed | failed
        self.selected: frozenset[str] | None = (
            None  # a subset run: the only steps admitted (request "select")
        )
        # a subset run: steps not run again, each standing on a result an earlier execution recorded
        # (request "reuse": {step: {"execution_id", "result"}}); the tables they stored are kept
        self.reused: dict[str, dict[str, Any]] = {}
        self.workload: dict[str, Any] = {}
        self.entry: str | None = None
        self.ctx: dict[str, Any] = {}
        self.results: dict[str, Any] = {}  # step -> result of its last run (may be a $ref envelope)
        self.step_status: dict[str, str] = {}  # step -> done | failed | skipped
        self.runs: dict[str, int] = {}
        self.tokens: OrderedDict[str, Token] = OrderedDict()  # pending tokens, FIFO
        self.running: dict[str, str] = {}  # step_run_id -> step
        self.step_runs: dict[str, dict[str, Any]] = {}  # step_run_id -> {step, token_ids, args}
        self.finished_runs: set[str] = set()
        self.routed_runs: set[str] = set()  # step runs whose `next` was evaluated
        self.loops: dict[str, LoopPosition] = {}
        self.failed = False
        self.error: dict[str, Any] | None = None
        self.last_step: str | None = None
        self.sequence = 0
        self._resolver = resolver
        self._resolved: dict[str, Any] = {}
        # (tenant, project) the execution reads stored references as: its events' (the recorder's)
        self.reader: tuple[str, str] | None = None

    # -- fold ------------------------------------------------------------------
    def apply(self, ev: Event) -> None:
        name = ev.name
        d = ev.data
        if ev.sequence:
            self.sequence = max(self.sequence, ev.sequence)
        if self.reader is None and ev.tenant_id:
            self.reader = (ev.tenant_id, ev.project_id or "default")
        if name == E.TASK_DONE or name == E.TASK_STARTED or name in E.COMMAND_EVENTS:
            return
        if name == E.TOKEN_ENQUEUED:
            t = Token(d["token_id"], d["step"], d.get("args"), d.get("from_step"))
            self.tokens[t.token_id] = t
        elif name == E.STEP_SCHEDULED:
            for tid in d.get("token_ids", ()):
                self.tokens.pop(tid, None)
            self.running[ev.step_run_id] = ev.step
            self.step_runs[ev.step_run_id] = {
                "step": ev.step,
                "token_ids": d.get("token_ids", []),
                "args": d.get("args"),
            }
            self.runs[ev.step] = self.runs.get(ev.step, 0) + 1
        elif name == E.STEP_SKIPPED:
            for tid in d.get("token_ids", ()):
                self.tokens.pop(tid, None)
            self.step_status[ev.step] = "skipped"
        elif name == E.CTX_PATCHED:
            self.ctx.update(d.get("patch", {}))
        elif name == E.STEP_DONE:
            self.results[ev.step] = d.get("result")
            self._resolved.pop(ev.step, None)
            self.step_status[ev.step] = "done"
            self.running.pop(ev.step_run_id, None)
            self.finished_runs.add(ev.step_run_id)
            self.last_step = ev.step
        elif name == E.STEP_FAILED:
            # a loop step's result stays its {results, stats} aggregate (SEMANTICS §4)
            self.results[ev.step] = (
                d["result"] if "result" in d else {"status": "error", "error": d.get("error")}
            )
            self._resolved.pop(ev.step, None)
            self.step_status[ev.step] = "failed"
            self.running.pop(ev.step_run_id, None)
            self.finished_runs.add(ev.step_run_id)
            self.last_step = ev.step
        elif name == E.NEXT_EVALUATED:
            self.routed_runs.add(ev.step_run_id)
            if d.get("unhandled_failure"):
                self.failed = True
            for tid in d.get("dropped_tokens", ()):  # the step-run cap ended the execution
                self.tokens.pop(tid, None)
        elif name == E.LOOP_STARTED:
            self.loops[ev.loop_id] = LoopPosition(ev.loop_id, ev.step, int(d.get("total", 0)))
        elif name == E.LOOP_ITERATION_DONE:
            lp = self.loops.get(ev.loop_id)
            if lp is not None:
                lp.done.add(ev.iteration)
        elif name == E.LOOP_ITERATION_FAILED:
            lp = self.loops.get(ev.loop_id)
            if lp is not None:
                lp.failed.add(ev.iteration)
        elif name == E.LOOP_DONE:
            lp = self.loops.get(ev.loop_id)
            if lp is not None:
                lp.finished = True
        elif name == E.WORKFLOW_STARTED:
            self.workload = d.get("workload", {})
            self.entry = d.get("entry")
            self.status = "running"
        elif name == E.EXECUTION_REQUESTED:
            self.playbook = d.get("playbook")
            self.selected = frozenset(d["select"]) if isinstance(d.get("select"), list) else None
            reuse = d.get("reuse")
            self.reused = (
                {str(k): v for k, v in reuse.items() if isinstance(v, dict)}
                if isinstance(reuse, dict)
                else {}
            )
            self.parent_execution_id = ev.parent_execution_id
            self.status = "requested"
        elif name == E.WORKFLOW_FINISHED:
            self.status = d.get("status", "completed")
            if d.get("error"):  # an execution ended by the engine's gate (durability.Driver._crashed)
                self.error = d["error"]

    # -- reads -----------------------------------------------------------------
    def result(self, step: str) -> Any:
        """A step's last result, with a stored reference resolved (cached)."""
        if step in self._resolved:
            return self._resolved[step]
        value = self.results.get(step)
        if self._resolver is not None:
            value = self._resolver(value, self.reader)
        self._resolved[step] = value
        return value

    def unrouted_runs(self) -> list[str]:
        """Finished step runs whose routing was never recorded (the process died in between)."""
        return [r for r in self.step_runs if r in self.finished_runs and r not in self.routed_runs]

    def pending_steps(self) -> list[str]:
        seen: dict[str, None] = {}
        for t in self.tokens.values():
            seen.setdefault(t.step, None)
        return list(seen)

    @property
    def finished(self) -> bool:
        return self.status in ("completed", "failed")

    def snapshot(self) -> dict[str, Any]:
        """Everything replay must reproduce."""
        return {
            "status": self.status,
            "workload": self.workload,
            "ctx": self.ctx,
            "results": self.results,
            "step_status": self.step_status,
            "runs": self.runs,
            "tokens": {k: [t.step, t.args] for k, t in self.tokens.items()},
            "running": dict(self.running),
            "loops": {k: v.snapshot() for k, v in self.loops.items()},
            "failed": self.failed,
        }


def fold(events: list[Event], resolver: Callable[[Any, Any], Any] | None = None) -> ExecutionState:
    if not events:
        raise ValueError("no events to replay")
    st = ExecutionState(events[0].execution_id, resolver)
    for ev in events:
        st.apply(ev)
    return st
