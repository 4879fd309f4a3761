"""Python tasks and context size (issue 35, targets 2 and 3).

    python -m benchmarks.bench_python_task [--steps N] [--repeat R] [--cycle 1,1000,2000] [--big 10000]

1. Python-task overhead vs the engine's bare step, in one process: a self-routing cycle of N steps
   whose step is ``tool: {kind: noop}`` with ``set: {ctx.i: "{{ ctx.i + 1 }}"}`` (the bare step),
   next to the same cycle whose step is a python task (``input: {i: "{{ ctx.i }}"}``,
   ``result = {'i': i + 1}``, ``set: {ctx.i: "{{ tick.i }}"}``). Both run in-process on a fresh
   embedded store (load untimed), interleaved; the medians give ms/step, the overhead
   (python - bare) and the ratio python/bare (best of the repeats). Target: overhead <= 0.1 ms.
2. Context size: the same two cycles with a ``--big``-element list put in ``ctx`` by the first step
   and never touched again; ratio per step (big / empty). Target: within 10 % (<= 1.10).
3. The counting cycle (example_project/playbooks/countdown_cycle.yaml: check -> tick -> check,
   a python task per tick, ``ctx.trail`` growing by one item per tick) as a whole process,
   ``noetl-dagster run -q``, for each count in ``--cycle``; ms per iteration past count 1.
4. The identical rhai playbook on both sides, when NoETL's Rust runner (PyPI ``noetl``, see
   bench_noetl_local) is installed: their local runner has no state across steps (it applies
   neither ``set:`` nor an arc's ``set``, and a rhai script sees only ``workload``), so the
   counting cycle can only be written as ONE rhai step looping in the script. Whole processes.
   The ratio ours / theirs for the counting cycle (target <= 0.03) is printed against their
   recorded ~10 s figure (issue 35) since their runner cannot run the cycle itself.

Exits 0; read PASS / MISS.
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
from pathlib import Path
from typing import Any

from benchmarks.bench_engine import _run_engine

OVERHEAD_TARGET_MS = 0.1  # target 2: a python task beyond the bare step
CTX_RATIO_TARGET = 1.10  # target 3: a big untouched ctx value vs an empty ctx
CYCLE_RATIO_TARGET = 0.03  # target 2: ours / NoETL's Rust runner on the counting cycle
THEIR_CYCLE_S = 10.0  # issue 35: "NoETL's Rust runner ~10 s for the same cycle written in rhai"
ROOT = Path(__file__).resolve().parents[1]
COUNTDOWN = ROOT / "example_project" / "playbooks" / "countdown_cycle.yaml"


def cycle_doc(kind: str, n: int, big: int) -> dict[str, Any]:
    start_set: dict[str, Any] = {"ctx.i": 0}
    if big:
        start_set["ctx.big"] = "{{ range(" + str(big) + ") | list }}"
    if kind == "python":
        tick: dict[str, Any] = {
            "step": "tick",
            "tool": {"kind": "python", "input": {"i": "{{ ctx.i }}"}, "code": "result = {'i': i + 1}\n"},
            "set": {"ctx.i": "{{ tick.i }}"},
        }
    else:
        tick = {"step": "tick", "tool": {"kind": "noop"}, "set": {"ctx.i": "{{ ctx.i + 1 }}"}}
    tick["next"] = {"arcs": [{"step": "tick", "when": "{{ ctx.i < workload.n }}"}]}
    return {
        "apiVersion": "noetl.io/v2",
        "kind": "Playbook",
        "metadata": {"name": f"cycle_{kind}", "path": f"benchmarks/cycle_{kind}"},
        "workload": {"n": n},
        "workflow": [
            {
                "step": "start",
                "tool": {"kind": "noop"},
                "set": start_set,
                "next": {"arcs": [{"step": "tick"}]},
            },
            tick,
        ],
    }


def in_process(steps: int, repeat: int, big: int, tmp: Path) -> dict[str, list[float]]:
    """ms/step (wall) of each cycle, interleaved runs."""
    cases = {(k, b): cycle_doc(k, steps, b) for k in ("noop", "python") for b in (0, big)}
    for (k, b), _doc in cases.items():  # warm-up: imports, template and code caches
        _run_engine(cycle_doc(k, 3, b), tmp / f"warm-{k}-{b}")
    out: dict[str, list[float]] = {f"{k}/{b}": [] for k, b in cases}
    for r in range(repeat):
        for (k, b), doc in cases.items():
            wall, _cpu, res = _run_engine(doc, tmp / f"run-{k}-{b}-{r}")
            assert res.status == "completed" and res.runs["tick"] == steps, (res.status, res.runs)
            out[f"{k}/{b}"].append(1000 * wall / (steps + 1))
    return out


def _our_cli() -> list[str]:
    exe = Path(sys.executable).parent / "noetl-dagster"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "noetl_dagster.commands.main"]


CHILD_CPU: list[float] = []  # the CPU (user + system) of each child _timed ran, in order


def _timed(cmd: list[str], cwd: Path, tree: str | None = None) -> tuple[float, str]:
    """Wall time of one command; ``tree``: that checkout first on PYTHONPATH (a --before-tree run)."""
    env = {**os.environ, "PYTHONPATH": tree} if tree else None
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    CHILD_CPU.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
    return wall, "" if p.returncode == 0 else f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-200:]}"


def counting_cycle(counts: list[int], repeat: int, tmp: Path, tree: str | None = None,
                   cpu: dict[int, list[float]] | None = None) -> dict[int, list[float]]:  # fmt: skip
    """Wall seconds per count (``cpu``: filled with the children's CPU seconds); ``tree``: run that
    checkout (PYTHONPATH) instead of this one."""
    text = COUNTDOWN.read_text()
    assert "count: 5" in text
    paths = {}
    for n in counts:
        p = tmp / f"countdown_{n}.yaml"
        p.write_text(text.replace("count: 5", f"count: {n}"))
        paths[n] = p
    tag = "b" if tree else "a"
    _timed(
        [*_our_cli(), "run", str(paths[counts[0]]), "-q", "--data-dir", str(tmp / f"warm-{tag}")], tmp, tree
    )
    out: dict[int, list[float]] = {n: [] for n in counts}
    for r in range(repeat):
        for n in counts:
            wall, err = _timed(
                [*_our_cli(), "run", str(paths[n]), "-q", "--data-dir", str(tmp / f"cc-{tag}-{n}-{r}")],
                tmp,
                tree,
            )
            if err:
                raise RuntimeError(f"countdown_cycle count {n}: {err}")
            out[n].append(wall)
            if cpu is not None:
                cpu.setdefault(n, []).append(CHILD_CPU[-1])
    return out


def cycle_ab(counts: list[int], repeat: int, tmp: Path, before: str) -> None:
    """The counting cycle whole-process, this checkout and ``before`` in turn (one run of each count
    per round), wall and CPU: what each costs at the same moment of load."""
    wall: dict[str, dict[int, list[float]]] = {
        "this": {n: [] for n in counts},
        "before": {n: [] for n in counts},
    }
    cpu: dict[str, dict[int, list[float]]] = {"this": {}, "before": {}}
    for r in range(repeat):
        for side in ("this", "before") if r % 2 == 0 else ("before", "this"):
            got = counting_cycle(
                counts, 1, tmp / f"{side}{r}", before if side == "before" else None, cpu[side]
            )
            for n in counts:
                wall[side][n] += got[n]
    print(f"\n== counting cycle, this checkout vs --before-tree {before}, in turn, {repeat} rounds ==")
    for n in counts:
        for side in ("before", "this"):
            w, c = wall[side][n], cpu[side][n]
            print(f"  count {n:>6,} {side:<6}: wall best {min(w):7.3f} s median {statistics.median(w):7.3f} s"
                  f"   CPU best {min(c):7.3f} s median {statistics.median(c):7.3f} s")  # fmt: skip
        ratio = statistics.median(cpu["this"][n]) / statistics.median(cpu["before"][n])
        print(f"  count {n:>6,} this / before: CPU {ratio:.3f}x (medians), wall {min(wall['this'][n]) / min(wall['before'][n]):.3f}x (best)")  # fmt: skip
    if len(counts) > 1:
        a, b = counts[0], counts[-1]
        for side in ("before", "this"):
            per = 1000 * (statistics.median(cpu[side][b]) - statistics.median(cpu[side][a])) / (b - a)
            print(f"  {side:<6} CPU per iteration past count {a}: {per:.3f} ms")


RHAI_SCRIPT = """let n = {n};
let trail = [];
while n > 0 {{ n -= 1; trail.push(n); }}
#{{counted: trail.len()}}
"""


def rhai_doc(n: int) -> str:
    import yaml

    doc = {
        "apiVersion": "noetl.io/v2",
        "kind": "Playbook",
        "metadata": {"name": "rhai_count", "path": "benchmarks/rhai_count"},
        "workload": {"count": n},
        "workflow": [{"step": "start", "tool": {"kind": "rhai", "max_operations": 100_000_000,
                                                "code": RHAI_SCRIPT.format(n=n)}}],
    }  # fmt: skip
    return yaml.safe_dump(doc, sort_keys=False)


RHAI_CYCLE = """apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: rhai_cycle, path: benchmarks/rhai_cycle}
workload: {count: COUNT}
workflow:
  - step: start
    tool: {kind: noop}
    set: {ctx.n: "{{ workload.count }}", ctx.trail: []}
    next: {arcs: [{step: tick}]}
  - step: tick
    tool: {kind: rhai, args: {n: "{{ ctx.n }}"}, code: "#{n: n - 1}"}
    set: {ctx.n: "{{ tick.n }}", ctx.trail: "{{ ctx.trail + [tick.n] }}"}
    next: {arcs: [{step: tick, when: "{{ ctx.n > 0 }}"}]}
"""


def rhai_cycle(n: int, repeat: int, tmp: Path) -> list[float]:
    """The counting cycle with a rhai step per iteration, ours only (their runner keeps no state)."""
    path = tmp / "rhai_cycle.yaml"
    path.write_text(RHAI_CYCLE.replace("COUNT", str(n)))
    out = []
    for r in range(repeat):
        wall, err = _timed([*_our_cli(), "run", str(path), "-q", "--data-dir", str(tmp / f"rc-{r}")], tmp)
        if err:
            raise RuntimeError(f"rhai cycle: {err}")
        out.append(wall)
    return out


def rhai_compare(n: int, repeat: int, tmp: Path) -> tuple[list[float], list[float]] | str:
    from benchmarks.differential import NOETL_VENV

    exe = NOETL_VENV / "bin" / "noetl"
    if not exe.exists():
        return f"NoETL's runner is not installed at {exe} (bench_noetl_local installs it)"
    path = tmp / "rhai_count.yaml"
    path.write_text(rhai_doc(n))
    theirs, ours = [], []
    for r in range(repeat):
        wall, err = _timed([str(exe), "run", str(path), "-r", "local", "-v"], tmp)
        if err:
            return f"their runner failed: {err}"
        theirs.append(wall)
        wall, err = _timed([*_our_cli(), "run", str(path), "-q", "--data-dir", str(tmp / f"rh-{r}")], tmp)
        if err:
            return f"our run failed: {err}"
        ours.append(wall)
    return theirs, ours


def _v(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000, help="steps of the in-process cycles")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--big", type=int, default=10_000, help="items of the untouched ctx list")
    ap.add_argument(
        "--cycle", default="1,1000,2000", help="counts of the whole-process counting cycle ('' skips)"
    )
    ap.add_argument("--rhai", type=int, default=1000, help="iterations of the rhai comparison (0 skips)")
    ap.add_argument(
        "--before-tree", help="another checkout: only the counting cycle, both in turn (wall, CPU)"
    )
    args = ap.parse_args(argv)
    if args.before_tree:
        counts = [int(x) for x in args.cycle.split(",") if x.strip()]
        with tempfile.TemporaryDirectory(prefix="bench-python-task-") as d:
            for sub in range(args.repeat):
                for side in ("this", "before"):
                    (Path(d) / f"{side}{sub}").mkdir()
            print(f"load average {os.getloadavg()[0]:.2f}")
            cycle_ab(counts, args.repeat, Path(d), args.before_tree)
            print(f"load average {os.getloadavg()[0]:.2f}")
        return 0
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    with tempfile.TemporaryDirectory(prefix="bench-python-task-") as d:
        tmp = Path(d)
        ms = in_process(args.steps, args.repeat, args.big, tmp)
        # best of the repeats: on a shared machine load only ever adds time, so the minimum is the
        # steadiest estimate of each case (medians printed beside it)
        med = {k: min(v) for k, v in ms.items()}
        bare, py = med["noop/0"], med["python/0"]
        print(
            f"\n== python task vs bare step: self-routing cycle, {args.steps:,} steps, best of {args.repeat} =="
        )
        for k, v in ms.items():
            print(f"  {k:<16} best {med[k]:.4f} ms/step   median {statistics.median(v):.4f}")
        over = py - bare
        # paired per repeat (same moment of load): the overhead's spread
        pairs = [p - b for p, b in zip(ms["python/0"], ms["noop/0"], strict=True)]
        print(f"  python / bare     : {py / bare:.3f}x   overhead {over:.4f} ms/step "
              f"(paired per repeat: median {statistics.median(pairs):.4f}, min {min(pairs):.4f})")  # fmt: skip
        print(f"  target overhead <= {OVERHEAD_TARGET_MS} ms: {_v(over <= OVERHEAD_TARGET_MS)}")
        print(f"\n== context size: a {args.big:,}-item list in ctx that no step touches ==")
        ratios = {}
        for k in ("noop", "python"):
            ratios[k] = med[f"{k}/{args.big}"] / med[f"{k}/0"]
            print(f"  {k:<8} big / empty: {ratios[k]:.3f}x")
        worst = max(ratios.values())
        print(f"  target within 10 % (<= {CTX_RATIO_TARGET}): {_v(worst <= CTX_RATIO_TARGET)}")
        counts = [int(x) for x in args.cycle.split(",") if x.strip()]
        if counts:
            cc = counting_cycle(counts, max(1, args.repeat // 2), tmp)
            print("\n== counting cycle (countdown_cycle.yaml), whole process `noetl-dagster run -q` ==")
            base = min(cc[counts[0]])
            for n in counts:
                per = 1000 * (min(cc[n]) - base) / max(1, n - counts[0])
                print(f"  count {n:>6,}: best {min(cc[n]):7.3f} s   median {statistics.median(cc[n]):7.3f} s"
                      + (f"   {per:.3f} ms/iteration past count {counts[0]}" if n != counts[0] else ""))  # fmt: skip
            if 1000 in cc:
                r = min(cc[1000]) / THEIR_CYCLE_S
                print(f"  count 1,000 vs NoETL's Rust runner's recorded ~{THEIR_CYCLE_S:g} s (not re-measurable: "
                      f"their runner keeps no state across steps): {r:.3f}   target <= {CYCLE_RATIO_TARGET}: "
                      f"{_v(r <= CYCLE_RATIO_TARGET)}")  # fmt: skip
        if args.rhai:
            rc = rhai_cycle(args.rhai, max(1, args.repeat // 2), tmp)
            r = min(rc) / THEIR_CYCLE_S
            print(
                f"\n== counting cycle with a rhai step per iteration ({args.rhai:,}), ours, whole process =="
            )
            print(f"  best {min(rc):.3f} s   median {statistics.median(rc):.3f} s   vs their recorded ~{THEIR_CYCLE_S:g} s: "
                  f"{r:.3f}   target <= {CYCLE_RATIO_TARGET}: {_v(r <= CYCLE_RATIO_TARGET)}")  # fmt: skip
            got = rhai_compare(args.rhai, max(1, args.repeat // 2), tmp)
            print(
                f"\n== identical rhai playbook (one step, a {args.rhai:,}-iteration while loop), whole process =="
            )
            if isinstance(got, str):
                print(f"  skipped: {got}")
            else:
                theirs, ours = got
                print(f"  theirs `noetl run -r local`: best {min(theirs):.3f} s   ours `noetl-dagster run -q`: "
                      f"best {min(ours):.3f} s   ours / theirs {min(ours) / min(theirs):.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
