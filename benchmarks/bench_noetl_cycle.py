"""The counting cycle against NoETL's own runner, both timed in the same run (issue 46 target 1).

    python -m benchmarks.bench_noetl_cycle [--count N] [--repeat R]

NoETL's runner is PyPI ``noetl==5.3.2`` (a Rust CLI, ``noetl run FILE -r local -v``, installed into
/work/noetl-venv by ``benchmarks.differential.noetl_binary()``). It refuses our standard cycle
(``example_project/playbooks/countdown_cycle.yaml``: a step's ``tool:`` as a list of named tasks is
"workflow[2].tool[0]: invalid type: map") and has no ``set:`` (an unknown key, ignored), so a
counter kept with ``set`` never changes there and ``{{ ctx.n > 0 }}`` (its condition evaluator
knows ``==``, ``!=``, ``in`` and truthiness, not ``>``) is always true: that cycle never ends.
The same cycle in the form it does execute - its step-level ``vars:`` (a step's result, by JSON
path, into ``vars.*``, which templates and arc conditions read), a rhai task that decrements, and
an ``==`` arc - is ``theirs_doc``: start -> check -> (tick -> check) x N -> liftoff, a check step
(``kind: noop``: their runner skips the tool, "not supported in local execution mode", and routes)
and a tick step per iteration. Ours runs the same graph in our form (``ours_doc``: ``set: ctx.n``,
the same rhai tick) and, as a second row, the standard ``countdown_cycle.yaml`` (python ticks
marked ``pure``).

Every run is verified, never just timed: theirs exits 0, prints "completed successfully" and exactly
N ``🔹 Step: tick`` lines (N+1 checks); ours exits 0 with ``--json`` status completed, ``runs.tick ==
N`` and the counter at 0. The sides run interleaved (theirs, ours rhai, ours standard, theirs, ...);
each run's wall time and its process's user+sys CPU (``getrusage(RUSAGE_CHILDREN)`` deltas). Ratios:
ours / theirs of the medians, target <= 0.03.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.differential import noetl_binary

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.03
THEIRS = """apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: countdown_cycle_vars, path: benchmarks/countdown_cycle_vars}
workload: {count: COUNT}
workflow:
  - step: start
    tool: {kind: rhai, code: "#{n: parse_int(workload.count)}"}
    vars: {n: "{{ result.n }}"}
    next: {arcs: [{step: check}]}
  - step: check
    tool: {kind: noop}
    next: {arcs: [{step: liftoff, when: "{{ vars.n == 0 }}"}, {step: tick}]}
  - step: tick
    tool: {kind: rhai, code: "#{n: parse_int(vars.n) - 1}"}
    vars: {n: "{{ result.n }}"}
    next: {arcs: [{step: check}]}
  - step: liftoff
    tool: {kind: rhai, code: "#{counted: parse_int(workload.count) - parse_int(vars.n)}"}
"""
OURS = """apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: countdown_cycle_rhai, path: benchmarks/countdown_cycle_rhai}
workload: {count: COUNT}
workflow:
  - step: start
    tool: {kind: noop}
    set: {ctx.n: "{{ workload.count }}"}
    next: {arcs: [{step: check}]}
  - step: check
    tool: {kind: noop}
    next: {arcs: [{step: tick, when: "{{ ctx.n > 0 }}"}, {step: liftoff}]}
  - step: tick
    tool: {kind: rhai, args: {n: "{{ ctx.n }}"}, code: "#{n: n - 1}"}
    set: {ctx.n: "{{ tick.n }}"}
    next: {arcs: [{step: check}]}
  - step: liftoff
    tool: {kind: rhai, args: {n: "{{ ctx.n }}", count: "{{ workload.count }}"}, code: "#{counted: count - n}"}
"""


def theirs_doc(n: int) -> str:
    return THEIRS.replace("COUNT", str(n))


def ours_doc(n: int) -> str:
    return OURS.replace("COUNT", str(n))


def standard_doc(n: int) -> str:
    text = (ROOT / "example_project" / "playbooks" / "countdown_cycle.yaml").read_text()
    return text.replace("count: 5", f"count: {n}")


def _timed(
    cmd: list[str], cwd: Path, env: dict[str, str] | None = None
) -> tuple[float, float, subprocess.CompletedProcess]:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=1800, env=env)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, p


def run_theirs(path: Path, n: int) -> tuple[float, float]:
    wall, cpu, p = _timed([str(noetl_binary()), "run", str(path), "-r", "local", "-v"], path.parent)
    out = p.stdout + p.stderr
    ticks, checks = out.count("🔹 Step: tick\n"), out.count("🔹 Step: check\n")
    if p.returncode != 0 or "completed successfully" not in out or ticks != n or checks != n + 1:
        raise RuntimeError(f"their run did not count to {n}: exit {p.returncode}, {ticks} ticks, {checks} checks; "
                           f"{out.strip()[-300:]}")  # fmt: skip
    return wall, cpu


def run_ours(path: Path, n: int, data_dir: Path) -> tuple[float, float]:
    paths = os.pathsep.join(str(ROOT / p) for p in ("", "analytics", "lineage", "registry_service"))
    env = {**os.environ, "PYTHONPATH": paths}
    env.pop("NOETL_EVENT_STORE_URL", None)
    cmd = [sys.executable, "-m", "noetl_dagster.commands.main", "run", str(path), "-q", "--json", "--data-dir",
           str(data_dir)]  # fmt: skip
    wall, cpu, p = _timed(cmd, path.parent, env)
    try:
        out = json.loads(p.stdout)
    except ValueError:
        out = {}
    runs = out.get("runs") or {}
    if (
        p.returncode != 0
        or out.get("status") != "completed"
        or runs.get("tick") != n
        or (out.get("ctx") or {}).get("n") != 0
    ):
        raise RuntimeError(f"our run did not count to {n}: exit {p.returncode}, runs {runs}; "
                           f"{(p.stderr or p.stdout).strip()[-300:]}")  # fmt: skip
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    n = args.count
    try:
        noetl_binary()
    except (OSError, subprocess.CalledProcessError) as e:  # no network to install it: nothing to compare
        print(f"skip: NoETL's runner could not be installed ({e})")
        return 0
    rows: dict[str, tuple[list[float], list[float]]] = {
        "theirs: noetl run -r local (vars form)": ([], []),
        "ours: run -q (same graph, rhai tick)": ([], []),
        "ours: run -q (countdown_cycle.yaml)": ([], []),
    }
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "theirs.yaml").write_text(theirs_doc(n))
        (tmp / "ours.yaml").write_text(ours_doc(n))
        (tmp / "standard.yaml").write_text(standard_doc(n))
        for r in range(args.repeat):
            for label, (walls, cpus) in rows.items():
                if label.startswith("theirs"):
                    wall, cpu = run_theirs(tmp / "theirs.yaml", n)
                elif "rhai" in label:
                    wall, cpu = run_ours(tmp / "ours.yaml", n, tmp / f"o{r}")
                else:
                    wall, cpu = run_ours(tmp / "standard.yaml", n, tmp / f"s{r}")
                walls.append(wall)
                cpus.append(cpu)
                print(f"  round {r + 1}: {label:<42} wall {wall:8.3f} s  cpu {cpu:7.3f} s", flush=True)
    print(f"counting cycle, count {n}, {args.repeat} interleaved rounds, every run verified ({n} ticks):")
    med = {k: (statistics.median(w), statistics.median(c)) for k, (w, c) in rows.items()}
    theirs_wall, theirs_cpu = next(iter(med.values()))
    for label, (wall, cpu) in med.items():
        ratio = "" if label.startswith("theirs") else (
            f"  ours/theirs wall {wall / theirs_wall:.3f} {'PASS' if wall / theirs_wall <= TARGET else 'MISS'}"
            f" (<= {TARGET}), cpu {cpu / theirs_cpu:.2f}")  # fmt: skip
        print(f"  {label:<42} median wall {wall:8.3f} s  cpu {cpu:7.3f} s{ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
