"""Step loops as phases (begin, iterations, end, resume), mixed into the Worker, so a runner
can run a loop's iterations in other processes or Dagster ops without a second implementation."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from noetl_dagster.dsl.template_front import TemplateError
from noetl_dagster.engine import events as E
from noetl_dagster.engine.events import uuid7
from noetl_dagster.engine.frame import (
    DEFAULT_MAX_IN_FLIGHT,
    LoopRun,
    _CtxGuard,
    _error,
    _Frame,
    run_bounded,
)
from noetl_dagster.engine.lanes import Lanes
from noetl_dagster.engine.ports import CursorRequest, CursorRow, CursorSource, ToolError
from noetl_dagster.engine.scope import Scope
from noetl_dagster.engine.trust import cursor_config

if TYPE_CHECKING:
    from noetl_dagster.dsl.model import FramePolicy, Loop, Step
    from noetl_dagster.engine.execution import ExecutionEngine as Engine


class _CursorRun:
    """What the slots of one cursor loop share (guarded by ``lock``)."""

    def __init__(
        self, loop: Loop, frame: _Frame, loop_id: str, done: dict[str, Any], guard: _CtxGuard | None,
        policy: FramePolicy,
    ):  # fmt: skip
        self.loop, self.frame, self.loop_id, self.guard = loop, frame, loop_id, guard
        self.policy = policy
        self.done = done  # key -> result of a row finished by an earlier attempt of this step run
        self.lock = threading.Lock()
        self.keys: list[str] = list(done)
        self.results: list[Any] = list(done.values())
        self.oks: list[bool] = [True] * len(done)
        self.error: dict[str, Any] | None = None
        self.attempts: dict[str, int] = {}  # failed runs per key in this loop run (frame.max_attempts)

    def slot(self) -> int:
        with self.lock:
            self.keys.append("")
            self.results.append(None)
            self.oks.append(False)
            return len(self.keys) - 1


class _Heartbeat:
    """Extends the lease of a frame's rows every ``heartbeat_seconds`` while they are processed."""

    def __init__(
        self, source: CursorSource, rows: list[CursorRow], seconds: float, log: Callable[[str], None]
    ):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(source, rows, seconds, log), daemon=True,
                                        name="noetl-cursor-heartbeat")  # fmt: skip
        self._thread.start()

    def _run(
        self, source: CursorSource, rows: list[CursorRow], seconds: float, log: Callable[[str], None]
    ) -> None:
        while not self._stop.wait(seconds):
            try:
                source.heartbeat(rows)
            except Exception as e:  # noqa: BLE001 - a missed heartbeat only shortens the lease
                log(f"cursor heartbeat failed: {type(e).__name__}: {e}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class CursorLoops:
    """``loop.cursor`` (NoETL's pull loops): ``max_in_flight`` slots each claim frames of up to
    ``frame.max_rows`` rows from the source, run the pipeline per row (or per frame), record the
    iteration durably and only then acknowledge the rows; a heartbeat extends the lease meanwhile.

    Resume (the step run again under its id) first reads which row keys this step run already
    finished: such a row, claimed again because the process died before its ack, is acknowledged
    without running again; its earlier result stays in the aggregate. Drivers sit behind
    ``engine.ports.CursorSource`` and are wired by the runner (``Services.cursor_sources``)."""

    engine: Engine

    def _run_cursor_loop(
        self, loop: Loop, frame: _Frame, body: Callable[[_Frame], tuple[bool, Any, dict[str, Any] | None]]
    ) -> tuple[bool, Any, dict[str, Any] | None]:
        eng, rec, cur = self.engine, self.engine.recorder, loop.cursor
        assert cur is not None
        from pydantic import ValidationError  # noqa: PLC0415 - cursor loops only: a run imports no pydantic

        from noetl_dagster.dsl.model import FramePolicy  # noqa: PLC0415

        t0 = time.perf_counter()
        try:
            scope = self.base_scope(frame.args, frame.iter)
            fp = FramePolicy(**self.env.render(dict(loop.frame or {}), scope))  # its values may be templates
            mif = loop.max_in_flight
            mif = self.env.render(mif, scope) if isinstance(mif, str) else mif
            slots = max(1, int(mif)) if mif not in (None, "") else 1
            # one request per slot: the owner names the slot, stable across resume (same step run id)
            reqs = [self._cursor_request(cur, fp, scope, f"{eng.execution_id}:{frame.step_run_id}:{k}", k)
                    for k in range(slots)]  # fmt: skip
        except ValidationError as e:
            return (
                False,
                None,
                _error("config_error", f"loop.spec.frame: {e.errors()[0]['msg']} ({e.errors()[0]['loc']})"),
            )
        except (TemplateError, ValueError, TypeError) as e:
            return False, None, _error("template_error", str(e))
        gate = eng.gate
        if gate is not None:  # the trust boundary holds for cursor drivers as for tools
            try:
                for req in reqs:
                    gate.check(
                        cur.kind,
                        cursor_config(cur.kind, req.auth, req.options),
                        f"loop.cursor of step {frame.step.name!r}",
                    )
            except ToolError as e:
                return False, None, _error(e.kind, e.message)
        opener = eng.services.cursor_sources.get(cur.kind)
        if opener is None:
            return (
                False,
                None,
                _error("cursor_error", f"no driver for cursor kind {cur.kind!r} is wired into this runner"),
            )
        done = self._cursor_done_rows(frame.step_run_id)
        st = _CursorRun(
            loop, frame, uuid7(), done, _CtxGuard() if slots > 1 or fp.row_concurrency > 1 else None, fp
        )
        rec.emit(E.LOOP_STARTED, step=frame.step.name, step_run_id=frame.step_run_id, loop_id=st.loop_id,
                 entity_id=st.loop_id, status="in_progress",
                 data={"total": 0, "mode": "cursor", "cursor": cur.kind, "max_in_flight": slots,
                       "frame": fp.model_dump(), "resumed_rows": len(done)})  # fmt: skip
        sources: list[CursorSource] = []
        try:
            sources = [opener(req) for req in reqs]
            run_bounded(
                slots,
                slots,
                lambda k: self._cursor_slot(st, sources[k], body),
                name=f"noetl-{frame.step.name}",
            )
        except Exception as e:  # noqa: BLE001 - a driver failure ends the loop with an error, never a crash
            st.error = st.error or _error("cursor_error", f"cursor {cur.kind}: {type(e).__name__}: {e}")
        finally:
            for src in sources:
                try:
                    src.close()
                except Exception:  # noqa: BLE001, S110 - closing is best effort
                    pass
        lr = LoopRun(loop, frame, st.loop_id, st.keys, slots, t0, st.results, st.oks)
        ok, aggregate, err = self.loop_end(lr)
        if st.error is not None:
            return False, aggregate, st.error
        return ok, aggregate, err

    def _cursor_request(self, cur: Any, fp: Any, scope: Scope, owner: str, slot: int) -> CursorRequest:
        eng = self.engine
        cscope = scope.child(cursor={"owner": owner, "slot": slot, "execution_id": eng.execution_id,
                                     "max_rows": fp.max_rows, "lease_seconds": fp.lease_seconds},
                             __frame_max_rows=fp.max_rows, __frame_policy=fp.model_dump())  # NoETL's names  # fmt: skip
        return CursorRequest(
            kind=cur.kind,
            claim=str(self.env.render(cur.claim, cscope)),
            options=self.env.render(dict(cur.options), cscope),
            auth=self.env.render(cur.auth, cscope) if cur.auth is not None else None,
            owner=owner,
            lease_seconds=fp.lease_seconds,
            credential=eng.credential,
            base_dir=eng.playbook.base_dir,
            sandbox_dir=eng.gate.scope_dir if eng.gate is not None else None,
        )

    def _cursor_done_rows(self, step_run_id: str) -> dict[str, Any]:
        """Row keys this step run finished before (an earlier attempt that died), with their results."""
        svc = self.engine.services
        out: dict[str, Any] = {}
        for ev in svc.event_store.read(self.engine.execution_id):
            if ev.name == E.LOOP_ITERATION_DONE and ev.step_run_id == step_run_id:
                key = (ev.data or {}).get("cursor_key")
                if key is not None and key not in out:
                    out[key] = svc.offloader.resolve((ev.data or {}).get("result"), (svc.tenant, svc.project))
        return out

    def _cursor_slot(
        self, st: _CursorRun, src: CursorSource, body: Callable[[_Frame], tuple[bool, Any, Any]]
    ) -> None:
        rec, fp, step = self.engine.recorder, st.policy, st.frame.step
        while st.error is None:
            rows = src.claim(fp.max_rows)
            if not rows:
                return
            frame_id = uuid7()
            rec.emit(E.LOOP_FRAME_CLAIMED, step=step.name, step_run_id=st.frame.step_run_id, loop_id=st.loop_id,
                     entity_id=st.loop_id, data={"frame_id": frame_id, "keys": [r.key for r in rows], "count": len(rows)})  # fmt: skip
            rec.flush()
            if fp.process == "frame":
                units = [(CursorRow("+".join(r.key for r in rows), [r.value for r in rows]), rows)]
            else:
                units = [(r, [r]) for r in rows]
            outcome = {"ok": 0, "failed": 0, "resumed": 0, "exhausted": 0}
            hb = _Heartbeat(src, rows, fp.heartbeat_seconds, self.engine.log)
            try:
                run_bounded(len(units), min(fp.row_concurrency, len(units)),
                            lambda j, u=units, o=outcome: self._cursor_unit(st, src, u[j][0], u[j][1], body, o))  # fmt: skip
            finally:
                hb.stop()
            rec.emit(E.LOOP_FRAME_COMMITTED, step=step.name, step_run_id=st.frame.step_run_id, loop_id=st.loop_id,
                     entity_id=st.loop_id, data={"frame_id": frame_id, **outcome})  # fmt: skip
            if outcome["exhausted"] == len(units):  # the claim only hands back rows out of attempts: stop
                return

    def _cursor_unit(self, st: _CursorRun, src: CursorSource, unit: CursorRow, members: list[CursorRow],
                     body: Callable[[_Frame], tuple[bool, Any, Any]], outcome: dict[str, int]) -> None:  # fmt: skip
        if unit.key in st.done:  # finished before the process died, not acknowledged: acknowledge only
            src.ack(members)
            with st.lock:
                outcome["resumed"] += 1
            return
        with st.lock:  # a row that failed frame.max_attempts times stays claimed for the operator
            if st.attempts.get(unit.key, 0) >= st.policy.max_attempts:
                outcome["exhausted"] += 1
                return
        rec, loop, frame, step = self.engine.recorder, st.loop, st.frame, st.frame.step
        i = st.slot()
        it = {loop.iterator: unit.value, "index": i, "_index": i, "_first": i == 0, "_last": False, "_total": None,
              "parent": frame.iter if frame.iter else None, "cursor_key": unit.key}  # fmt: skip
        f = _Frame(step, frame.step_run_id, frame.args, it, st.loop_id, i, st.guard)

        def iteration_event(name: str, **kw: Any) -> None:
            rec.emit(name, step=step.name, step_run_id=frame.step_run_id, loop_id=st.loop_id, iteration=i,
                     entity_id=st.loop_id, **kw)  # fmt: skip

        iteration_event(E.LOOP_ITERATION_STARTED, status="in_progress", data={"cursor_key": unit.key})
        ok, result, error = body(f)
        with st.lock:
            st.keys[i], st.oks[i] = unit.key, ok
            st.results[i] = result if ok else {"status": "error", "error": error}
            outcome["ok" if ok else "failed"] += 1
            if not ok:
                st.attempts[unit.key] = st.attempts.get(unit.key, 0) + 1
        if ok:
            iteration_event(E.LOOP_ITERATION_DONE,
                            data={"result": rec.offload(result, f"{step.name}/iter-{i}"), "cursor_key": unit.key})  # fmt: skip
        else:
            iteration_event(
                E.LOOP_ITERATION_FAILED, status="error", data={"error": error, "cursor_key": unit.key}
            )
        rec.flush()  # durable before the source forgets the rows: a resume then knows they are done
        if ok:
            src.ack(members)
        else:
            src.fail(members, error)


class LoopPhases(CursorLoops):
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
                raise TemplateError(
                    str(raw), f"loop.in rendered to a string, not a list: {items[:80]!r}"
                ) from None
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
        if loop.cursor is not None:
            return self._run_cursor_loop(loop, frame, body)
        lr, err = self.loop_begin(loop, frame)
        if lr is None:
            return False, None, err
        if lr.parallel:
            self._run_parallel(lr, body)
        else:
            for i in range(lr.total):
                self.loop_iteration(lr, i, body)
        return self.loop_end(lr)

    def _run_parallel(
        self, lr: LoopRun, body: Callable[[_Frame], tuple[bool, Any, dict[str, Any] | None]]
    ) -> None:
        """A parallel loop's iterations on 1..max_in_flight lanes, widened by the GIL-share rule (Lanes)."""
        self.loop_iterations(lr, range(lr.total), body)

    def loop_iterations(
        self, lr: LoopRun, indices: Sequence[int],
        body: Callable[[_Frame], tuple[bool, Any, dict[str, Any] | None]] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Run iterations ``indices`` of ``lr`` (in parallel when the loop is parallel, see :class:`Lanes`);
        returns the schedule taken (lanes started, GIL share measured), also kept as ``lr.schedule``."""
        idx = list(indices)
        if not lr.parallel or len(idx) <= 1:
            for i in idx:
                self.loop_iteration(lr, i, body)
            lr.schedule = {"lanes": 1 if idx else 0, "gil_share": None, "widened_at": None, "widened_after": None,
                           "narrowed": 0, "final_lanes": 1 if idx else 0}  # fmt: skip  # type: ignore[attr-defined]
            return lr.schedule  # type: ignore[attr-defined]
        lanes = Lanes(len(idx), min(lr.max_in_flight, len(idx)), lambda k: self.loop_iteration(lr, idx[k], body),
                      name=f"noetl-{lr.frame.step.name}")  # fmt: skip
        lr.schedule = lanes.run()  # type: ignore[attr-defined]
        return lr.schedule  # type: ignore[attr-defined]

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
            data={
                "total": lr.total,
                "mode": loop.mode,
                "max_in_flight": mif if loop.mode == "parallel" else 1,
            },
        )
        return lr, None

    def resume_loop(self, loop: Loop, frame: _Frame, rp: Any) -> tuple[bool, Any, dict[str, Any] | None]:
        """A step loop its dead process started (``rp``: durability.ResumePoint): the iterations the
        log finished keep their results; the rest run, under the same loop_id, without a second
        loop.started. When ``loop.in`` no longer renders to as many items, it is a new loop."""
        scope = self.base_scope(frame.args, frame.iter)
        try:
            items = self._loop_items(loop, scope)
        except (TemplateError, ValueError, TypeError) as e:
            return False, None, _error("template_error", str(e))
        if len(items) != rp.total:
            return self._run_loop(loop, frame, lambda f: self._run_pipeline(frame.step.tool, f))
        lr = LoopRun(loop, frame, rp.loop_id, items, max(1, rp.max_in_flight), time.perf_counter())
        lr.started_before = set(rp.iterations_started)
        if lr.guard is not None and rp.ctx_writers:
            lr.guard.writers.update(rp.ctx_writers)
        for i, (ok, value) in rp.finished.items():
            if 0 <= i < lr.total:
                lr.oks[i], lr.results[i] = ok, value
        self.loop_iterations(lr, [i for i in range(lr.total) if i not in rp.finished])
        return self.loop_end(lr)

    def step_loop_begin(
        self, step: Step, step_run_id: str, args: Any
    ) -> tuple[LoopRun | None, dict[str, Any] | None]:
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
        self,
        lr: LoopRun,
        i: int,
        body: Callable[[_Frame], tuple[bool, Any, dict[str, Any] | None]] | None = None,
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

        if i not in lr.started_before:
            iteration_event(E.LOOP_ITERATION_STARTED, status="in_progress")
        ok, result, error = body(f)
        lr.results[i] = result if ok else {"status": "error", "error": error}
        lr.oks[i] = ok
        if ok:
            iteration_event(
                E.LOOP_ITERATION_DONE, data={"result": rec.offload(result, f"{step.name}/iter-{i}")}
            )
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
