"""What one step run, loop and pipeline frame carry: the records the worker and the loop phases share."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from noetl_dagster.dsl.model import Loop, Step


MAX_PIPELINE_TRANSITIONS = 100_000
DEFAULT_MAX_IN_FLIGHT = 16
DEFAULT_RETRY_ATTEMPTS = 3
DEFAULT_RETRY_DELAY = 1.0


def run_bounded(n: int, workers: int, fn: Callable[[int], Any], *, name: str = "noetl") -> None:
    """Call ``fn(0..n-1)`` on at most ``workers`` threads that pull the next index (no future per item)."""
    import threading

    counter = iter(range(n))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        while not errors:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            try:
                fn(i)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                errors.append(e)
                return

    threads = [threading.Thread(target=worker, name=f"{name}-{k}", daemon=True) for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@dataclass
class StepRun:
    step: str
    step_run_id: str
    ok: bool
    result: Any
    error: dict[str, Any] | None
    event_name: str  # call.done | call.error | loop.done
    args: Any = None


class CtxConflict(Exception):
    pass


@dataclass
class _Frame:
    """Where a pipeline runs: its step run, the loop iteration (if any) and its iter scope."""

    step: Step
    step_run_id: str
    args: Any
    iter: dict[str, Any]
    loop_id: str | None = None
    iteration: int | None = None
    ctx_guard: _CtxGuard | None = None


class _CtxGuard:
    """Parallel loops: two iterations writing one ctx key is rejected (SEMANTICS §4)."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self.writers: dict[str, int] = {}

    def claim(self, keys: Mapping[str, Any], iteration: int) -> None:
        with self._lock:
            for k in keys:
                owner = self.writers.setdefault(k, iteration)
                if owner != iteration:
                    raise CtxConflict(
                        f"parallel loop iterations {owner} and {iteration} both write ctx.{k}; "
                        "write per-iteration state with set_iter, or use a sequential loop"
                    )


@dataclass
class LoopRun:
    """One loop of a step run between loop.started and loop.done (see Worker.loop_begin)."""

    loop: Loop
    frame: _Frame
    loop_id: str
    items: list[Any]
    max_in_flight: int
    t0: float
    results: list[Any] = field(default_factory=list)
    oks: list[bool] = field(default_factory=list)
    guard: _CtxGuard | None = None
    started_before: set[int] = field(default_factory=set)  # resumed: iterations whose start is in the log

    def __post_init__(self) -> None:
        n = len(self.items)
        self.results = self.results or [None] * n
        self.oks = self.oks or [False] * n
        if self.parallel and self.guard is None:
            self.guard = _CtxGuard()

    @property
    def total(self) -> int:
        return len(self.items)

    @property
    def parallel(self) -> bool:
        return self.loop.mode == "parallel" and len(self.items) > 1


MAX_ERROR_CHARS = 64 * 1024  # an error message in an event is cut here (a tool may raise with any text)


def _error(kind: str, message: str, *, retryable: bool = False, code: Any = None) -> dict[str, Any]:
    if type(message) is str and len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS] + "... (truncated)"
    return {"kind": kind, "message": message, "retryable": retryable, "code": code}


def outcome_envelope(ok: bool, result: Any, error: Any) -> dict[str, Any]:
    """The outcome (SEMANTICS §3): ``result``; ``data`` follows the `.data` rule (the result's own
    ``data`` key when it has one, e.g. an HTTP body, else the result); ``response`` is the result."""
    data = result["data"] if isinstance(result, dict) and "data" in result else result
    return {
        "status": "ok" if ok else "error",
        "result": result,
        "data": data,
        "response": result,
        "error": error,
    }


def _err_outcome(error: dict[str, Any]) -> dict[str, Any]:
    return outcome_envelope(False, None, error)
