"""The OS sandbox's cost per task (issue 41 part 1a, tools/sandbox.py).

    python -m benchmarks.bench_sandbox [--tasks N] [--repeat R]

1. A python task unsandboxed in the engine's process, unsandboxed in a child process per task
   (``spec: {isolation: process}``) and sandboxed (``executor.spec.isolation: sandbox``: bubblewrap,
   own uid, no network, seccomp, rlimits; python tasks then go to the execution's sandbox worker,
   tools/sandbox_worker.py), each a playbook of N such tasks in a chain, run in this process on a
   fresh embedded store, interleaved; the median ms per task, overheads and ratios.
2. The bare launcher (the cost a shell/script task pays per command): ``/bin/true`` started
   directly vs confined (sh + bwrap + setpriv when root + prlimit); median ms per process, ratio.

Exits 0 (figures only; no target was set for this overhead).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any


def chain(n: int, mode: str) -> dict[str, Any]:
    """N python tasks, one per step, start -> s1 -> ... -> s<N-1>; ``mode``: inline (in the engine's
    process), process (``spec.isolation: process``) or sandbox (``executor.spec.isolation: sandbox``)."""
    spec = {"spec": {"isolation": "process"}} if mode == "process" else {}
    names = ["start", *(f"s{i}" for i in range(1, n))]
    steps: list[dict[str, Any]] = []
    for i, name in enumerate(names):
        step: dict[str, Any] = {"step": name, "tool": {"kind": "python", "code": f"result = {i}", **spec}}
        if i + 1 < n:
            step["next"] = {"arcs": [{"step": names[i + 1]}]}
        steps.append(step)
    doc: dict[str, Any] = {"apiVersion": "noetl.io/v2", "kind": "Playbook",
                           "metadata": {"name": "bench_sandbox", "path": "bench/sandbox"}, "workflow": steps}  # fmt: skip
    if mode == "sandbox":
        doc["executor"] = {"spec": {"isolation": "sandbox"}}
    return doc


def run_once(doc: dict[str, Any]) -> float:
    from noetl_dagster.dsl import load_playbook_dict
    from noetl_dagster.runners.local import run_playbook

    pb = load_playbook_dict(doc)
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as tmp:
        t0 = time.perf_counter()
        res = run_playbook(pb, None, event_store=f"sqlite:///{tmp}/e.db", data_dir=Path(tmp) / "home")
        dt = time.perf_counter() - t0
    if res.status != "completed":
        raise SystemExit(f"bench_sandbox: the playbook ended {res.status}: {res.results}")
    return dt


def launcher(repeat: int) -> tuple[float, float]:
    from noetl_dagster.tools import sandbox

    plain: list[float] = []
    boxed: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as tmp:
        box = sandbox.confine(["/bin/true"], scratch=sandbox.scratch_dir(tmp, "bench"), execution_id="bench")
        for _ in range(repeat):
            for argv, env, out in ((["/bin/true"], None, plain), (box.argv, box.env, boxed)):
                t0 = time.perf_counter()
                subprocess.run(argv, env=env, check=True)
                out.append(time.perf_counter() - t0)
    return statistics.median(plain) * 1000, statistics.median(boxed) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from noetl_dagster.tools import sandbox

    if not sandbox.available():
        print(
            f"bench_sandbox: the sandbox is unavailable here ({sandbox.unavailable_reason()}); nothing measured"
        )
        return
    n = args.tasks
    run_once(chain(2, "sandbox"))  # warm: imports, the availability probe
    modes = ("inline", "process", "sandbox")
    per: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.repeat):
        for m in modes:  # interleaved: a load change hits every mode alike
            per[m].append(run_once(chain(n, m)) / n)
    ms = {m: statistics.median(v) * 1000 for m, v in per.items()}
    print(f"python task, {n} tasks x {args.repeat} (median ms/task, the whole execution over its tasks):")
    print(f"  unsandboxed, in the engine's process     {ms['inline']:8.1f} ms")
    print(f"  unsandboxed, a child process per task     {ms['process']:8.1f} ms  (spec.isolation: process)")
    print(f"  sandboxed (executor.spec.isolation)       {ms['sandbox']:8.1f} ms")
    print(f"  sandboxed vs in-process: {ms['sandbox'] - ms['inline']:+.1f} ms/task, ratio {ms['sandbox'] / ms['inline']:.1f}x; "
          f"vs a child process per task: {ms['sandbox'] - ms['process']:+.1f} ms/task, ratio {ms['sandbox'] / ms['process']:.2f}x")  # fmt: skip
    lp, lb = launcher(max(5, args.repeat * 5))
    print(f"bare launcher, /bin/true: direct {lp:.1f} ms, confined {lb:.1f} ms "
          f"(overhead {lb - lp:+.1f} ms, ratio {lb / lp:.1f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
