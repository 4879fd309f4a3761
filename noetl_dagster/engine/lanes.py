"""Parallel loop lanes: a parallel loop's iterations on 1..max_in_flight threads, widened by a
measured rule (the GIL share of its iterations) and narrowed again by the same rule; see
:class:`Lanes`. Used by engine.loops (step loops); no dagster, no engine state."""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

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


_PREAD: list[Callable[[int], bytes]] = []


def _pread(fd: int) -> bytes:
    """The first 128 bytes of ``fd`` read WITHOUT releasing the GIL (libc ``pread`` through
    ``ctypes.PyDLL``; ``os.pread`` releases it): a lane reading its clocks must not hand the GIL
    to another thread in the middle of a measurement, or its wait to get it back lands in the
    wall time after the run-queue figure was read, and reads as I/O."""
    if not _PREAD:
        try:
            import ctypes  # noqa: PLC0415 - only a parallel loop needs it

            fn = ctypes.PyDLL(None).pread
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_long]
            fn.restype = ctypes.c_ssize_t

            def read(fd: int) -> bytes:
                buf = ctypes.create_string_buffer(128)
                n = fn(fd, buf, 128, 0)
                if n < 0:
                    raise OSError("pread failed")
                return buf.raw[:n]

            _PREAD.append(read)
        except (ImportError, OSError, AttributeError):  # pragma: no cover - no libc pread
            _PREAD.append(lambda fd: os.pread(fd, 128, 0))
    return _PREAD[0](fd)


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
            wait_ns = _pread(fd).split()[1]
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


def _runnable(native_id: int | None) -> bool:
    """Whether ANOTHER thread of this process is running or runnable now (state ``R``): its
    schedstat charges a run-queue wait only when the thread gets a core, so a lane read while
    it waits for one shows neither CPU nor run-queue time for that wait, as if it waited on I/O."""
    if native_id is None:
        return False
    try:
        with open(f"/proc/self/task/{native_id}/stat", "rb") as fh:
            return fh.read().rpartition(b")")[2].split()[0] == b"R"
    except (OSError, IndexError):
        return False


class _OtherThreads:
    """CPU plus run-queue seconds used so far by the threads of this process that are not lanes
    (the loop's own thread, a test harness's or a server's threads, event writers): per thread
    id, from ``/proc/self/task/<tid>/schedstat`` (files kept open; Linux only, else empty).

    A lane that waits for the GIL while such a thread holds it, or while the thread that is to
    take it next sits runnable without a core, is neither running nor runnable itself: without
    this account that wait reads as I/O and a CPU-bound loop widens (issue: a CPU-bound loop
    widened on two such stalls right after its warm-up, under ``pytest -n 3`` on 2 cores)."""

    def __init__(self) -> None:
        self._open: tuple[tuple[int, int], ...] = ()  # (tid, fd) of the threads counted
        self._fds: list[int] = []  # every fd opened (closed at the end: a lane may still read one)
        self.lanes: set[int] = set()  # native ids of the lanes (not counted)

    def refresh(self) -> None:
        """List the process' threads again (by the loop's own thread: listing and opening release
        the GIL; a lane only reads)."""
        try:
            tids = [int(name) for name in os.listdir("/proc/self/task")]
        except OSError:
            return
        known = dict(self._open)
        out = []
        for tid in tids:
            if tid in self.lanes:
                continue
            fd = known.get(tid)
            if fd is None:
                try:
                    fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
                except OSError:
                    continue
                self._fds.append(fd)
            out.append((tid, fd))
        self._open = tuple(out)

    def read(self) -> dict[int, int]:
        out: dict[int, int] = {}
        lanes = self.lanes
        for tid, fd in self._open:
            if tid in lanes:  # a lane started since the last refresh
                continue
            try:
                cpu_ns, wait_ns, *_ = _pread(fd).split()
                out[tid] = int(cpu_ns) + int(wait_ns)
            except (OSError, ValueError):  # the thread ended
                continue
        return out

    @staticmethod
    def used(before: dict[int, int], after: dict[int, int]) -> float:
        """Seconds the other threads ran or sat runnable between two reads (a thread born in
        between counts from its start; one that ended no longer counts)."""
        return sum(v - before.get(tid, 0) for tid, v in after.items()) / 1e9

    def close(self) -> None:
        self._open = ()
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


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
      for a core (so a busy machine is not mistaken for I/O), and the CPU and run-queue time
      of the process' threads that are not lanes over the same interval (``_OtherThreads``).
      The iteration's GIL share is ``g = cpu / (wall - run-queue wait - explained)``, where
      ``explained`` is the part of the remaining off-CPU time those other threads account for
      (at most all of it): a lane waiting for the GIL while another thread holds it, or while
      the thread that takes it next sits runnable without a core (the loop's own thread, a
      test harness's, an event writer's, on an overloaded machine), is neither running nor
      runnable and would otherwise read as I/O: a CPU-bound loop widened on two such stalls
      after its warm-up under ``pytest -n 3`` on 2 cores. ``g`` is the fraction of its time
      the iteration runs Python (or C holding the interpreter) rather than waiting on I/O, a
      sleep or a child process. Threads overlap only the waiting, so at most ``1/g`` lanes are
      useful. Sibling lanes are not "other threads": their contention is what narrows a loop.
    - After each measured iteration the lane takes the median ``g`` of the last
      ``LANE_SAMPLES`` measured iterations, once there are ``LANE_MIN_SAMPLES`` (the median
      ignores the odd iteration that waited on an event-store flush), or at two when both
      waited at least 90% of their time (``g <= LANE_CLEAR_WAIT``), and widens
      the loop to ``min(max_lanes, floor(LANE_HEADROOM/g))`` lanes when that is more than it
      has (the headroom pays for the lanes' own hand-offs): a second lane needs ``g <= 0.4``.
      Widening needs two such windows in a row (the samples restart after the first; the
      narrower answer wins): one burst of load or a first flush stalls neighbouring iterations
      together, enough to fool one median (CI: a CPU-bound loop widened at 0.04 s); an I/O-bound
      loop pays two or three more serial iterations.
    - A long iteration is judged while it runs, by the loop's own thread. It wakes every
      ``LANE_TICK_SECONDS`` until ``LANE_MIN_SAMPLES`` were measured, then only every
      ``LANE_PATIENCE_SECONDS/2``: each wake-up takes the GIL from a lane, and on an overloaded
      machine the hand-off stalls the lane until the woken thread gets a core. After the
      warm-up, when no iteration finished for ``LANE_PATIENCE_SECONDS``
      (``LANE_FIRST_PATIENCE_SECONDS`` until ``LANE_MIN_SAMPLES`` were measured), the lanes'
      share over that time (the other threads' time explained the same way) decides alike; a
      lane that is runnable at that moment counts as waiting for a core (the kernel charges a
      run-queue wait to the thread's schedstat only when it gets the core back).
    - A lane reads its clocks without releasing the GIL (``_pread``): were it handed to another
      thread mid-measurement, the wait to get it back would fall after the run-queue figure was
      read and count as I/O.
    - The rule corrects itself: when the median asks for at most half the lanes the loop has
      (iterations that wait on the GIL of their sibling lanes look like waiting, so an
      over-wide CPU-bound loop still measures ``g`` near 1 in most iterations), the width drops
      to that, and lanes above it leave after their current iteration. Samples restart at
      every change. ``max_lanes`` (max_in_flight) is never exceeded.

    A CPU-bound loop (``g`` near 1) thus stays on one lane and costs what the sequential loop
    costs (no GIL hand-offs, no lock contention, the trace in index order); an I/O-bound loop
    widens during its second iteration (it pays one serial iteration, the warm-up). Where no
    thread clock exists the loop widens to ``max_lanes`` at once (the behaviour before the
    rule). Known limits: C code that releases the GIL yet burns CPU (numpy, compression) counts
    as CPU-bound and keeps one lane; ``isolation: process`` (waiting on a child process is
    waiting) gets it the cores. Another thread of the process that keeps a core busy while an
    I/O-bound loop waits (without holding the GIL) is taken for GIL contention: that loop
    widens late or not at all (the other threads' time is known per interval, not when it
    overlapped the lane's wait). Under ``pytest -n 3`` on 2 cores a CPU-bound playbook loop
    still widened to 2-3 lanes for a while in 3 of 5 full-suite runs: its first iterations' waits were
    neither run-queue time nor other threads' CPU (cause not found; not reproduced beside busy
    processes alone). The results and their order are unaffected; the loop costs GIL hand-offs.

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
        self._pending_share: float | None = None  # a first window's GIL share that asked to widen
        self._others = _OtherThreads()  # the process' threads that are not lanes
        self._t0 = time.perf_counter()
        self.gil_share: float | None = None
        self.widened_at: float | None = None  # seconds after the start when the loop first widened
        self.widened_after: int | None = None  # iterations finished by then (a count: load-proof)
        self.narrowed = 0  # times the loop gave lanes back (the rule's own correction)

    def run(self) -> dict[str, Any]:
        if self.n <= 0:
            return {"lanes": 0, "gil_share": None, "widened_at": None, "widened_after": None, "narrowed": 0,
                    "final_lanes": 0}  # fmt: skip
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
                "widened_at": self.widened_at, "widened_after": self.widened_after, "narrowed": self.narrowed,
                "final_lanes": self._width}  # fmt: skip

    def _judge(self) -> None:
        """The sample rule, run by a lane after each measured iteration. Widening needs two
        windows of samples in a row that both ask for more lanes (the second window starts
        after the first: a burst of load stalls neighbouring iterations, not two windows)."""
        samples = sorted(self._samples)
        if len(samples) >= LANE_MIN_SAMPLES or (len(samples) >= 2 and samples[-1] <= LANE_CLEAR_WAIT):
            g = samples[len(samples) // 2]
            with self._decide_lock:
                if self._target(g) > self._width:
                    if self._pending_share is None:  # first window: ask the next one
                        self._pending_share = g
                        self._samples.clear()
                        return
                    g = max(g, self._pending_share)  # the narrower of the two windows' answers
                self._pending_share = None
            self._decide(g)

    def _target(self, g: float) -> int:
        return max(1, min(self.max_lanes, math.floor(LANE_HEADROOM / g))) if g > 0 else self.max_lanes

    def _decide(self, g: float) -> None:
        with self._decide_lock:
            self.gil_share = g
            target = self._target(g)
            if target > self._width:
                if self.widened_at is None:
                    self.widened_at = round(time.perf_counter() - self._t0, 4)
                    self.widened_after = sum(self._done)
                self._width = target
                self._samples.clear()  # the next samples judge the new width
                self._start(target - self._running)
            elif target <= self._width // 2:  # measured as over-wide (GIL-saturated): give lanes back
                self._width = target
                self.narrowed += 1
                self._samples.clear()

    def _clocks(self) -> tuple[list[tuple[float, float] | None], dict[int, int]]:
        lanes = [_thread_clock(t.native_id) if t.is_alive() else None for t in self._threads]
        self._others.refresh()
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
            # a lane waiting for a core right now: its wait so far is not charged yet (see _runnable)
            avail_sum += cpu if _runnable(t.native_id) else _share(cpu, wall, wait, used)
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
