"""Step loops as phases (begin, iterations, end, resume), mixed into the Worker, so a runner
can run a loop's iterations in other processes or Dagster ops without a second implementation."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from noetl_dagster.dsl.model import Loop, Step
from noetl_dagster.dsl.templates import TemplateError
from noetl_dagster.engine import events as E
from noetl_dagster.engine.events import uuid7
from noetl_dagster.engine.frame import (
    DEFAULT_MAX_IN_FLIGHT,
    LoopRun,
    _error,
    _Frame,
    run_bounded,
)
from noetl_dagster.engine.scope import Scope

if TYPE_CHECKING:
    from noetl_dagster.engine.control import Engine


class LoopPhases:
    """The loop half of :class:`~noetl_dagster.engine.worker.Worker` (it provides the pipeline)."""

    engine: Engine

    def _loop_items(self, loop: Loop, scope: Scope) -> list[Any]:
        raw = loop.in_
        items = self.env.render(raw, scope) if isinstance(raw, (str, dict, list)) else raw
        if isinstance(items, str):
            import json

            try:
                items = json.loads(items)
            except ValueError:
                raise TemplateError(str(raw), f"loop.in rendered to a string, not a list: {items[:80]!r}") from None
        if isinstance(items, Mapping):
            if set(items) == {"results", "stats"} and isinstance(items.get("results"), list):
                return list(items["results"])  # a loop step's aggregate iterates over its results
            return [dict(items)]
        if items is None:
            raise TemplateError(str(raw), "loop.in rendered to nothing (undefined or null)")
        if isinstance(items, (list, tuple)):
            return list(items)
        raise TemplateError(str(raw), f"loop.in must render to a list, got {type(items).__name__}")

    def _run_loop(
        self,
        loop: Loop,
        frame: _Frame,
        body: Callable[[_Frame], tuple[bool, Any, dict[str, Any] | None]],
    ) -> tuple[bool, Any, dict[str, Any] | None]:
        lr, err = self.loop_begin(loop, frame)
        if lr is None:
            return False, None, err
        if lr.parallel:
            run_bounded(lr.total, min(lr.max_in_flight, lr.total), lambda i: self.loop_iteration(lr, i, body),
                        name=f"noetl-{frame.step.name}")  # fmt: skip
        else:
            for i in range(lr.total):
                self.loop_iteration(lr, i, body)
        return self.loop_end(lr)

    def loop_begin(self, loop: Loop, frame: _Frame) -> tuple[LoopRun | None, dict[str, Any] | None]:
        """Render ``loop.in`` and record loop.started; (None, error) when the loop cannot start."""
        scope = self.base_scope(frame.args, frame.iter)
        t0 = time.perf_counter()
        try:
            items = self._loop_items(loop, scope)
            mif = loop.max_in_flight
            if isinstance(mif, str):
                mif = self.env.render(mif, scope)
            mif = int(mif) if mif not in (None, "") else DEFAULT_MAX_IN_FLIGHT
            mif = max(1, mif)
        except (TemplateError, ValueError, TypeError) as e:
            return None, _error("template_error", str(e))
        lr = LoopRun(loop, frame, uuid7(), items, mif, t0)
        self.engine.recorder.emit(
            E.LOOP_STARTED,
            step=frame.step.name,
            step_run_id=frame.step_run_id,
            loop_id=lr.loop_id,
            entity_id=lr.loop_id,
            status="in_progress",
            data={"total": lr.total, "mode": loop.mode, "max_in_flight": mif if loop.mode == "parallel" else 1},
        )
        return lr, None

    def step_loop_begin(self, step: Step, step_run_id: str, args: Any) -> tuple[LoopRun | None, dict[str, Any] | None]:
        """loop_begin for a step-level loop (the step's own frame)."""
        assert step.loop is not None
        return self.loop_begin(step.loop, _Frame(step, step_run_id, args, {}))

    def loop_resume(
        self, step: Step, step_run_id: str, args: Any, loop_id: str, items: list[Any], max_in_flight: int,
        t0: float, ctx_writers: Mapping[str, int] | None = None,
    ) -> LoopRun:  # fmt: skip
        """A started step loop, rebuilt from what its loop.started recorded (for iterations run elsewhere);
        ``ctx_writers`` (ctx key -> iteration that wrote it) keeps the parallel-loop write rule across frames."""
        assert step.loop is not None
        lr = LoopRun(step.loop, _Frame(step, step_run_id, args, {}), loop_id, list(items), max_in_flight, t0)
        if lr.guard is not None and ctx_writers:
            lr.guard.writers.update(ctx_writers)
        return lr

    def loop_iteration(
        self, lr: LoopRun, i: int, body: Callable[[_Frame], tuple[bool, Any, dict[str, Any] | None]] | None = None
    ) -> None:
        """Run iteration ``i`` (the step's pipeline unless ``body`` is given) and record its events."""
        rec = self.engine.recorder
        frame, loop, step = lr.frame, lr.loop, lr.frame.step
        if body is None:
            body = lambda f: self._run_pipeline(step.tool, f)  # noqa: E731
        n = lr.total
        it: dict[str, Any] = {
            loop.iterator: lr.items[i],
            "index": i,
            "_index": i,
            "_first": i == 0,
            "_last": i == n - 1,
            "_total": n,
            "parent": frame.iter if frame.iter else None,
        }
        f = _Frame(step, frame.step_run_id, frame.args, it, lr.loop_id, i, lr.guard)

        def iteration_event(name: str, **kw: Any) -> None:
            rec.emit(name, step=step.name, step_run_id=frame.step_run_id, loop_id=lr.loop_id, iteration=i,
                     entity_id=lr.loop_id, **kw)  # fmt: skip

        iteration_event(E.LOOP_ITERATION_STARTED, status="in_progress")
        ok, result, error = body(f)
        lr.results[i] = result if ok else {"status": "error", "error": error}
        lr.oks[i] = ok
        if ok:
            iteration_event(E.LOOP_ITERATION_DONE, data={"result": rec.offload(result, f"{step.name}/iter-{i}")})
        else:
            iteration_event(E.LOOP_ITERATION_FAILED, status="error", data={"error": error})

    def loop_end(self, lr: LoopRun) -> tuple[bool, Any, dict[str, Any] | None]:
        """Record loop.done with the aggregate of every iteration (``lr.results`` / ``lr.oks`` filled)."""
        rec = self.engine.recorder
        step, n = lr.frame.step, lr.total
        results, oks = lr.results, lr.oks
        failed = n - sum(oks)
        aggregate = {"results": results, "stats": {"total": n, "ok": n - failed, "failed": failed}}
        rec.emit(
            E.LOOP_DONE,
            step=step.name,
            step_run_id=lr.frame.step_run_id,
            loop_id=lr.loop_id,
            entity_id=lr.loop_id,
            status="success" if not failed else "error",
            data={
                "result": rec.offload(aggregate, f"{step.name}/loop"),
                "duration_ms": round((time.perf_counter() - lr.t0) * 1000, 3),
            },
        )
        if failed:
            first = next(r for r, ok in zip(results, oks, strict=True) if not ok)
            err = dict(first.get("error") or {}) if isinstance(first, dict) else {}
            err["message"] = f"{failed} of {n} loop iterations failed; first: {err.get('message', '')}"
            err.setdefault("kind", "loop_failed")
            return False, aggregate, err
        return True, aggregate, None

