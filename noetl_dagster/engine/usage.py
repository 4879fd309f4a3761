"""Measured usage of one task attempt: the ``usage`` object of its ``task.done`` event.

The worker wraps every task call in a :class:`Meter`; what it measures lands in
``outcome.meta.usage`` of the terminal event, so replay and the facts read the
recorded numbers and never measure again. What no attempt used — the engine's own
work for an execution — is its ``platform`` usage (:class:`Window`), recorded once in
the execution's ``workflow.finished`` event.

How (and why this way — see docs/analytics.md "Measured usage"):

- ``cpu_s``: CPU of the whole process (``time.process_time``, every thread) while the
  attempt runs **alone** — no other attempt active when it starts nor started before it
  ends — so threads the task starts and native pools (DuckDB, Arrow, polars) count. When
  attempts overlap (parallel loop lanes), each falls back to the CPU of its own thread
  (:func:`time.thread_time`); what their other threads burned is then left to the
  execution's ``platform`` line, never lost. An attempt nested in another on the same
  thread (a sub-playbook's tasks inside a ``kind: playbook`` task) is taken out of the
  outer attempt's figure, so nothing counts twice.
- ``child_cpu_s``: user+system CPU of the subprocesses that finished and were waited for during
  the task: the ``getrusage(RUSAGE_CHILDREN)`` delta when the attempt ran alone; beside other
  attempts (whose children that delta would hold too) the children it reaped itself (``wait4``).
- ``child_maxrss_bytes``: the peak RSS of the subprocesses the attempt ran: the child's own
  ``VmHWM`` when it reports it (python ``isolation: process``), else per child from ``wait4``
  when reaped by :class:`Popen` (shell), else the ``RUSAGE_CHILDREN`` mark when it rose during
  the attempt — the last two only above the worker's own mark, which a child inherits.
- ``mem_peak_bytes``: the process's resident high-water mark (``ru_maxrss``) at the end
  when the attempt raised it, else the larger of the start and end RSS (``/proc/self/statm``).
  The mark is per process: after a big attempt freed its memory it would hide every
  smaller peak after it, so an attempt that starts alone with the mark more than
  ``HWM_SLACK`` above the resident set resets it first (``/proc/self/clear_refs`` ``5``,
  Linux: 0.3 us). ``mem_delta_bytes`` = peak - starting RSS + ``child_maxrss_bytes``: the
  memory the attempt added, in this process and in its children (what RAM is priced on).
  An attempt under ``SHORT_TASK_S`` (0.5 ms) is not read again at its end: its peak is the
  starting RSS (read at most 1 ms before). tracemalloc would be exact for Python objects but
  slows allocation-heavy tasks several times, and misses C buffers.
- ``wall_s``: :func:`time.perf_counter` delta.
- counters a tool, store or IO manager adds with :func:`count` while the task
  runs (``bytes_read``, ``bytes_written``, ``net_in_bytes``, ``net_out_bytes``,
  ``egress_bytes``, ``rows``, ``shots``, ``qpu_s``…) — a context variable, so
  no driver is imported here and concurrent tasks do not mix.
- from the result: ``rows`` from ``row_count`` / ``rows``, ``shots`` from a
  quantum result, when no tool counted them.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

try:  # POSIX only; elsewhere usage has wall time and counters
    import resource as _resource
except ImportError:  # pragma: no cover - Windows
    _resource = None  # type: ignore[assignment]

_COUNTERS: ContextVar[dict[str, float] | None] = ContextVar("noetl_usage_counters", default=None)
_METER: ContextVar[Meter | None] = ContextVar("noetl_usage_meter", default=None)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# ru_maxrss is KiB on Linux, bytes on macOS
_MAXRSS_UNIT = 1 if os.uname().sysname == "Darwin" else 1024
_STATM = "/proc/self/statm"
_HAS_STATM = os.path.exists(_STATM)


def count(**amounts: float) -> None:
    """Add ``amounts`` to the running task's usage (no-op outside a task)."""
    c = _COUNTERS.get()
    if c is None:
        return
    for k, v in amounts.items():
        if v:
            c[k] = c.get(k, 0) + v


def peak(**amounts: float) -> None:
    """Raise the running task's ``amounts`` to at least these values (peaks: no-op outside a task)."""
    c = _COUNTERS.get()
    if c is None:
        return
    for k, v in amounts.items():
        if v and v > c.get(k, 0):
            c[k] = v


_statm_fd: int | None = None  # /proc/self resolves at open, so a forked child reopens (below)
_clear_fd: int | None = None  # /proc/self/clear_refs, opened on the first reset (-1: not available)


def _reopen_after_fork() -> None:
    global _statm_fd, _clear_fd
    _statm_fd = None  # the child's /proc/self is another process: open it again on first use
    _clear_fd = None
    _ACTIVE.clear()  # the parent's attempts are not running here


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reopen_after_fork)


def _rss() -> int:
    """Resident bytes now: one pread of a kept-open /proc/self/statm (3 us; open+read is 20 us)."""
    global _statm_fd
    if not _HAS_STATM:
        return 0
    if _statm_fd is None:
        _statm_fd = os.open(_STATM, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    return int(os.pread(_statm_fd, 64, 0).split()[1]) * _PAGE


_mark_before_reset = [0]  # the highest ru_maxrss a reset cleared: process_peak_bytes() keeps it


def process_peak_bytes() -> int:
    """The process's peak resident set since it started, as ``ru_maxrss`` would say had the meter
    never reset the mark (read this, not ``ru_maxrss``, for a whole run's peak)."""
    if _resource is None:
        return 0
    return max(_mark_before_reset[0], _resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss) * _MAXRSS_UNIT


def _reset_hwm(mark: int) -> bool:
    """Reset the process's resident high-water mark (VmHWM, ``ru_maxrss``; ``mark`` is its value
    now) to the current RSS: ``echo 5 > /proc/self/clear_refs`` (Linux >= 4.0; 0.3 us kept open)."""
    global _clear_fd
    if mark > _mark_before_reset[0]:
        _mark_before_reset[0] = mark
    if _clear_fd is None:
        try:
            _clear_fd = os.open("/proc/self/clear_refs", os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            _clear_fd = -1
    if _clear_fd < 0:
        return False
    try:
        os.write(_clear_fd, b"5")
    except OSError:
        return False
    return True


# A task attempt shorter than this can neither have run and reaped a child process (fork, exec
# and wait take over a millisecond) nor have grown the resident set measurably, so its stop
# reads no memory or child figures: its peak is its starting RSS (issue 19: 3 system calls and a
# pread less per short task). Longer attempts are measured in full.
SHORT_TASK_S = 0.0005
# The starting RSS is read again when the last reading is older than this (between two short
# tasks of one engine the process grows by less than a page).
RSS_FRESH_S = 0.001
# An attempt starting alone resets the high-water mark when it is more than this above the
# resident set (an earlier peak was freed): the peak it then records is off by at most this.
HWM_SLACK = 1 << 20
_rss_seen: tuple[float, int] = (-1.0, 0)  # (perf_counter, rss): replaced whole, so threads never mix


def _recent_rss() -> int:
    global _rss_seen
    now = time.perf_counter()
    seen = _rss_seen
    if now - seen[0] < RSS_FRESH_S:
        return seen[1]
    rss = _rss()
    _rss_seen = (now, rss)
    return rss


# Attempts running now (all threads), and how many top-level attempts ever started: an attempt
# is "alone" when every active attempt is itself or one it is nested in, and none started since.
_ACTIVE: set[Meter] = set()
_started = [0]  # a top-level attempt's start bumps it (a lost concurrent bump still changes it)


class Meter:
    """One task attempt's measurement; ``stop`` returns the ``usage`` mapping.

    ``window``: the execution's :class:`Window`, which the attempt's CPU is taken out of."""

    __slots__ = ("_token", "_mtoken", "_counters", "_wall", "_cpu", "_proc", "_rss", "_maxrss", "_child",
                 "_outer", "_depth", "_gen", "_alone", "_nested", "_folded", "_window")  # fmt: skip

    def __init__(self, window: Window | None = None) -> None:
        self._counters: dict[str, float] = {}
        self._token = _COUNTERS.set(self._counters)
        outer = self._outer = _METER.get()
        self._mtoken = _METER.set(self)
        self._window = window
        self._nested = 0.0  # gross CPU of the attempts (and sub-executions) nested in this one
        self._folded = 0  # the high-water mark a nested attempt saw before it reset it
        self._rss = _recent_rss()
        _ACTIVE.add(self)
        if outer is None:
            self._depth = 0
            _started[0] += 1
        else:
            self._depth = outer._depth + 1
        self._gen = _started[0]
        self._alone = len(_ACTIVE) == self._depth + 1
        if _resource is not None:
            ch = _resource.getrusage(_resource.RUSAGE_CHILDREN)
            self._child = (ch.ru_utime + ch.ru_stime, ch.ru_maxrss)
            maxrss = _resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss
            if self._alone and maxrss * _MAXRSS_UNIT > self._rss + HWM_SLACK:
                # an earlier peak, since freed, would hide this attempt's: reset the mark, after
                # handing it to the attempts this one runs inside (they are still measuring)
                m = outer
                while m is not None:
                    m._folded = max(m._folded, maxrss)
                    m = m._outer
                if _reset_hwm(maxrss):
                    maxrss = _resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss
            self._maxrss = maxrss
        else:
            self._child = (0.0, 0)
            self._maxrss = 0
        self._cpu = time.thread_time()
        self._proc = time.process_time()
        self._wall = time.perf_counter()

    def stop(self, result: Any = None) -> dict[str, Any]:
        wall = time.perf_counter() - self._wall
        alone = self._alone and _started[0] == self._gen
        if alone:  # nothing ran beside it: every thread is its
            gross = time.process_time() - self._proc
        else:
            gross = time.thread_time() - self._cpu
        _ACTIVE.discard(self)
        try:
            _COUNTERS.reset(self._token)
            _METER.reset(self._mtoken)
        except ValueError:  # stopped in another context (should not happen): leave the vars alone
            pass
        if self._outer is not None:
            self._outer._nested += gross
        cpu = gross - self._nested
        cpu = cpu if cpu > 0 else 0.0
        _attribute(cpu)
        w = self._window
        if w is not None:
            if w.thread is None:
                w.add(cpu)
            else:  # a sub-execution's window counts its own thread: what its attempts used of it
                w.add(cpu, time.thread_time() - self._cpu if threading.get_ident() == w.thread else 0.0)
        u: dict[str, Any] = {"wall_s": round(wall, 6), "cpu_s": round(cpu, 6)}
        counters = self._counters
        if _resource is not None and wall < SHORT_TASK_S:  # see SHORT_TASK_S: memory as at the start
            u["mem_peak_bytes"], u["mem_delta_bytes"] = self._rss, 0
        elif _resource is not None:
            global _rss_seen
            maxrss, rss = max(_resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss, self._folded), _rss()
            _rss_seen = (time.perf_counter(), rss)
            peak_ = maxrss * _MAXRSS_UNIT if maxrss > self._maxrss else max(rss, self._rss)
            ch = _resource.getrusage(_resource.RUSAGE_CHILDREN)
            reaped = counters.pop("child_cpu_s", 0.0)  # children this attempt reaped itself (Popen)
            # a child that lives on (the sandbox worker): read from /proc per task, so charged to the
            # tasks it ran; when this attempt reaps it, that part of the delta was charged already
            live = counters.pop("live_child_cpu_s", 0.0)
            charged = counters.pop("child_cpu_charged_s", 0.0)
            # alone, the process-wide delta is all of its children; beside others it would count
            # theirs too, so then only the children it reaped itself
            child_cpu = live + (
                max(ch.ru_utime + ch.ru_stime - self._child[0] - charged, 0.0) if alone else reaped
            )
            if child_cpu > 0:
                u["child_cpu_s"] = round(child_cpu, 6)
            child_peak = counters.pop("child_maxrss_bytes", 0)
            if not child_peak and ch.ru_maxrss > max(self._child[1], maxrss):
                # reaped elsewhere, and above anything this process held (a child's mark starts at
                # its parent's, see Popen): that child's own peak
                child_peak = ch.ru_maxrss * _MAXRSS_UNIT
            if child_peak:
                u["child_maxrss_bytes"] = int(child_peak)
            u["mem_peak_bytes"] = peak_
            u["mem_delta_bytes"] = max(0, peak_ - self._rss) + int(child_peak)
        for k, v in counters.items():
            u[k] = round(v, 6) if isinstance(v, float) else v
        _from_result(u, result)
        return u


def _popen_class() -> type:
    """``Popen``, defined at its first use: a run that starts no process imports no ``subprocess``."""
    import subprocess  # noqa: PLC0415 - start-up (issue 35)

    class Popen(subprocess.Popen):
        """``subprocess.Popen`` that reaps its child with ``wait4`` and reports the child's own peak
        RSS to the running attempt (``child_maxrss_bytes``), where the process-wide ``RUSAGE_CHILDREN``
        mark only ever shows the largest child so far. A child's kernel mark starts at its parent's
        (fork and vfork hand it over until exec), so only a figure above the worker's own mark at
        spawn is the child's; a smaller child's peak stays unknown here (a child can report its own
        ``VmHWM``, as the python tool's ``isolation: process`` runner does)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._parent_mark = (
                _resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss if _resource is not None else 0
            )
            super().__init__(*args, **kwargs)

        def _try_wait(self, wait_flags: int) -> tuple[int, int]:  # CPython's hook under _waitpid_lock
            if not hasattr(os, "wait4"):  # pragma: no cover - not POSIX
                return super()._try_wait(wait_flags)  # type: ignore[misc]
            try:
                pid, sts, ru = os.wait4(self.pid, wait_flags)
            except ChildProcessError:
                return self.pid, 0
            if pid == self.pid:
                count(child_cpu_s=ru.ru_utime + ru.ru_stime)
                if ru.ru_maxrss > self._parent_mark:
                    peak(child_maxrss_bytes=ru.ru_maxrss * _MAXRSS_UNIT)
            return pid, sts

    return Popen


def __getattr__(name: str) -> Any:
    if name == "Popen":
        globals()["Popen"] = cls = _popen_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def own_hwm() -> int:
    """This process's own resident high-water mark (``VmHWM``: its memory since exec, not the
    mark ``ru_maxrss`` inherits from the parent that spawned it), 0 where unknown."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


# -- the engine's own usage per execution: the `platform` line ----------------------------------
# Every CPU second of the process goes to one attempt or one platform line, never two: what was
# attributed (attempts' cpu_s, closed windows' platform) is appended here, lock-free (parallel lanes),
# and summed in batches; a window's platform is its process CPU less what was attributed meanwhile.
_LEDGER: list[float] = []
_ledger_sum = [0.0]
_LEDGER_LOCK = threading.Lock()


def _attribute(cpu_s: float) -> None:
    _LEDGER.append(cpu_s)
    if len(_LEDGER) > 4096:
        with _LEDGER_LOCK:
            _attributed()


def _attributed() -> float:
    """CPU attributed so far (call under _LEDGER_LOCK; only the items summed are removed)."""
    n = len(_LEDGER)
    _ledger_sum[0] += sum(_LEDGER[:n])
    del _LEDGER[:n]
    return _ledger_sum[0]


class Window:
    """One execution's time in this process: the process's CPU (all threads) over it, less what
    task attempts and other executions' platform lines took meanwhile, is the engine's own work
    for it — its ``platform`` usage, recorded when it finishes.

    A sub-execution started by a task attempt (``kind: playbook``; ``inside``) counts its own
    thread only: that thread's CPU over the window less what its attempts used of it. Its
    siblings on other lanes run at the same time, and their attempts are still running when it
    closes, so the process's figure would hold their CPU too (and count it twice)."""

    __slots__ = ("_proc", "_wall", "_attr0", "_tasks", "_summed", "_lock", "_own", "thread", "window")

    def __init__(self, from_process_start: bool = False, inside: bool = False) -> None:
        self.thread = threading.get_ident() if inside else None
        with _LEDGER_LOCK:
            self._attr0 = 0.0 if from_process_start else _attributed()
            self._proc = (
                0.0 if from_process_start else (time.thread_time() if inside else time.process_time())
            )
        self._wall = time.perf_counter() - (_process_age() if from_process_start else 0.0)
        self.window = "process" if from_process_start else ("thread" if inside else "execution")
        self._tasks: list[float] = []  # this execution's attempts (lock-free appends, summed in batches)
        self._own = [0.0]  # thread windows: CPU its attempts used of its thread
        self._summed = 0.0
        self._lock = threading.Lock()

    def add(self, cpu_s: float, own_thread_s: float = 0.0) -> None:
        t = self._tasks
        t.append(cpu_s)
        if own_thread_s:
            with self._lock:
                self._own[0] += own_thread_s
        if len(t) > 4096:
            self._sum()

    def _sum(self) -> float:
        with self._lock:  # only the items summed are removed; appends meanwhile stay
            t = self._tasks
            n = len(t)
            self._summed += sum(t[:n])
            del t[:n]
            return self._summed

    def usage(self) -> dict[str, Any]:
        with _LEDGER_LOCK:
            if self.thread is None:
                proc = time.process_time() - self._proc
                taken = _attributed() - self._attr0
            else:  # closed on the thread that opened it (Engine.finish after drive, run_child)
                proc = time.thread_time() - self._proc
                with self._lock:
                    taken = self._own[0]
            platform = proc - taken if proc > taken else 0.0
            _LEDGER.append(platform)  # windows still open do not take it again
        tasks = self._sum()
        return {
            "cpu_s": round(platform, 6),
            "process_cpu_s": round(proc, 6),
            "task_cpu_s": round(tasks, 6),
            "other_cpu_s": round(max(0.0, taken - tasks), 6),
            "wall_s": round(time.perf_counter() - self._wall, 6),
            "window": self.window,
        }


def _process_age() -> float:
    """Seconds since this process started (``/proc/self/stat`` start time vs ``/proc/uptime``), 0 if unknown."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            start = int(fh.read().rsplit(b")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime", "rb") as fh:
            return max(0.0, float(fh.read().split()[0]) - start)
    except (OSError, ValueError, IndexError):
        return 0.0


_WINDOWS: dict[str, Window] = {}
_WINDOWS_MAX = 10_000  # executions seen here that another process finished: the oldest go
_from_process_start = [False]


def charge_process_start() -> None:
    """This process runs one execution (``noetl-dagster run``): the next execution window opens
    at process start, so interpreter start-up and imports are that execution's platform usage."""
    _from_process_start[0] = True


def window(execution_id: str) -> Window:
    """The execution's window in this process, opened now on first use."""
    w = _WINDOWS.get(execution_id)
    if w is None:
        w = Window(_from_process_start[0], inside=_METER.get() is not None)
        _from_process_start[0] = False
        if len(_WINDOWS) >= _WINDOWS_MAX:
            _WINDOWS.pop(next(iter(_WINDOWS)), None)
        w = _WINDOWS.setdefault(execution_id, w)
    return w


def platform(execution_id: str) -> dict[str, Any] | None:
    """Close the execution's window: its ``platform`` usage (for ``workflow.finished``; None when
    this process never opened one). A sub-execution run inside a task attempt hands its platform
    CPU to that attempt's meter, which takes it out of its own figure (priced here, not twice)."""
    w = _WINDOWS.pop(execution_id, None)
    if w is None:
        return None
    u = w.usage()
    outer = _METER.get()
    if outer is not None:
        outer._nested += u["cpu_s"]
    return u


def _from_result(u: dict[str, Any], result: Any) -> None:
    """Rows and shots a result states, when no tool counted them."""
    if not isinstance(result, Mapping):
        return
    if "rows" not in u:
        n = result.get("row_count")
        if n is None:
            n = result.get("rows_written", result.get("rows"))
        if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
            u["rows"] = n
    if "shots" not in u and isinstance(result.get("shots"), int):
        u["shots"] = result["shots"]


class network_into:  # noqa: N801 - used as a function: ``with network_into(usage):``
    """Add the network bytes counted inside (the upload of the task's offloaded result, after its
    meter stopped) to ``usage``; the stored bytes themselves come from the ref (:func:`add_offload`).
    A class, not a generator context manager: 5.5 us instead of 12 per task attempt (load 18)."""

    __slots__ = ("_usage", "_counters", "_token")

    def __init__(self, usage: dict[str, Any]) -> None:
        self._usage = usage

    def __enter__(self) -> None:
        self._counters: dict[str, float] = {}
        self._token = _COUNTERS.set(self._counters)

    def __exit__(self, *exc: object) -> None:
        _COUNTERS.reset(self._token)
        for k in _NETWORK:
            v = self._counters.get(k)
            if v:
                self._usage[k] = self._usage.get(k, 0) + v


_NETWORK = ("net_out_bytes", "net_in_bytes", "egress_bytes")


def add_offload(usage: dict[str, Any], recorded_result: Any) -> None:
    """Bytes the payload store wrote for an offloaded result (``{"$ref": {..., size}}``)."""
    if isinstance(recorded_result, Mapping):
        ref = recorded_result.get("$ref")
        if isinstance(ref, Mapping) and isinstance(ref.get("size"), int):
            usage["bytes_written"] = usage.get("bytes_written", 0) + ref["size"]


_IN_CLUSTER = tuple(
    s.strip()
    for s in os.environ.get("NOETL_IN_CLUSTER_SUFFIXES", ".svc,.svc.cluster.local,.internal,.local").split(
        ","
    )
    if s.strip()
)


def in_cluster(host: str | None) -> bool:
    """Whether ``host`` is inside the cluster: loopback, private or link-local IPs, or a cluster DNS suffix.

    No DNS lookup (it would cost more than the request): a public name is egress.
    """
    if not host:
        return False
    h = host.strip("[]").lower()
    if h == "localhost" or h.endswith(_IN_CLUSTER):
        return True
    import ipaddress

    try:
        ip = ipaddress.ip_address(h)
    except ValueError:
        return "." not in h  # a bare service name resolves inside the cluster
    return ip.is_private or ip.is_loopback or ip.is_link_local


def count_network(host: str | None, sent: int, received: int) -> None:
    """Network bytes of one request; what leaves the cluster is egress too."""
    if _COUNTERS.get() is None:
        return
    count(net_out_bytes=sent, net_in_bytes=received)
    if not in_cluster(host):
        count(egress_bytes=sent)


def accumulate(total: dict[str, float], usage: Any) -> None:
    """Add one attempt's numeric ``usage`` into ``total`` (peaks take the max, the rest sums)."""
    if not isinstance(usage, Mapping):
        return
    for k, v in usage.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if k in _PEAKS:
            total[k] = max(total.get(k, 0), v)
        else:
            total[k] = total.get(k, 0) + v
    total["attempts"] = total.get("attempts", 0) + 1


_PEAKS = frozenset({"mem_peak_bytes", "child_maxrss_bytes"})
