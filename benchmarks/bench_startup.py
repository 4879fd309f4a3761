"""Command-line start-up (issue 35): ``--help``, ``--version``, ``validate`` and a one-step ``run``.

    python -m benchmarks.bench_startup [--repeat N] [--compare ROOT|REV] [--top K]

Each command is timed as a whole process, as a user types it (the venv's ``noetl-dagster`` script,
``PYTHONPATH`` set to the checkout measured so it wins over the installed copy), against two
baselines timed in the same run: ``python -c pass`` (the interpreter and ``site``) and
``python -c "import click"`` (the one library every command needs). With ``hyperfine`` on PATH
each command is timed by it (``--warmup 2 --runs N``); without, the commands run interleaved
(A B C A B C ...: the machine is shared, so a burst of load hits every row alike) and the median
and minimum of N are reported. ``--compare ROOT`` adds the same commands from a second checkout
interleaved with this one: before and after in one run. Given a git revision instead of a
directory (``--compare 771630d``), that commit's tree is extracted (``git archive``) to a
temporary directory and measured.

Byte-code: the measured processes may write ``__pycache__`` (``PYTHONDONTWRITEBYTECODE`` is
removed from their environment) and one warm-up run precedes the timing, so a figure is an
installed tool's start, not the compiler's.

Then ``-X importtime`` of each noetl-dagster command: the ``--top`` modules by cumulative time
among those a command imports directly at the top level, and the self time summed per top-level
package. Targets: ``--help`` <= 0.08 s, one-step ``run`` <= 0.15 s (wall, median). Exits 0; read
PASS / MISS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"--help": 0.08, "run": 0.15}

ONE_STEP = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: one_step, path: bench/one_step}
workload: {n: 2}
workflow:
  - step: start
    tool: {kind: noop, result: "{{ workload.n * 2 }}"}
"""


def cli_prefix() -> list[str]:
    """How a user starts the command: the venv's console script, else the same two lines via -c."""
    script = Path(sys.executable).with_name("noetl-dagster")
    if script.is_file():
        return [sys.executable, str(script)]
    return [
        sys.executable,
        "-c",
        "import sys; from noetl_dagster.commands.main import main; sys.exit(main())",
    ]


def commands(playbook: Path) -> dict[str, list[str]]:
    cli = cli_prefix()
    return {
        "--help": [*cli, "--help"],
        "--version": [*cli, "--version"],
        "validate": [*cli, "validate", str(playbook)],
        "run": [*cli, "run", str(playbook)],  # the parse cache warm (the warm-up run fills it)
        "run-nocache": [*cli, "run", str(playbook)],  # NOETL_DAGSTER_PLAYBOOK_CACHE=off: parsed every time
    }


def case_env(name: str, env: dict[str, str]) -> dict[str, str]:
    return {**env, "NOETL_DAGSTER_PLAYBOOK_CACHE": "off"} if name == "run-nocache" else env


def environ(root: Path, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(root), NOETL_DAGSTER_HOME=str(home), COLUMNS="100",
               NOETL_DAGSTER_PLAYBOOK_CACHE=str(home / "playbook-cache"))  # fmt: skip
    return env


# user+sys CPU of each timed child: steadier than wall on a machine other work is loading
CPU: dict[str, list[float]] = defaultdict(list)


def _once(argv: list[str], env: dict[str, str], name: str | None = None) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    took = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if name is not None:
        CPU[name].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[1:])} exited {r.returncode}: {r.stderr.decode()[-500:]}")
    return took


def time_all(cases: dict[str, tuple[list[str], dict[str, str]]], repeat: int) -> dict[str, list[float]]:
    """Seconds per run of each case: hyperfine's when it is on PATH, else an interleaved loop."""
    hf = shutil.which("hyperfine")
    if hf:
        out: dict[str, list[float]] = {}
        with tempfile.TemporaryDirectory() as d:
            for name, (argv, env) in cases.items():
                export = Path(d) / "hf.json"
                cmd = [hf, "-N", "--warmup", "2", "--runs", str(repeat), "--export-json", str(export), "--",
                       subprocess.list2cmdline(argv)]  # fmt: skip
                subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
                out[name] = json.loads(export.read_text())["results"][0]["times"]
        return out
    for argv, env in cases.values():  # warm-up: byte-code written, files in the page cache
        _once(argv, env)
    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeat):
        for name, (argv, env) in cases.items():
            times[name].append(_once(argv, env, name))
    return times


def importtime(argv: list[str], env: dict[str, str]) -> list[tuple[str, int, int, int]]:
    """(module, self us, cumulative us, depth) of each import ``-X importtime`` reports."""
    r = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=env, capture_output=True, text=True)
    rows = []
    for line in r.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        first, cum_us, name = line.split("|", 2)
        depth = (len(name) - len(name.lstrip(" ")) - 1) // 2  # two spaces per level below the top
        rows.append((name.strip(), int(first.split(":")[1]), int(cum_us), depth))
    return rows


def report_imports(label: str, rows: list[tuple[str, int, int, int]], top: int) -> None:
    total = sum(r[1] for r in rows)
    print(f"\n{label}: {len(rows)} modules imported, {total / 1000:.0f} ms of import time (-X importtime)")
    firsts = sorted((r for r in rows if r[3] == 0), key=lambda r: -r[2])[:top]
    print("  imported at the top level, by cumulative time:")
    for name, _, cum, _ in firsts:
        print(f"    {cum / 1000:7.1f} ms  {name}")
    per_pkg: dict[str, int] = defaultdict(int)
    for name, self_us, _, _ in rows:
        per_pkg[name.split(".")[0]] += self_us
    print("  self time per top-level package:")
    for pkg, us in sorted(per_pkg.items(), key=lambda kv: -kv[1])[:top]:
        print(f"    {us / 1000:7.1f} ms  {pkg}")


def _checkout(compare: str, tmp: Path) -> Path:
    """``--compare``'s tree: a directory as given, else the git revision's tree extracted under ``tmp``."""
    if Path(compare).is_dir():
        return Path(compare).resolve()
    dest = tmp / "compare"
    dest.mkdir()
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", compare], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15, help="timed runs of each command")
    ap.add_argument("--compare", default=None, metavar="ROOT|REV",
                    help="a second checkout, or a git revision of this repository, timed interleaved with this one")  # fmt: skip
    ap.add_argument("--top", type=int, default=8, help="import-time rows shown per command")
    args = ap.parse_args(argv)
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"timer: {'hyperfine' if shutil.which('hyperfine') else 'interleaved subprocess loop'}, "
          f"{args.repeat} runs")  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        pb = Path(d) / "one_step.yaml"
        pb.write_text(ONE_STEP)
        roots = (
            {"": ROOT}
            if args.compare is None
            else {"after ": ROOT, "before ": _checkout(args.compare, Path(d))}
        )
        base_env = environ(ROOT, Path(d) / "home")
        cases: dict[str, tuple[list[str], dict[str, str]]] = {
            "python -c pass": ([sys.executable, "-c", "pass"], base_env),
            "python -c 'import click'": ([sys.executable, "-c", "import click"], base_env),
        }
        for tag, root in roots.items():
            env = environ(root, Path(d) / f"home{tag.strip()}")
            for name, cmd in commands(pb).items():
                cases[f"{tag}{name}"] = (cmd, case_env(name, env))
        times = time_all(cases, args.repeat)
        med = {k: statistics.median(v) for k, v in times.items()}
        py, click_ = med["python -c pass"], med["python -c 'import click'"]
        print(
            f"\n{'command':<28} {'median':>8} {'min':>8} {'/ python':>9} {'/ click':>8} {'cpu med':>8}  target"
        )
        for name, ts in times.items():
            cpu = f"{statistics.median(CPU[name]):7.3f}s" if CPU.get(name) else "       -"
            cmd = name.split(" ", 1)[1] if name.startswith(("after ", "before ")) else name
            target = TARGETS.get(cmd)
            verdict = "" if target is None or name.startswith("before ") else (
                f"{target:.2f} s {'PASS' if med[name] <= target else 'MISS'}")  # fmt: skip
            print(
                f"{name:<28} {med[name]:7.3f}s {min(ts):7.3f}s {med[name] / py:8.1f}x {med[name] / click_:7.1f}x {cpu}  {verdict}"
            )
        if args.compare is not None:
            print("\nafter / before (median):")
            for cmd in commands(pb):
                cpu = (
                    (statistics.median(CPU["after " + cmd]) / statistics.median(CPU["before " + cmd]))
                    if CPU
                    else None
                )
                cpu_text = f"   cpu {cpu:.2f}" if cpu is not None else ""
                print(f"  {cmd:<10} wall {med['after ' + cmd] / med['before ' + cmd]:.2f}{cpu_text}")
        for tag, root in roots.items():
            env = environ(root, Path(d) / f"home{tag.strip()}")
            for name, cmd in commands(pb).items():
                report_imports(f"{tag}{name}", importtime(cmd, case_env(name, env)), args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
