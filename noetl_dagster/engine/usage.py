"""Measured usage of one task attempt: the ``usage`` object of its ``task.done`` event.

The worker wraps every task call in a :class:`Meter`; what it measures lands in
``outcome.meta.usage`` of the terminal event, so replay and the facts read the
recorded numbers and never measure again.

How (and why this way — see docs/analytics.md "Measured usage"):

- ``cpu_s``: CPU of the calling thread only (:func:`time.thread_time`: ``getrusage(RUSAGE_THREAD)``
  is updated only at scheduler ticks and reads 0 for short tasks in worker threads),
  which is right for tasks that run in-process on the worker thread (parallel
  loop iterations each have their own thread and their own meter).
- ``child_cpu_s`` / ``child_maxrss_bytes``: ``getrusage(RUSAGE_CHILDREN)``
  delta — user+system CPU of the subprocesses (shell, container CLIs) that
  finished and were waited for during the task. Process-wide: two tasks that
  reap children at the same time share the figure.
- ``mem_peak_bytes`` / ``mem_delta_bytes``: resident set size from
  ``/proc/self/statm`` at start and end, and the process high-water mark
  ``ru_maxrss``. If the high-water mark rose during the task the task set it,
  so the peak is exact; otherwise the peak is the larger of the start and end
  RSS (a lower bound). An attempt under ``SHORT_TASK_S`` (0.5 ms) is not read
  again at its end: its peak is the starting RSS (read at most 1 ms before).
  tracemalloc would be exact for Python objects but slows allocation-heavy
  tasks several times, and misses C buffers.
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
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

try:  # POSIX only; elsewhere usage has wall time and counters
    import resource as _resource
except ImportError:  # pragma: no cover - Windows
    _resource = None  # type: ignore[assignment]

_COUNTERS: ContextVar[dict[str, float] | None] = ContextVar("noetl_usage_counters", default=None)
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


_statm_fd: int | None = None  # /proc/self resolves at open, so a forked child reopens (below)


def _reopen_after_fork() -> None:
    global _statm_fd
    _statm_fd = None  # the child's /proc/self is another process: open it again on first use


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


# A task attempt shorter than this can neither have run and reaped a child process (fork, exec
# and wait take over a millisecond) nor have grown the resident set measurably, so its stop
# reads no memory or child figures: its peak is its starting RSS (issue 19: 3 system calls and a
# pread less per short task). Longer attempts are measured in full.
SHORT_TASK_S = 0.0005
# The starting RSS is read again when the last reading is older than this (between two short
# tasks of one engine the process grows by less than a page).
RSS_FRESH_S = 0.001
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


# CPU comes from time.thread_time (CLOCK_THREAD_CPUTIME_ID), not getrusage(RUSAGE_THREAD):
# the kernel updates a running thread's rusage times only at scheduler ticks, so a task of
# under a tick measured 0.0 CPU in loop worker threads (tests/analytics/test_allocation.py).
def _cpu_and_maxrss() -> tuple[float, int]:
    maxrss = _resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss if _resource is not None else 0
    return time.thread_time(), maxrss


class Meter:
    """One task attempt's measurement; ``stop`` returns the ``usage`` mapping."""

    __slots__ = ("_token", "_counters", "_wall", "_cpu", "_rss", "_maxrss", "_child")

    def __init__(self) -> None:
        self._counters: dict[str, float] = {}
        self._token = _COUNTERS.set(self._counters)
        self._rss = _recent_rss()
        if _resource is not None:
            ch = _resource.getrusage(_resource.RUSAGE_CHILDREN)
            self._child = (ch.ru_utime + ch.ru_stime, ch.ru_maxrss)
        else:
            self._child = (0.0, 0)
        self._cpu, self._maxrss = _cpu_and_maxrss()
        self._wall = time.perf_counter()

    def stop(self, result: Any = None) -> dict[str, Any]:
        wall = time.perf_counter() - self._wall
        try:
            _COUNTERS.reset(self._token)
        except ValueError:  # stopped in another context (should not happen): leave the var alone
            pass
        short = wall < SHORT_TASK_S  # see SHORT_TASK_S: memory and children as at the start
        u: dict[str, Any] = {"wall_s": round(wall, 6), "cpu_s": round(time.thread_time() - self._cpu, 6)}
        if _resource is not None and short:
            u["mem_peak_bytes"], u["mem_delta_bytes"] = self._rss, 0
        elif _resource is not None:
            maxrss, rss = _resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss, _rss()
            peak = maxrss * _MAXRSS_UNIT if maxrss > self._maxrss else max(rss, self._rss)
            u["mem_peak_bytes"] = peak
            u["mem_delta_bytes"] = max(0, peak - self._rss)
            ch = _resource.getrusage(_resource.RUSAGE_CHILDREN)
            child_cpu = ch.ru_utime + ch.ru_stime - self._child[0]
            if child_cpu > 0:
                u["child_cpu_s"] = round(child_cpu, 6)
                u["child_maxrss_bytes"] = ch.ru_maxrss * _MAXRSS_UNIT
        for k, v in self._counters.items():
            u[k] = round(v, 6) if isinstance(v, float) else v
        _from_result(u, result)
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
