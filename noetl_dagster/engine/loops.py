"""Step loops as phases (begin, iterations, end, resume), mixed into the Worker, so a runner
can run a loop's iterations in other processes or Dagster ops without a second implementation."""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from noetl_dagster.dsl.model import FramePolicy, Loop, Step
from noetl_dagster.dsl.templates import TemplateError
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
from noetl_dagster.engine.ports import CursorRequest, CursorRow, CursorSource, ToolError
from noetl_dagster.engine.scope import Scope
from noetl_dagster.engine.trust import cursor_config

if TYPE_CHECKING:
    from noetl_dagster.engine.control import Engine


# -- parallel loops: lanes widened by a measured rule ------------------------------------------
LANE_TICK_SECONDS = 0.02  # how often the loop's own thread looks for a long iteration, at the start
LANE_HEADROOM = (
    0.8  # lanes = floor(0.8 / g): a second lane only when iterations hold a CPU <= 40% of their time
)
LANE_SAMPLES = 9  # the rule reads the median GIL share of the last LANE_SAMPLES measured iterations
LANE_MIN_SAMPLES = 3  # ... once at least this many were measured (a median of 3 outvotes one)
LANE_CLEAR_WAIT = 0.1  # ... or at 2 when both held a CPU at most 10% of their time (clearly waiting)
LANE_SAMPLE_FIRST = 8  # measure a lane's iterations 1..8 (0 warms up), then ...
LANE_SAMPLE_SECONDS = 0.01  # ... the first one to start at least this long after the last measured one
LANE_LONG_ITERATION = 0.002  # ... and every one after an iteration this long (the measuring is cheap by then)
LANE_PATIENCE_SECONDS = 1.0  # no iteration finished for this long: judge the running ones instead
LANE_FIRST_PATIENCE_SECONDS = (
    0.02  # ... while fewer than LANE_MIN_SAMPLES were measured (no flush is due yet)
)


def _open_clock(native_id: int | None) -> Callable[[], tuple[float, float]] | None:
    """A reader of (CPU seconds, seconds runnable but waiting for a core) of the CALLING thread.

    CPU from the thread's own clock (``time.thread_time``, exact); the run-queue wait from Linux'
    ``/proc/self/task/<tid>/schedstat``, the kernel's own account, so a thread that waits for a
    core on a busy machine is not mistaken for one waiting on I/O (elsewhere: no run-queue
    figure). None when the platform has no thread CPU clock."""
    try:
        time.thread_time()
    except OSError:  # pragma: no cover - platforms without a thread CPU clock
        return None
    fd = -1
    if native_id is not None:
        try:
            fd = os.open(f"/proc/self/task/{native_id}/schedstat", os.O_RDONLY)
        except OSError:
            fd = -1
    if fd < 0:
        return lambda: (time.thread_time(), 0.0)

    def clock() -> tuple[float, float]:
        try:
            wait_ns = os.pread(fd, 128, 0).split()[1]
        except (OSError, IndexError):
            return time.thread_time(), 0.0
        return time.thread_time(), int(wait_ns) / 1e9

    clock.close = lambda: os.close(fd)  # type: ignore[attr-defined]
    return clock


def _thread_clock(native_id: int | None) -> tuple[float, float] | None:
    """(CPU, run-queue wait) seconds of ANOTHER thread of this process so far (Linux only)."""
    if native_id is None:
        return None
    try:
        with open(f"/proc/self/task/{native_id}/schedstat", "rb") as fh:
            cpu_ns, wait_ns, *_ = fh.read().split()
        return int(cpu_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return None


class _OtherThreads:
    """CPU plus run-queue seconds used so far by the threads of this process that are not lanes
    (the loop's own thread, a test harness's or a server's threads, event writers): per thread
    id, from ``/proc/self/task/<tid>/schedstat`` (files kept open; Linux only, else empty).

    A lane that waits for the GIL while such a thread holds it, or while the thread that is to
    take it next sits runnable without a core, is neither running nor runnable itself: without
    this account that wait reads as I/O and a CPU-bound loop widens (issue: a CPU-bound loop
    widened on two such stalls right after its warm-up, under ``pytest -n 3`` on 2 cores)."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}
        self._ended: list[int] = []
        self._lock = threading.Lock()
        self.lanes: set[int] = set()  # native ids of the lanes (not counted)

    def read(self) -> dict[int, int]:
        out: dict[int, int] = {}
        try:
            tids = os.listdir("/proc/self/task")
        except OSError:
            return out
        lanes, fds = self.lanes, self._fds
        for name in tids:
            tid = int(name)
            if tid in lanes:
                continue
            fd = fds.get(tid)
            try:
                if fd is None:
                    fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
                    with self._lock:
                        if tid in fds:
                            os.close(fd)
                            fd = fds[tid]
                        else:
                            fds[tid] = fd
                cpu_ns, wait_ns, *_ = os.pread(fd, 128, 0).split()
            except (OSError, ValueError):  # the thread ended (its id may come back: reopen then)
                with self._lock:
                    if fd is not None and fds.get(tid) == fd:
                        self._ended.append(fds.pop(tid))  # closed at the end: a lane may still read it
                continue
            out[tid] = int(cpu_ns) + int(wait_ns)
        return out

    @staticmethod
    def used(before: dict[int, int], after: dict[int, int]) -> float:
        """Seconds the other threads ran or sat runnable between two reads (a thread born in
        between counts from its start; one that ended no longer counts)."""
        return sum(v - before.get(tid, 0) for tid, v in after.items()) / 1e9

    def close(self) -> None:
        with self._lock:
            for fd in [*self._fds.values(), *self._ended]:
                os.close(fd)
            self._fds.clear()
            self._ended.clear()


def _share(cpu: float, wall: float, queued: float, others: float) -> float:
    """The time an iteration could have run: its wall time less the time it sat runnable
    (``queued``) and less the part of the rest the process' other threads explain (``others``:
    their CPU and run-queue seconds in the same interval, when the lane waited that long);
    never less than its CPU time."""
    off = wall - queued - cpu  # neither running nor runnable: I/O, a sleep, a lock, the GIL
    return max(wall - queued - min(max(off, 0.0), max(others, 0.0)), cpu)


class Lanes:
    """Call ``fn(0..n-1)`` on 1..``max_lanes`` threads ("lanes") that pull the next index.

    The rule (measured by benchmarks/bench_loops.py): a parallel loop starts on ONE lane, in
    index order, and widens only on measured evidence that threads can overlap its iterations.

    - A lane's first iteration is its warm-up (lazy imports, plugin discovery, connections:
      one-time waits that say nothing about the loop) and is not judged.
    - A lane measures its iterations ``1..LANE_SAMPLE_FIRST``, then one every
      ``LANE_SAMPLE_SECONDS`` (a measurement costs a few syscalls: bounded to well under 1% of
      a CPU-bound lane) and every one after an iteration of ``LANE_LONG_ITERATION`` or more:
      the CPU time the kernel charged the thread and the time it sat runnable waiting
      for a core (so a busy machine is not mistaken for I/O). The iteration's GIL share is
      ``g = cpu / (wall - run-queue wait)``: the fraction of its time it runs Python (or C
      holding the interpreter) rather than waiting on I/O, a sleep or a child process. Threads overlap only the waiting, so at most ``1/g`` lanes are useful.
    - After each measured iteration the lane takes the median ``g`` of the last
      ``LANE_SAMPLES`` measured iterations, once there are ``LANE_MIN_SAMPLES`` (the median
      ignores the odd iteration that waited on an event-store flush), or at two when both
      waited at least 90% of their time (``g <= LANE_CLEAR_WAIT``), and widens
      the loop to ``min(max_lanes, floor(LANE_HEADROOM/g))`` lanes when that is more than it
      has (the headroom pays for the lanes' own hand-offs): a second lane needs ``g <= 0.4``.
    - A long iteration is judged while it runs, by the loop's own thread. It wakes every
      ``LANE_TICK_SECONDS`` until ``LANE_MIN_SAMPLES`` were measured, then only every
      ``LANE_PATIENCE_SECONDS/2``: each wake-up takes the GIL from a lane, and on an overloaded
      machine the hand-off stalls the lane until the woken thread gets a core. After the
      warm-up, when no iteration finished for ``LANE_PATIENCE_SECONDS``
      (``LANE_FIRST_PATIENCE_SECONDS`` until ``LANE_MIN_SAMPLES`` were measured), the lanes'
      share over that time decides the same way.
    - The rule corrects itself: when the median asks for at most half the lanes the loop has
      (iterations that wait on the GIL of their sibling lanes look like waiting, so an
      over-wide CPU-bound loop still measures ``g`` near 1 in most iterations), the width drops
      to that, and lanes above it leave after their current iteration. Samples restart at
      every change. ``max_lanes`` (max_in_flight) is never exceeded.

    A CPU-bound loop (``g`` near 1) thus stays on one lane and costs what the sequential loop
    costs (no GIL hand-offs, no lock contention, the trace in index order); an I/O-bound loop
    widens during its second iteration (it pays one serial iteration, the warm-up). Where no
    thread clock exists the loop widens to ``max_lanes`` at once (the behaviour before the
    rule). Known limit: C code that releases the GIL yet burns CPU (numpy, compression) counts
    as CPU-bound and keeps one lane; ``isolation: process`` (waiting on a child process is
    waiting) gets it the cores.

    The indices come from one shared iterator (``next`` is atomic under the GIL: no lock per
    iteration); an exception raised by ``fn`` stops lanes taking new indices and is re-raised
    here after every lane has finished its current call."""

    def __init__(self, n: int, max_lanes: int, fn: Callable[[int], Any], *, name: str = "noetl"):
        self.n, self.max_lanes, self.fn, self.name = n, max(1, min(max_lanes, n)), fn, name
        self._indices = iter(range(n))
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._running = 0  # lanes alive (at most max_lanes)
        self._width = 1  # lanes wanted: one above it leaves after its current iteration
        self._peak = 0
        self._finished = threading.Event()
        self._threads: list[threading.Thread] = []
        self._done: list[int] = []  # iterations finished, per lane (each lane writes only its own slot)
        self._samples: deque[float] = deque(maxlen=LANE_SAMPLES)  # GIL shares of measured iterations
        self._no_clock = False
        self._decide_lock = threading.Lock()
        self._others = _OtherThreads()  # the process' threads that are not lanes
        self._t0 = time.perf_counter()
        self.gil_share: float | None = None
        self.widened_at: float | None = None  # seconds after the start when the loop first widened
        self.narrowed = 0  # times the loop gave lanes back (the rule's own correction)

    def run(self) -> dict[str, Any]:
        if self.n <= 0:
            return {"lanes": 0, "gil_share": None, "widened_at": None, "narrowed": 0, "final_lanes": 0}
        self._t0 = time.perf_counter()
        self._start(1)
        seen, since, base = list(self._done), time.perf_counter(), self._clocks()
        # the lanes judge their own samples (no wake-up here per iteration: a CPU-bound lane is never
        # made to hand the GIL over); this thread only watches for a long iteration, rarely once
        # the loop has samples (each wake-up takes the GIL from a lane)
        tick = LANE_TICK_SECONDS
        while not self._finished.wait(tick):
            lanes = len(self._threads)
            if self._running >= self.max_lanes:
                tick = 1.0
                continue  # no lane to add: the lanes' samples may still narrow the loop
            if self._no_clock:  # no thread clock on this platform: the behaviour before the rule
                self._decide(0.0)
                continue
            started = len(self._samples) >= LANE_MIN_SAMPLES
            patience = LANE_PATIENCE_SECONDS if started else LANE_FIRST_PATIENCE_SECONDS
            tick = LANE_PATIENCE_SECONDS / 2 if started else LANE_TICK_SECONDS
            now = time.perf_counter()
            if self._done != seen or len(self._threads) != lanes:
                seen, since, base = list(self._done), now, self._clocks()
            elif any(seen) and now - since >= patience:  # nothing finished for a while: judge what runs
                g = self._share_since(base, now - since)
                if g is not None:
                    self._decide(g)
                seen, since, base = list(self._done), now, self._clocks()
        for t in self._threads:
            t.join()
        self._others.close()
        if self._errors:
            raise self._errors[0]
        return {"lanes": self._peak, "gil_share": None if self.gil_share is None else round(self.gil_share, 4),
                "widened_at": self.widened_at, "narrowed": self.narrowed, "final_lanes": self._width}  # fmt: skip

    def _judge(self) -> None:
        """The sample rule, run by a lane after each measured iteration."""
        samples = sorted(self._samples)
        if len(samples) >= LANE_MIN_SAMPLES or (len(samples) >= 2 and samples[-1] <= LANE_CLEAR_WAIT):
            self._decide(samples[len(samples) // 2])

    def _decide(self, g: float) -> None:
        with self._decide_lock:
            self.gil_share = g
            target = max(1, min(self.max_lanes, math.floor(LANE_HEADROOM / g))) if g > 0 else self.max_lanes
            if target > self._width:
                if self.widened_at is None:
                    self.widened_at = round(time.perf_counter() - self._t0, 4)
                self._width = target
                self._samples.clear()  # the next samples judge the new width
                self._start(target - self._running)
            elif target <= self._width // 2:  # measured as over-wide (GIL-saturated): give lanes back
                self._width = target
                self.narrowed += 1
                self._samples.clear()

    def _clocks(self) -> tuple[list[tuple[float, float] | None], dict[int, int]]:
        lanes = [_thread_clock(t.native_id) if t.is_alive() else None for t in self._threads]
        return lanes, self._others.read()

    def _share_since(
        self, base: tuple[list[tuple[float, float] | None], dict[int, int]], wall: float
    ) -> float | None:
        cpu_sum = avail_sum = 0.0
        lanes, others0 = base
        used = self._others.used(others0, self._others.read())
        for t, before in zip(self._threads, lanes, strict=False):
            now = _thread_clock(t.native_id) if before is not None and t.is_alive() else None
            if now is None or before is None:
                continue
            cpu, wait = now[0] - before[0], now[1] - before[1]
            cpu_sum += cpu
            avail_sum += _share(cpu, wall, wait, used)
        return cpu_sum / avail_sum if avail_sum > 0 else None

    def _start(self, k: int) -> None:
        for _ in range(k):
            with self._lock:
                if self._finished.is_set() or self._running >= self.max_lanes:
                    return
                self._running += 1
                self._peak = max(self._peak, self._running)
            lane = len(self._threads)
            self._done.append(0)
            t = threading.Thread(target=self._lane, args=(lane,), name=f"{self.name}-{lane}", daemon=True)
            self._threads.append(t)
            t.start()
            if t.native_id is not None:
                self._others.lanes.add(t.native_id)

    def _lane(self, lane: int) -> None:
        clock = _open_clock(threading.get_native_id())
        if clock is None:
            self._no_clock = True
        fn, indices, samples, done, errors = self.fn, self._indices, self._samples, self._done, self._errors
        others = self._others
        others.lanes.add(threading.get_native_id())  # (also added by _start: whichever runs first)
        perf = time.perf_counter
        k, last, next_sample = 0, 0.0, 0.0  # iterations done by this lane, wall seconds of its last one
        counted = True  # this lane is in self._running
        try:
            while not errors:
                if self._running > self._width:  # the loop narrowed: leave if still over
                    with self._lock:
                        if self._running > self._width:
                            self._running -= 1
                            counted = False
                            return
                i = next(indices, None)
                if i is None:
                    return
                w0 = perf()  # the wall interval spans the clock reads: the run-queue wait is inside it
                measure = (
                    clock is not None
                    and 0 < k
                    and (k <= LANE_SAMPLE_FIRST or w0 >= next_sample or last >= LANE_LONG_ITERATION)
                )
                if measure:
                    next_sample = w0 + LANE_SAMPLE_SECONDS
                    o0 = others.read()
                    c0, q0 = clock()  # type: ignore[misc]
                try:
                    fn(i)
                except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                    errors.append(e)
                    return
                if measure:
                    c1, q1 = clock()  # type: ignore[misc]
                    used = others.used(o0, others.read())
                    last = perf() - w0
                    if last - (q1 - q0) > 0:
                        samples.append(min(1.0, (c1 - c0) / _share(c1 - c0, last, q1 - q0, used)))
                        self._judge()
                else:
                    last = perf() - w0
                k += 1
                done[lane] = k
        finally:
            if clock is not None and hasattr(clock, "close"):
                clock.close()
            if counted:
                with self._lock:
                    self._running -= 1
                    if self._running == 0:
                        self._finished.set()


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
                    out[key] = svc.offloader.resolve((ev.data or {}).get("result"))
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
            lr.schedule = {"lanes": 1 if idx else 0, "gil_share": None, "widened_at": None, "narrowed": 0,
                           "final_lanes": 1 if idx else 0}  # fmt: skip  # type: ignore[attr-defined]
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
