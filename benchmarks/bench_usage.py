"""Overhead of measured usage (issue 18.1): the engine with and without its usage meter.

1. Micro: one ``Meter()`` + ``stop()`` (what every task attempt pays), best of 3 x 20,000.
2. Engine: the self-routing ``noop`` cycle of bench_engine (N steps, embedded SQLite log),
   once with the real meter and once with a meter that measures nothing, alternating,
   best of R rounds each. Overhead per step = (with - without) / N; ratio = with / without.

    .venv/bin/python -m benchmarks.bench_usage [--steps N] [--rounds R]
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


def engine(steps: int, rounds: int) -> tuple[float, float]:
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
    on, off = [], []
    with tempfile.TemporaryDirectory() as d:
        _run_engine({**doc, "workload": {"n": 3}}, Path(d) / "warm")
        for r in range(rounds):
            for label, meter, sink in (("on", real, on), ("off", _NullMeter, off)):
                worker.Meter = meter  # type: ignore[misc,assignment]
                try:
                    wall, _cpu, res = _run_engine(doc, Path(d) / f"{label}{r}")
                finally:
                    worker.Meter = real  # type: ignore[misc]
                assert res.status == "completed" and res.runs["spin"] == steps, res.status
                sink.append(wall)
    return min(on), min(off)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    per = micro()
    print(f"Meter() + stop(): {per * 1e6:.1f} us per task attempt (best of 3 x 20,000)")
    on, off = engine(args.steps, args.rounds)
    n = args.steps
    print(
        f"engine, {n:,} noop steps: with usage {on / n * 1e3:.4f} ms/step, without {off / n * 1e3:.4f} ms/step"
    )
    print(f"usage overhead per step: {(on - off) / n * 1e3:+.4f} ms  ratio with/without: {on / off:.3f}")


if __name__ == "__main__":
    main()
