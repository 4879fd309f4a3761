"""Overhead of measured usage (issue 18.1): the engine with and without its usage meter.

1. Micro: one ``Meter()`` + ``stop()`` (what every task attempt pays), best of 3 x 20,000.
2. Engine: the self-routing ``noop`` cycle of bench_engine (N steps, embedded SQLite log),
   once with the real meter and once with a meter that measures nothing, alternating,
   best of R rounds each. Overhead per step = (with - without) / N; ratio = with / without.

    .venv/bin/python -m benchmarks.bench_usage [--steps N] [--rounds R] [--against OLD_USAGE_PY]

``--against``: alternate with the meter of another version instead of no meter, e.g.
``git show a6b0d8a:noetl_dagster/engine/usage.py > /tmp/old_usage.py`` (issue 30.3's before).
Times are CPU seconds of the process (wall time on a shared machine is mostly others' load).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_engine import _run_engine


class _NullMeter:
    def __init__(self, window: Any = None) -> None:
        pass

    def stop(self, result: Any = None) -> dict[str, Any]:
        return {}


def micro(n: int = 20_000) -> float:
    from noetl_dagster.engine.usage import Meter

    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            Meter().stop({"row_count": 3})
        best = min(best, (time.perf_counter() - t) / n)
    return best


def _older_meter(path: str) -> Any:
    """The ``Meter`` of another version of engine/usage.py (``git show REF:noetl_dagster/engine/usage.py``)."""
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.spec_from_file_location("older_usage", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    older = mod.Meter
    import inspect  # noqa: PLC0415

    if inspect.signature(older).parameters:
        return older

    class _Older:  # a meter from before the execution window: called without it
        def __new__(cls, window: Any = None) -> Any:
            return older()

    return _Older


def engine(steps: int, rounds: int, against: str | None = None) -> tuple[float, float]:
    """Best CPU seconds of the cycle with the real meter, and with the null meter (or ``against``)."""
    import noetl_dagster.engine.worker as worker

    doc = {
        "apiVersion": "noetl.io/v2",
        "kind": "Playbook",
        "metadata": {"name": "bench_usage", "path": "benchmarks/usage"},
        "workload": {"n": steps},
        "workflow": [
            {
                "step": "spin",
                "tool": {"kind": "noop"},
                "set": {"ctx.i": "{{ (ctx.i or 0) + 1 }}"},
                "next": {"arcs": [{"step": "spin", "when": "{{ ctx.i < workload.n }}"}]},
            }
        ],
    }
    real = worker.Meter
    other = _older_meter(against) if against else _NullMeter
    on, off = [], []
    with tempfile.TemporaryDirectory() as d:
        _run_engine({**doc, "workload": {"n": 3}}, Path(d) / "warm")
        for r in range(rounds):
            pair = (("on", real, on), ("off", other, off))
            for label, meter, sink in pair if r % 2 == 0 else pair[::-1]:
                worker.Meter = meter  # type: ignore[misc,assignment]
                try:
                    c0 = time.process_time()  # CPU: wall time on a shared machine is mostly others' load
                    _wall, _cpu, res = _run_engine(doc, Path(d) / f"{label}{r}")
                    spent = time.process_time() - c0
                finally:
                    worker.Meter = real  # type: ignore[misc]
                assert res.status == "completed" and res.runs["spin"] == steps, res.status
                sink.append(spent)
    return min(on), min(off)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--against", help="an older engine/usage.py to compare with instead of no meter")
    args = ap.parse_args(argv)
    per = micro()
    print(f"Meter() + stop(): {per * 1e6:.1f} us per task attempt (best of 3 x 20,000)")
    on, off = engine(args.steps, args.rounds, args.against)
    n, other = args.steps, "the older meter" if args.against else "without"
    print(
        f"engine, {n:,} noop steps, CPU: with usage {on / n * 1e3:.4f} ms/step, {other} {off / n * 1e3:.4f} ms/step"
    )
    print(f"per step: {(on - off) / n * 1e3:+.4f} ms  ratio: {on / off:.3f}")


if __name__ == "__main__":
    main()
