"""The local mode (issue 46, seed 004 H.11): disk footprint and ``run`` start-up, before/after in one run.

    python -m benchmarks.bench_local_mode [--repeat N] [--compare REV]

Footprint: each playbook runs once with ``run`` (the local mode) and the same execution is then
pushed into a fresh SQLite file (today's log, ``noetl-dagster push``); a second execution runs with
``--durable`` (today's commit per step). Sizes are the local folder (events.feather,
commands.feather, metadata.json) against the SQLite file after its WAL is checkpointed.
Start-up: ``run`` of a one-step playbook, the local default and ``--durable``, interleaved
(A B C A B C ...) with ``python -c pass``; medians. Target: local files 5x smaller.
``--compare REV``: also the writer's CPU for a 1,000-iteration loop's 4,001 events (append, then one
flush to the file), this tree's ``storage/feather_events.py`` against REV's, loaded side by side in this
process and run interleaved (A B A B ...); medians of process CPU time, and each one's file size.
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


def loop_events(execution_id: str) -> list:
    """A 1,000-iteration loop's events as the engine records them (four an iteration), without ids."""
    from noetl_dagster.engine.events import Event, uuid7  # noqa: PLC0415

    srid, loop = uuid7(), uuid7()
    out = [
        Event(
            "playbook.execution.requested", execution_id, {"playbook": "bench/local"}, entity_id=execution_id
        )
    ]
    for i in range(1000):
        trid = uuid7()
        meta = {
            "attempt": 1,
            "duration_ms": 0.03,
            "task_run_id": trid,
            "usage": {"wall_s": 0.000018, "cpu_s": 0.00002, "mem_peak_bytes": 42557440, "mem_delta_bytes": 0},
        }
        common = {"step": "fan", "step_run_id": srid, "loop_id": loop, "iteration": i}
        out += [
            Event("loop.iteration.started", execution_id, entity_id=loop, status="in_progress", **common),
            Event(
                "task.started",
                execution_id,
                {"task": "task_0", "kind": "noop"},
                task_run_id=trid,
                entity_id=trid,
                attempt=1,
                status="in_progress",
                **common,
            ),
            Event(
                "task.done",
                execution_id,
                {
                    "task": "task_0",
                    "kind": "noop",
                    "outcome": {"status": "ok", "error": None, "meta": meta, "result": i * 2},
                    "directive": "continue",
                },
                task_run_id=trid,
                entity_id=trid,
                attempt=1,
                **common,
            ),
            Event("loop.iteration.done", execution_id, {"result": i * 2}, entity_id=loop, **common),
        ]
    return out


def writer_cpu(tmp: Path, rev: str, repeat: int) -> dict[str, tuple[float, int]]:
    import importlib.util  # noqa: PLC0415

    from noetl_dagster.storage import feather_events  # noqa: PLC0415

    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:noetl_dagster/storage/feather_events.py"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    (tmp / "feather_events_before.py").write_text(src)
    spec = importlib.util.spec_from_file_location("feather_events_before", tmp / "feather_events_before.py")
    before = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = before  # (dataclasses look their module up)
    spec.loader.exec_module(before)
    mods = {f"before ({rev})": before, "after (this tree)": feather_events}
    cpu: dict[str, list[float]] = {k: [] for k in mods}
    size: dict[str, int] = {}
    for r in range(repeat + 1):  # the first round warms up (zstd import, caches)
        for name, mod in mods.items():
            root = tmp / f"w{r}-{len(size)}-{name[:5]}"
            evs = loop_events("01a23729-63ba-758e-b7e1-0bce0e9bb6a3")
            t = time.process_time()
            store = mod.FeatherEventStore(root, idle_seconds=0)
            store.barrier(durable=False)  # the engine's caller: appends buffer until a flush
            store.append(evs)
            store.flush(fsync=False)
            elapsed = time.process_time() - t
            store.close()
            if r:
                cpu[name].append(elapsed)
            size[name] = sum(p.stat().st_size for p in (root / evs[0].execution_id).glob("*.feather"))
    return {k: (statistics.median(v), size[k]) for k, v in cpu.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--compare", metavar="REV", help="also time the writer against REV's (append + flush)")
    ap.add_argument("--writer-only", action="store_true", help="with --compare: only the writer's CPU")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.compare:
            w = writer_cpu(tmp, args.compare, args.repeat)
            print(
                f"writer, 4,001 loop events appended and flushed, median CPU of {args.repeat} (interleaved):"
            )
            for k, (c, b) in w.items():
                print(f"  {k:<22} {c * 1000:7.1f} ms  events+commands files {b:>8,} B")
            (_, (c0, _)), (_, (c1, _)) = w.items()
            print(f"  after / before: {c1 / c0:.2f}")
            if args.writer_only:
                return 0
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
