"""Throughput (issue 19 §3): executions per minute of a 5-step playbook, with the
latency of each from request to completion (p50, p99).

Workers are processes (the GIL makes threads pointless for engine CPU), each running
executions back to back against one shared event store:

1. the Postgres EventStore (the production store) with 1, 2 and 4 worker processes, and
   with 1 worker on the append path as it was before issue 19 (one transaction of nine
   round trips per flush, full event bodies) for a before/after in the same run;
2. the Postgres EventStore with ``synchronous_commit=off`` in its URL (the opt-in fsync
   policy of docs/capacity.md), 1 worker; the SQLite EventStore (embedded default), 1 worker;
3. the baseline in the same run: the same five steps as plain Python calls that write
   one row each to Postgres (what a hand-written durable loop costs), 4 processes.

The ratio column is the engine's executions per minute over the baseline's.
Run: ``python -m benchmarks.bench_throughput`` (needs Postgres at 127.0.0.1:5432).
Anchor (Kestra's published figure): 1,000 executions/min at 0.47 s latency.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
import yaml

PG = os.environ.get("NOETL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
PER_WORKER = int(os.environ.get("NOETL_BENCH_EXECUTIONS", "150"))

PLAYBOOK = {
    "apiVersion": "noetl.io/v2",
    "kind": "Playbook",
    "metadata": {"name": "five_steps", "path": "bench/five_steps"},
    "workload": {"n": 3},
    "workflow": [
        {"step": "start", "tool": {"kind": "noop"}, "next": {"arcs": [{"step": "a"}]}},
        {"step": "a", "tool": {"kind": "python", "code": "result = {'x': 1}"}, "next": {"arcs": [{"step": "b"}]}},
        {"step": "b", "tool": {"kind": "python", "code": "result = {'y': 2}"}, "next": {"arcs": [{"step": "c"}]}},
        {"step": "c", "tool": {"kind": "python", "code": "result = {'z': 3}"}, "next": {"arcs": [{"step": "end"}]}},
        {"step": "end", "tool": {"kind": "noop"}},
    ],
}


def _url(db: str) -> str:
    return PG.rsplit("/", 1)[0] + "/" + db


def _engine_worker(path: str, store_url: str, data_dir: str, n: int, start, out, legacy: bool = False) -> None:
    from noetl_dagster.runners.local import run_playbook
    from noetl_dagster.storage.event_stores import open_event_store

    store = open_event_store(store_url, data_dir=data_dir)
    if legacy:  # the append before issue 19: full bodies, one transaction of nine round trips per flush
        from noetl_dagster.engine.events import Event

        Event.to_stored = Event.to_dict  # type: ignore[method-assign]
        store.append = lambda events: store._append(events, check_existing=False)  # type: ignore[attr-defined,method-assign]
    run_playbook(path, event_store=store, data_dir=data_dir)  # warm: imports, pools, template cache
    start.wait()
    latencies = []
    t0 = time.perf_counter()
    for _ in range(n):
        r0 = time.perf_counter()
        result = run_playbook(path, event_store=store, data_dir=data_dir)
        assert result.status == "completed", result.status
        latencies.append(time.perf_counter() - r0)
    out.put((time.perf_counter() - t0, latencies))
    store.close()


def _baseline_worker(url: str, n: int, start, out) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        start.wait()
        latencies = []
        t0 = time.perf_counter()
        for _ in range(n):
            r0 = time.perf_counter()
            eid = str(uuid.uuid4())
            for step, result in (("start", "{}"), ("a", '{"x": 1}'), ("b", '{"y": 2}'), ("c", '{"z": 3}'), ("end", "{}")):
                c.execute("INSERT INTO bench_step VALUES (%s, %s, %s)", (eid, step, result))
            latencies.append(time.perf_counter() - r0)
        out.put((time.perf_counter() - t0, latencies))


def _run(target, args_for, workers: int, **kw) -> tuple[float, float, float]:
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(workers)
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_for(i), start, out), kwargs=kw) for i in range(workers)]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    wall = max(r[0] for r in results)
    lat = sorted(x for r in results for x in r[1])
    per_min = len(lat) / wall * 60
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    return per_min, statistics.median(lat), p99


def main() -> None:
    db = f"nd_tp_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {db}")
    with psycopg.connect(_url(db), autocommit=True) as c:
        c.execute("CREATE TABLE bench_step (execution_id text, step text, result jsonb)")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "five_steps.yaml"
            path.write_text(yaml.safe_dump(PLAYBOOK, sort_keys=False))
            rows = []
            base = _run(_baseline_worker, lambda i: (_url(db), PER_WORKER), 4)
            fig = _run(_engine_worker, lambda i: (str(path), _url(db) + "?schema=legacy", f"{tmp}/l{i}", PER_WORKER), 1,
                       legacy=True)  # fmt: skip
            rows.append(("before: Postgres store, 1 worker, old append", fig))
            for workers in (1, 2, 4):
                fig = _run(_engine_worker, lambda i: (str(path), _url(db), f"{tmp}/d{i}", PER_WORKER), workers)
                rows.append((f"engine, Postgres store, {workers} worker(s)", fig))
            async_url = _url(db) + "?options=-c%20synchronous_commit%3Doff"  # the opt-in fsync policy
            fig = _run(_engine_worker, lambda i: (str(path), async_url, f"{tmp}/a{i}", PER_WORKER), 1)
            rows.append(("engine, Postgres, synchronous_commit=off, 1 wkr", fig))
            fig = _run(_engine_worker, lambda i: (str(path), f"sqlite:///{tmp}/events.db", f"{tmp}/s{i}", PER_WORKER), 1)
            rows.append(("engine, SQLite store, 1 worker", fig))
            rows.append(("baseline: 5 plain inserts, 4 workers", base))
            print(f"{'':44} {'exec/min':>10} {'p50 ms':>8} {'p99 ms':>8} {'ratio':>7}")
            for label, (per_min, p50, p99) in rows:
                print(f"{label:44} {per_min:10.0f} {p50 * 1000:8.1f} {p99 * 1000:8.1f} {per_min / base[0]:7.2f}")
            print(f"(CPU cores: {os.cpu_count()}; {PER_WORKER} executions per worker; Kestra's anchor: 1,000/min, 470 ms)")
    finally:
        with psycopg.connect(PG, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


if __name__ == "__main__":
    main()
