"""The local mode (issue 46, seed 004 H.11): disk footprint and ``run`` start-up, before/after in one run.

    python -m benchmarks.bench_local_mode [--repeat N]

Footprint: each playbook runs once with ``run`` (the local mode) and the same execution is then
pushed into a fresh SQLite file (today's log, ``noetl-dagster push``); a second execution runs with
``--durable`` (today's commit per step). Sizes are the local folder (events.feather,
commands.feather, metadata.json) against the SQLite file after its WAL is checkpointed.
Start-up: ``run`` of a one-step playbook, the local default and ``--durable``, interleaved
(A B C A B C ...) with ``python -c pass``; medians. Target: local files 5x smaller.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAD = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: bench, path: bench/local}\n"
ONE_STEP = (
    HEAD
    + 'workload: {n: 2}\nworkflow:\n  - step: start\n    tool: {kind: noop, result: "{{ workload.n * 2 }}"}\n'
)
FIVE_STEPS = HEAD + "workflow:\n" + "".join(
    f"  - step: s{i}\n    tool: {{kind: noop, result: {i}}}\n" + (f"    next: {{arcs: [{{step: s{i + 1}}}]}}\n" if i < 4 else "")
    for i in range(5)
)  # fmt: skip
LOOP = HEAD + (
    'workflow:\n  - step: fan\n    loop: {in: "{{ range(1000) }}", iterator: i}\n'
    '    tool: {kind: noop, result: "{{ iter.i * 2 }}"}\n'
)


def env_for(home: Path) -> dict[str, str]:
    paths = os.pathsep.join(str(ROOT / p) for p in ("", "analytics", "lineage", "registry_service"))
    env = {**os.environ, "PYTHONPATH": paths, "NOETL_DAGSTER_HOME": str(home)}
    env.pop("NOETL_EVENT_STORE_URL", None)
    return env


def cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", *args], env=env_for(home),
                          capture_output=True, text=True, check=True)  # fmt: skip


def sqlite_size(db: Path) -> int:
    with sqlite3.connect(db) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))


def footprint(tmp: Path, name: str, text: str) -> dict[str, float]:
    pb = tmp / f"{name}.yaml"
    pb.write_text(text)
    home = tmp / f"home-{name}"
    eid = json.loads(cli(home, "run", str(pb), "--json").stdout)["execution_id"]
    folder = home / "local" / eid
    local = sum(p.stat().st_size for p in folder.iterdir() if p.name != "lease")
    cli(home, "push", eid, "--event-store", f"sqlite:///{tmp / f'{name}-pushed.db'}")
    pushed = sqlite_size(tmp / f"{name}-pushed.db")
    durable_home = tmp / f"durable-{name}"
    cli(durable_home, "run", str(pb), "--durable", "--json")
    durable = sqlite_size(durable_home / "events.db")
    return {"local_bytes": local, "sqlite_same_execution": pushed, "sqlite_durable_run": durable,
            "ratio": pushed / local}  # fmt: skip


def startup(tmp: Path, repeat: int) -> dict[str, float]:
    pb = tmp / "one.yaml"
    pb.write_text(ONE_STEP)
    cases = {
        "python -c pass": ([sys.executable, "-c", "pass"], tmp / "h0"),
        "run (local mode)": ([sys.executable, "-m", "noetl_dagster.commands.main", "run", str(pb), "-q"], tmp / "h1"),
        "run --durable": ([sys.executable, "-m", "noetl_dagster.commands.main", "run", str(pb), "-q", "--durable"],
                          tmp / "h2"),
    }  # fmt: skip
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeat + 1):  # the first round warms the parse cache and byte-code
        for name, (argv, home) in cases.items():
            t = time.perf_counter()
            subprocess.run(argv, env=env_for(home), capture_output=True, check=True)
            times[name].append(time.perf_counter() - t)
    return {k: statistics.median(v[1:]) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        print("footprint (bytes): local folder vs the same execution pushed to SQLite, and a --durable run")
        for name, text in (("one_step", ONE_STEP), ("five_steps", FIVE_STEPS), ("loop_1000", LOOP)):
            f = footprint(tmp, name, text)
            mark = "PASS" if f["ratio"] >= 5 else "MISS"
            print(f"  {name:<11} local {f['local_bytes']:>8,}  sqlite {f['sqlite_same_execution']:>8,}  "
                  f"durable run {f['sqlite_durable_run']:>8,}  sqlite/local {f['ratio']:.1f}x  {mark} (>= 5x)")  # fmt: skip
        s = startup(tmp, args.repeat)
        base = s["python -c pass"]
        print(f"start-up, median of {args.repeat} (interleaved):")
        for k, v in s.items():
            print(f"  {k:<18} {v * 1000:7.1f} ms  {v / base:5.2f}x python")
        print(f"  local / durable: {s['run (local mode)'] / s['run --durable']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
