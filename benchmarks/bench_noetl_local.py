"""Engine vs NoETL's own local runner (issue 19.1: "ratio vs NoETL's local runner <= 0.03").

    python -m benchmarks.bench_noetl_local [--steps N] [--repeat R]

NoETL's local runner is PyPI ``noetl==5.3.2``, a Rust CLI (``noetl run FILE -r local -v``) in its own
venv /work/noetl-venv, created by ``benchmarks.differential.noetl_binary()`` when missing. It executes
only the tools shell, http, playbook, duckdb, auth, sink, provider and agent (any other kind prints
"Tool not supported in local execution mode" and moves on) and does not apply an arc's ``set:``, so a
counting cycle never ends there. The comparable workload is therefore a linear chain of N steps
(start -> s1 -> ... -> s{N-1}), generated into a temp dir and run by both sides from the same YAML:

(a) shell chain: every step ``tool: {kind: shell, cmds: ["true"]}`` - the same work on both sides
    (one shell process per step);
(b) noop chain: every step ``tool: {kind: noop}`` - their runner SKIPS the tool ("not supported"),
    so their figure is the runner's bare per-step overhead, ours runs the noop tool.

Each case is timed as a whole process (wall, and the child's user+sys CPU from
``getrusage(RUSAGE_CHILDREN)`` deltas): theirs, ``noetl-dagster run FILE`` as a user types it, and
``noetl-dagster run -q`` (no progress lines). The runs of the sides are interleaved (A B C A B C ...)
because the machine is shared. Ours is also timed in-process (``load_playbook`` then
``runners.local.run_playbook`` on a fresh embedded store, ``bench_engine._run_engine``) so the table
separates interpreter start-up and console output from the engine's own cost.

A run counts only if it completed: theirs exits 0 and printed N ``🔹 Step:`` lines, ours exits 0
(in-process: status completed with N step runs); otherwise the row is an error, never a figure.
The verdict compares the best whole-process wall times, ours/theirs, with 0.03. Exits 0; read
PASS / MISS. If NoETL's venv cannot be created (no network) it prints a skip line and exits 0.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.bench_engine import _run_engine
from benchmarks.differential import STEP_RE, UNSUPPORTED, noetl_binary

TARGET_RATIO = 0.03  # issue 19.1: ours / theirs


def chain_doc(n: int, kind: str) -> dict[str, Any]:
    """A linear chain of n steps, start -> s1 -> ... -> s{n-1}, each running ``kind`` (shell or noop)."""
    tool: dict[str, Any] = {"kind": "shell", "cmds": ["true"]} if kind == "shell" else {"kind": "noop"}
    names = ["start", *(f"s{i}" for i in range(1, n))]
    steps: list[dict[str, Any]] = []
    for i, name in enumerate(names):
        step: dict[str, Any] = {"step": name, "tool": dict(tool)}
        if i + 1 < n:
            step["next"] = {"arcs": [{"step": names[i + 1]}]}
        steps.append(step)
    return {
        "apiVersion": "noetl.io/v2",
        "kind": "Playbook",
        "metadata": {"name": f"chain_{kind}", "path": f"benchmarks/chain_{kind}"},
        "workflow": steps,
    }


@dataclass
class Series:
    """One row: the timings of one runner on one case, or the first error it hit."""

    label: str
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    error: str = ""

    def add(self, wall: float, cpu: float, error: str = "") -> None:
        if error:
            self.error = self.error or error
        else:
            self.walls.append(wall)
            self.cpus.append(cpu)

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.walls)

    def best(self) -> float:
        return min(self.walls)

    def median(self) -> float:
        return statistics.median(self.walls)


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _timed(
    cmd: list[str], cwd: Path, timeout: float
) -> tuple[float, float, subprocess.CompletedProcess | None]:
    """Run cmd to completion: (wall s, child cpu s, the process, or None on timeout)."""
    c0, w0 = _children_cpu(), time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - w0, 0.0, None
    return time.perf_counter() - w0, _children_cpu() - c0, p


def _tail(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:160] if lines else ""


def run_theirs(exe: Path, path: Path, n: int, timeout: float) -> tuple[float, float, str, int]:
    """(wall, cpu, error or "", steps whose tool they skipped)."""
    wall, cpu, p = _timed([str(exe), "run", str(path), "-r", "local", "-v"], path.parent, timeout)
    if p is None:
        return wall, cpu, f"timeout after {timeout:.0f} s", 0
    out = p.stdout + p.stderr
    steps = len(STEP_RE.findall(out))
    if p.returncode != 0:
        return wall, cpu, f"exit {p.returncode}: {_tail(out)}", 0
    if steps != n:
        return wall, cpu, f"ran {steps} of {n} steps", 0
    return wall, cpu, "", out.count(UNSUPPORTED)


def our_cli() -> list[str]:
    exe = Path(sys.executable).parent / "noetl-dagster"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "noetl_dagster.commands.main"]


def run_ours(path: Path, data_dir: Path, quiet: bool, timeout: float) -> tuple[float, float, str]:
    cmd = [*our_cli(), "run", str(path), "--data-dir", str(data_dir), *(["-q"] if quiet else [])]
    wall, cpu, p = _timed(cmd, path.parent, timeout)
    if p is None:
        return wall, cpu, f"timeout after {timeout:.0f} s"
    if p.returncode != 0:
        return wall, cpu, f"exit {p.returncode}: {_tail(p.stderr or p.stdout)}"
    return wall, cpu, ""


def run_inprocess(doc: dict[str, Any], tmp: Path, n: int) -> tuple[float, float, str]:
    """Our engine in this process: run_playbook on a fresh embedded store (load untimed); cpu counts
    this process and the shells it spawned."""
    c0 = _children_cpu()
    wall, cpu, result = _run_engine(doc, tmp)
    cpu += _children_cpu() - c0
    if result.status != "completed" or sum(result.runs.values()) != n:
        return wall, cpu, f"status {result.status}, {sum(result.runs.values())} of {n} step runs"
    return wall, cpu, ""


def bench_case(kind: str, n: int, repeat: int, exe: Path, work: Path) -> list[Series]:
    import yaml

    doc = chain_doc(n, kind)
    case_dir = work / kind
    case_dir.mkdir()
    path = case_dir / f"chain_{kind}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    timeout = 120 + 0.2 * n
    skip_note = " (tool SKIPPED: bare step overhead)" if kind == "noop" else ""
    theirs = Series(f"theirs: noetl run -r local{skip_note}")
    ours = Series("ours: noetl-dagster run")
    quiet = Series("ours: noetl-dagster run -q")
    engine = Series("ours: engine in-process")
    # warm-ups, untimed: page cache for both binaries, imports and template cache in-process
    run_theirs(exe, path, n, timeout)
    run_ours(path, work / f"warm-{kind}", True, timeout)
    _run_engine(chain_doc(3, kind), work / f"warm-engine-{kind}")
    skipped = 0
    for r in range(repeat):  # interleaved: a burst of load hits every side alike
        wall, cpu, err, skipped = run_theirs(exe, path, n, timeout)
        theirs.add(wall, cpu, err)
        ours.add(*run_ours(path, work / f"data-{kind}-{r}", False, timeout))
        quiet.add(*run_ours(path, work / f"data-{kind}-{r}-q", True, timeout))
        engine.add(*run_inprocess(doc, work / f"engine-{kind}-{r}", n))
    if kind == "noop" and theirs.ok and skipped != n:
        theirs.label = f"theirs: noetl run -r local (tool skipped in {skipped} of {n} steps)"
    return [theirs, ours, quiet, engine]


def report(kind: str, n: int, rows: list[Series]) -> bool | None:
    """Print one case's table; the verdict (ours/theirs whole process, best wall) or None on an error."""
    title = {
        "shell": 'shell chain: tool {kind: shell, cmds: ["true"]} - same work on both sides',
        "noop": "noop chain: tool {kind: noop} - THEIR runner skips the tool (not supported locally)",
    }[kind]
    print(f"\n== {title}, {n:,} steps ==")
    print(f"  {'runner':<62} {'best s':>8} {'median s':>9} {'cpu s':>7} {'ms/step':>8} {'ours/theirs':>12}")
    theirs = rows[0]
    for row in rows:
        if not row.ok:
            print(f"  {row.label:<62} ERROR: {row.error}")
            continue
        ratio = ""
        if row is not theirs and theirs.ok:
            ratio = f"{row.best() / theirs.best():.2f} / {row.median() / theirs.median():.2f}"
        print(f"  {row.label:<62} {row.best():8.3f} {row.median():9.3f} {statistics.median(row.cpus):7.3f} "
              f"{1000 * row.best() / n:8.3f} {ratio:>12}")  # fmt: skip
    print("  (best / median of the repeats; cpu s = median user+sys of the process; ms/step = best / steps;"
          " ratio = best/best and median/median)")  # fmt: skip
    if not (theirs.ok and rows[1].ok):
        return None
    return rows[1].best() / theirs.best() <= TARGET_RATIO


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000, help="steps in each chain (default 1000)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per runner and case (default 3)")
    ap.add_argument("--only", choices=("shell", "noop"), help="run one case")
    args = ap.parse_args(argv)
    if args.steps < 2 or args.repeat < 1:
        ap.error("--steps must be >= 2 and --repeat >= 1")
    try:
        exe = noetl_binary()
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"SKIP bench_noetl_local: NoETL's local runner (noetl==5.3.2 in /work/noetl-venv) is not "
              f"available and could not be installed ({e}); no figures")  # fmt: skip
        return 0
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"theirs: {exe}; ours: {' '.join(our_cli())}; {args.repeat} interleaved repeats")  # fmt: skip
    verdicts: dict[str, bool | None] = {}
    with tempfile.TemporaryDirectory(prefix="bench-noetl-local-") as tmp:
        for kind in ("shell", "noop"):
            if args.only in (None, kind):
                verdicts[kind] = report(
                    kind, args.steps, bench_case(kind, args.steps, args.repeat, exe, Path(tmp))
                )
    load = os.getloadavg()
    print(f"\nload average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for kind, ok in verdicts.items():
        verdict = "ERROR (no figure)" if ok is None else ("PASS" if ok else "MISS")
        print(
            f"target (issue 19.1) ours/theirs <= {TARGET_RATIO:g}, {kind} chain, whole process, best wall: {verdict}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
