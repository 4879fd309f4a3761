"""The worker pool over NATS (issue 45 item 4): executions/min and p99 with 1, 2 and 4 workers.

    python -m benchmarks.bench_nats_workers [--executions N] [--concurrency C] [--loads io,cpu]

One run, one load per row: ``--executions`` executions of a three-step playbook, ``--concurrency``
of them at a time (threads of this process driving the local runner), every event in the Postgres
EventStore (a database of its own at 127.0.0.1:5432). Each step is one python task:

* ``io``: waits 50 ms (``time.sleep``: a call to a slow service) and returns a small dict;
* ``cpu``: spins 20 ms of Python and returns a small dict.

Rows: the baseline, the same executions with every task in the engine's own process (no pool); then
the python calls handed to the pool (``NOETL_TOOL_DISPATCH``: commands on ``NOETL_CMD_<region>_<shard>``)
with 1, 2 and 4 ``noetl-dagster worker`` processes of ``--concurrency 1`` each. Latency is from the
``run_playbook`` call to its return. Ratios: executions/min over the 1-worker row of the same load
(the scaling), and over the in-process baseline (what the hop costs). Workers run on this machine
(2 cores shared with the engine, NATS and Postgres): CPU-bound tasks cannot scale past the cores.

Needs nats-server with JetStream at 127.0.0.1:4222 and Postgres at 127.0.0.1:5432 (trust auth).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

NATS_URL = os.environ.get("NOETL_BENCH_NATS", "nats://127.0.0.1:4222")
PG_ADMIN = os.environ.get("NOETL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
DATABASE = "nats_workers_bench"
ROOT = Path(__file__).resolve().parents[1]

CODE = {
    "io": "import time\ntime.sleep(0.05)\nresult = {'ok': True}",
    "cpu": "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.02:\n    pass\nresult = {'ok': True}",
}


def playbook(load: str) -> Any:
    from noetl_dagster.dsl import load_playbook_dict

    steps = [f"s{i}" for i in range(3)]
    workflow = [{"step": s, "tool": {"kind": "python", "code": CODE[load]},
                 **({"next": {"arcs": [{"step": steps[i + 1]}]}} if i + 1 < len(steps) else {})}
                for i, s in enumerate(steps)]  # fmt: skip
    return load_playbook_dict({"apiVersion": "noetl.io/v2", "kind": "Playbook",
                               "metadata": {"name": f"bench_{load}", "path": f"bench/nats_{load}"},
                               "workflow": [{"step": "start", "next": {"arcs": [{"step": "s0"}]}}, *workflow]})  # fmt: skip


def database() -> str:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DATABASE}"')
    return PG_ADMIN.rsplit("/", 1)[0] + f"/{DATABASE}"


def drive(services: Any, load: str, executions: int, concurrency: int) -> tuple[float, list[float]]:
    """Run ``executions`` at ``concurrency`` at a time: (wall seconds, latency of each in seconds)."""
    from noetl_dagster.runners.local import run_playbook

    pb = playbook(load)
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    todo = iter(range(executions))

    def worker() -> None:
        while True:
            with lock:
                if next(todo, None) is None:
                    return
            t0 = time.perf_counter()
            res = run_playbook(pb, services=services)
            dt = time.perf_counter() - t0
            with lock:
                latencies.append(dt)
                if res.status != "completed":
                    failures.append(f"{res.status}: {res.results}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if failures:
        raise SystemExit(f"bench_nats_workers: {len(failures)} executions failed, e.g. {failures[0]}")
    return wall, latencies


def start_workers(n: int, region: str, store_url: str, home: Path) -> list[subprocess.Popen]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            str(ROOT / p) for p in ("", "analytics", "lineage", "registry_service")
        ),
    }
    procs = []
    for i in range(n):
        log = home / f"worker{i}.log"
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "noetl_dagster.commands.main", "worker", "--nats", NATS_URL, "--region", region,
             "--shard", "bench/nats", "--event-store", store_url, "--data-dir", str(home / "wd"), "--concurrency", "1"],
            stderr=log.open("w"), env=env, cwd=home))  # fmt: skip
    for i, p in enumerate(procs):
        log = home / f"worker{i}.log"
        deadline = time.time() + 120
        while "streams" not in log.read_text():
            if p.poll() is not None or time.time() > deadline:
                raise SystemExit(f"bench_nats_workers: a worker did not start: {log.read_text()}")
            time.sleep(0.05)
    return procs


def stop_workers(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


def drop_streams(region: str) -> None:
    from noetl_dagster.storage import nats_streams

    with nats_streams.connect(NATS_URL) as client:
        for info in client.call(client.js.streams_info()):
            if f"_{region}_" in info.config.name:
                client.call(client.js.delete_stream(info.config.name))


def row(
    name: str, executions: int, wall: float, lat: list[float], base: float | None, one: float | None
) -> float:
    per_min = executions / wall * 60
    lat_ms = sorted(x * 1000 for x in lat)
    p99 = lat_ms[min(len(lat_ms) - 1, int(round(0.99 * (len(lat_ms) - 1))))]
    ratio_one = f"{per_min / (one or per_min):5.2f}x" if name.startswith("pool") else "    -"
    ratio_base = f"{per_min / base:5.2f}x" if base else "    -"
    print(
        f"| {name:<22} | {per_min:8,.0f} | {statistics.median(lat_ms):7.0f} | {p99:7.0f} | {ratio_one} | {ratio_base} |"
    )
    return per_min


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--executions", type=int, default=int(os.environ.get("NOETL_BENCH_POOL_EXECUTIONS", 40)))
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--loads", default="io,cpu")
    ap.add_argument("--workers", default="1,2,4")
    args = ap.parse_args()
    from noetl_dagster.runners.local import build_services
    from noetl_dagster.tools.command_queue import NatsToolDispatch

    store_url = database()
    region = f"b{uuid.uuid4().hex[:8]}"
    home = Path(tempfile.mkdtemp(prefix="bench_nats_workers_"))
    counts = [int(n) for n in args.workers.split(",")]
    print(f"worker pool over NATS: {args.executions} executions of 3 python steps, {args.concurrency} at a time, "
          f"Postgres EventStore; workers of --concurrency 1 on {os.cpu_count()} cores")  # fmt: skip
    try:
        for load in args.loads.split(","):
            print(f"\nload {load!r} ({'a 50 ms wait' if load == 'io' else '20 ms of Python CPU'} per task)\n")
            print("| configuration          | exec/min | p50 ms  | p99 ms  | vs 1 w | vs in-process |")
            print("|---|---:|---:|---:|---:|---:|")
            services = build_services(
                event_store=store_url, data_dir=home / "engine", tenant="bench", project="nats"
            )
            drive(services, load, min(4, args.executions), args.concurrency)  # warm: imports, connections
            wall, lat = drive(services, load, args.executions, args.concurrency)
            base = row("in-process (no pool)", args.executions, wall, lat, None, None)
            one = None
            for n in counts:
                procs = start_workers(n, region, store_url, home)
                dispatch = NatsToolDispatch(NATS_URL, region=region, kinds=frozenset({"python"}), timeout=300)
                try:
                    pooled = build_services(event_store=store_url, data_dir=home / "engine", tenant="bench",
                                            project="nats", dispatch=dispatch)  # fmt: skip
                    drive(pooled, load, min(4, args.executions), args.concurrency)
                    wall, lat = drive(pooled, load, args.executions, args.concurrency)
                finally:
                    dispatch.close()
                    stop_workers(procs)
                per_min = row(
                    f"pool, {n} worker{'s' if n > 1 else ''}", args.executions, wall, lat, base, one
                )
                one = one or per_min
    finally:
        drop_streams(region)


if __name__ == "__main__":
    main()
