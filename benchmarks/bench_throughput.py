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

Throughput mode (``--throughput``): many executions at once per worker process (threads), across
processes: P processes x T threads, each thread running executions back to back for
``--seconds``; the latency of each is from its request (the ``run_playbook`` call) to its
completion. For each (P, T), in turn and in the same run:

* baseline: raw psycopg doing the same inserts: each thread its own connection, each flush of
  a real execution (captured once: the same event rows, names and body sizes) one autocommit
  multi-row ``INSERT ... VALUES`` into a copy of the event table (same columns, keys and indexes;
  no numbering, no append lock, no executions index): one round trip and one commit per flush;
* old path: the Postgres EventStore with group commit off (``group_commit=False``): each flush
  its own statement and commit, threads queueing on the append lock;
* new path: group commit on (the default): the flushes of all threads of a process that arrive
  while a statement is in flight go in the next statement, one commit for all of them.

The server's commit settings (``commit_delay``, ``commit_siblings``, ``synchronous_commit``...) are
printed as they are; nothing is changed on the server. Columns: client CPU per execution, CPU of
the workers' own server backends per execution (``/proc``, by ``application_name``), flushes per
statement. Headline configuration: ``--procs 2 --threads 24`` (fig: ~10,000/min, p99 < 1 s at load
~13 on 2 cores; docs/capacity.md).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import psycopg
import yaml

PG = os.environ.get("NOETL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
PER_WORKER = int(os.environ.get("NOETL_BENCH_EXECUTIONS", "150"))

# pure five steps (issue 46): the python tasks are marked `pure: true`, so the execution's events
# are two commits (the request, then the rest at its end); EFFECT_PLAYBOOK is the same with effects
PLAYBOOK = {
    "apiVersion": "noetl.io/v2",
    "kind": "Playbook",
    "metadata": {"name": "five_steps", "path": "bench/five_steps"},
    "workload": {"n": 3},
    "workflow": [
        {"step": "start", "tool": {"kind": "noop"}, "next": {"arcs": [{"step": "a"}]}},
        {
            "step": "a",
            "tool": {"kind": "python", "pure": True, "code": "result = {'x': 1}"},
            "next": {"arcs": [{"step": "b"}]},
        },
        {
            "step": "b",
            "tool": {"kind": "python", "pure": True, "code": "result = {'y': 2}"},
            "next": {"arcs": [{"step": "c"}]},
        },
        {
            "step": "c",
            "tool": {"kind": "python", "pure": True, "code": "result = {'z': 3}"},
            "next": {"arcs": [{"step": "end"}]},
        },
        {"step": "end", "tool": {"kind": "noop"}},
    ],
}
EFFECT_PLAYBOOK = {
    **PLAYBOOK,
    "workflow": [
        {**s, "tool": {k: v for k, v in s["tool"].items() if k != "pure"}}  # type: ignore[index]
        for s in PLAYBOOK["workflow"]  # type: ignore[union-attr]
    ],
}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _url(db: str) -> str:
    return PG.rsplit("/", 1)[0] + "/" + db


def _engine_worker(
    path: str, store_url: str, data_dir: str, n: int, start, out, legacy: bool = False
) -> None:
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
            for step, result in (
                ("start", "{}"),
                ("a", '{"x": 1}'),
                ("b", '{"y": 2}'),
                ("c", '{"z": 3}'),
                ("end", "{}"),
            ):
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--throughput", action="store_true", help="P processes x T threads, old path vs new path")
    ap.add_argument("--procs", default="1,2,4", help="worker processes, comma-separated")
    ap.add_argument("--threads", default="1,12", help="threads per process, comma-separated (the baseline opens"
                    " P x T connections: keep it under the server's max_connections)")  # fmt: skip
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per row")
    ap.add_argument(
        "--commit-delay", type=int, default=0, help="also the old path with this commit_delay (us)"
    )
    ap.add_argument(
        "--before-tree", help="the 'old path' row runs this checkout's code (e.g. a worktree of main)"
    )
    ap.add_argument("--rounds", type=int, default=1, help="repeat the grid, rows interleaved")
    ap.add_argument("--shapes", default="", help="P x T pairs instead of the --procs x --threads grid, e.g."
                    " 2x24,4x12 (the same concurrency, fewer threads a process)")  # fmt: skip
    ap.add_argument("--paths", default="baseline,old,new", help="rows per (P, T), in order: baseline, old (group"
                    " commit off, or --before-tree's code), new, durable (a commit per step boundary, issue 46's before), free (the engine with no store: the floor), delay")  # fmt: skip
    ap.add_argument(
        "--cpu-ab", action="store_true", help="client CPU per execution: --before-tree vs this checkout"
    )
    args = ap.parse_args(argv)
    if args.cpu_ab:
        cpu_ab(args.before_tree, args.rounds, PER_WORKER)
        return
    if args.throughput:
        paths = [x.strip() for x in args.paths.split(",") if x.strip()]
        if args.commit_delay and "delay" not in paths:
            paths.append("delay")
        grid(PLAYBOOK, _ints(args.procs), _ints(args.threads), args.seconds, args.commit_delay, args.before_tree,
             args.rounds, paths, [(int(a), int(b)) for a, b in (x.split("x") for x in args.shapes.split(",") if x)])  # fmt: skip
        return
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
                fig = _run(
                    _engine_worker, lambda i: (str(path), _url(db), f"{tmp}/d{i}", PER_WORKER), workers
                )
                rows.append((f"engine, Postgres store, {workers} worker(s)", fig))
            async_url = _url(db) + "?options=-c%20synchronous_commit%3Doff"  # the opt-in fsync policy
            fig = _run(_engine_worker, lambda i: (str(path), async_url, f"{tmp}/a{i}", PER_WORKER), 1)
            rows.append(("engine, Postgres, synchronous_commit=off, 1 wkr", fig))
            fig = _run(
                _engine_worker,
                lambda i: (str(path), f"sqlite:///{tmp}/events.db", f"{tmp}/s{i}", PER_WORKER),
                1,
            )
            rows.append(("engine, SQLite store, 1 worker", fig))
            rows.append(("baseline: 5 plain inserts, 4 workers", base))
            print(f"{'':44} {'exec/min':>10} {'p50 ms':>8} {'p99 ms':>8} {'ratio':>7}")
            for label, (per_min, p50, p99) in rows:
                print(
                    f"{label:44} {per_min:10.0f} {p50 * 1000:8.1f} {p99 * 1000:8.1f} {per_min / base[0]:7.2f}"
                )
            print(
                f"(CPU cores: {os.cpu_count()}; {PER_WORKER} executions per worker; Kestra's anchor: 1,000/min, 470 ms)"
            )
    finally:
        with psycopg.connect(PG, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


# ---- client CPU per execution, another checkout against this one ---------------------------------

CPU_CHILD = """
import sys, time, tempfile
sys.path.insert(0, sys.argv[1]) if sys.argv[1] else None
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.postgres_events import PostgresEventStore
store = PostgresEventStore(sys.argv[2])
d = tempfile.mkdtemp()
for _ in range(20):
    run_playbook(sys.argv[3], event_store=store, data_dir=d)
n = int(sys.argv[4])
c0 = time.process_time()
for _ in range(n):
    run_playbook(sys.argv[3], event_store=store, data_dir=d)
print((time.process_time() - c0) / n * 1000)
store.close()
"""


def cpu_ab(before_tree: str, rounds: int, n: int) -> None:
    """Client CPU per execution (one thread, no contention inside the process), a new process per
    sample, the two checkouts alternating: the steady figure on a shared machine."""
    import subprocess
    import sys

    db = f"nd_cpu_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {db}")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "five_steps.yaml"
            path.write_text(yaml.safe_dump(PLAYBOOK, sort_keys=False))
            out: dict[str, list[float]] = {"before": [], "after": []}
            for _ in range(rounds):
                for label, tree in (("before", before_tree), ("after", "")):
                    res = subprocess.run([sys.executable, "-c", CPU_CHILD, tree, _url(db) + f"?schema={label}", str(path),
                                          str(n)], capture_output=True, text=True, check=True)  # fmt: skip
                    out[label].append(float(res.stdout.strip().splitlines()[-1]))
            b, a = statistics.median(out["before"]), statistics.median(out["after"])
            print(f"client CPU ms per execution, median of {rounds} (load {_load()}): before {b:.2f} "
                  f"{[round(x, 2) for x in out['before']]}, after {a:.2f} {[round(x, 2) for x in out['after']]}, "
                  f"after / before {a / b:.2f}")  # fmt: skip
    finally:
        with psycopg.connect(PG, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


# ---- throughput mode: P processes x T threads ---------------------------------------------------

SERVER_SETTINGS = ("synchronous_commit", "commit_delay", "commit_siblings", "fsync", "wal_sync_method",
                   "wal_writer_delay", "max_connections", "shared_buffers")  # fmt: skip

COPY_TABLE = """CREATE TABLE IF NOT EXISTS bench_event (
    gid BIGSERIAL PRIMARY KEY, event_id TEXT NOT NULL UNIQUE, execution_id TEXT NOT NULL,
    sequence BIGINT NOT NULL, name TEXT NOT NULL, ts TEXT NOT NULL, body JSON NOT NULL,
    UNIQUE (execution_id, sequence))"""


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def _capture_flushes(path: str, url: str, data_dir: str) -> list[list[tuple[str, str, str]]]:
    """The flushes of one real execution: per flush, its events' (name, ts, stored body)."""
    from noetl_dagster.runners.local import run_playbook
    from noetl_dagster.storage.postgres_events import PostgresEventStore
    from noetl_dagster.util.jsonutil import dumps

    store = PostgresEventStore(url, group_commit=False)
    flushes: list[list[tuple[str, str, str]]] = []
    append = store.append

    def recording(events):  # type: ignore[no-untyped-def]
        out = append(events)
        flushes.append([(e.name, e.timestamp, dumps(e.to_stored())) for e in out])
        return out

    store.append = recording  # type: ignore[method-assign]
    run_playbook(path, event_store=store, data_dir=data_dir)
    store.close()
    return flushes


class _ServerCpu:
    """CPU seconds used so far by the server backends of this worker's connections (tagged by
    ``application_name``), read from /proc: the server runs on this machine. 0 when it does not."""

    def __init__(self, url: str, tag: str):
        self.conn = psycopg.connect(url, autocommit=True)
        self.tag = tag
        self.tick = os.sysconf("SC_CLK_TCK")

    def __call__(self) -> float:
        pids = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (self.tag,)
        ).fetchall()
        total = 0.0
        for (pid,) in pids:
            try:
                f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(f[11]) + int(f[12])) / self.tick
        return total


def _threads(
    body, threads: int, seconds: float, start, out, stats=lambda: (0, 0), server=lambda: 0.0
) -> None:  # type: ignore[no-untyped-def]
    """Run ``body(thread_index)`` (one execution) back to back on each thread until the deadline."""
    import threading

    lats: list[float] = []
    done = threading.Barrier(threads + 1)

    def loop(i: int) -> None:
        mine = []
        done.wait()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            r0 = time.perf_counter()
            body(i)
            mine.append(time.perf_counter() - r0)
        lats.extend(mine)

    ts = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(threads)]
    for t in ts:
        t.start()
    start.wait()  # every process ready
    t0 = time.perf_counter()
    c0 = time.process_time()
    s0 = server()
    done.wait()
    for t in ts:
        t.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out.put((wall, lats, cpu, stats(), server() - s0))


def _tp_engine(
    path: str,
    url: str,
    data_dir: str,
    threads: int,
    seconds: float,
    group: bool,
    tree,
    free: bool,
    durable: bool,
    start,
    out,
) -> None:  # type: ignore[no-untyped-def]
    if (
        tree
    ):  # another checkout's code (the "before" of an A/B in one run): first on the path, before any import
        import sys

        sys.path.insert(0, tree)
    from noetl_dagster.runners.local import build_services, run_playbook
    from noetl_dagster.storage.postgres_events import PostgresEventStore

    tag = f"ndtp{os.getpid()}"
    store = PostgresEventStore(
        url + "&application_name=" + tag, group_commit=group, pool_size=max(4, min(threads, 8))
    )
    if free:  # the floor: the engine's own CPU, events numbered in memory, nothing encoded or sent
        last: dict[str, int] = {}

        def numbered(events):  # type: ignore[no-untyped-def]
            for e in events:  # one thread per execution: no two threads number the same one
                last[e.execution_id] = e.sequence = last.get(e.execution_id, 0) + 1
            return list(events)

        store.append = numbered  # type: ignore[method-assign]
    svc = build_services(event_store=store, data_dir=data_dir)
    if durable:  # issue 46's before: a commit at every step boundary (--durable), same code otherwise
        svc.durable = True
    run_playbook(path, services=svc)  # warm: imports, pools, template cache
    server = _ServerCpu(url.split("?", 1)[0], tag)

    def one(i: int) -> None:
        result = run_playbook(path, services=svc)
        assert result.status == "completed", result.status

    group = store._group  # flushes and statements (rounds) of the measured part
    r0, q0 = (group.rounds, group.requests) if group else (0, 0)
    _threads(one, threads, seconds, start, out, lambda: (group.rounds - r0, group.requests - q0) if group else (0, 0),
             server)  # fmt: skip
    store.close()
    server.conn.close()


# One statement per flush, autocommit: one round trip and one commit (issue 35: the baseline was a
# transaction of ``executemany``, three round trips per flush: BEGIN, the pipelined inserts, COMMIT).
# Scalar parameters (psycopg's C dumpers; its list dumpers are Python), prepared per flush size.
def _baseline_insert(rows: int) -> str:
    values = ",".join(["(%s, %s, %s, %s, %s, %s)"] * rows)
    return f"INSERT INTO bench_event (event_id, execution_id, sequence, name, ts, body) VALUES {values}"


def _tp_baseline(url: str, flushes, threads: int, seconds: float, start, out) -> None:  # type: ignore[no-untyped-def]
    tag = f"ndtp{os.getpid()}"
    conns = [psycopg.connect(url, autocommit=True, application_name=tag) for _ in range(threads)]
    server = _ServerCpu(url, tag)
    inserts = [_baseline_insert(len(flush)) for flush in flushes]

    def one(i: int) -> None:
        conn, eid, seq = conns[i], str(uuid.uuid4()), 0
        for flush, insert in zip(flushes, inserts, strict=True):
            params: list[object] = []
            for name, ts, body in flush:
                seq += 1
                params += (str(uuid.uuid4()), eid, seq, name, ts, body)
            conn.execute(insert, params, prepare=True)

    _threads(one, threads, seconds, start, out, server=server)
    for c in [*conns, server.conn]:
        c.close()


def _tp_run(target, args_for, procs: int) -> dict:  # type: ignore[no-untyped-def]
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(procs)
    out = ctx.Queue()
    ps = [ctx.Process(target=target, args=(*args_for(i), start, out)) for i in range(procs)]
    load0 = _load()
    for p in ps:
        p.start()
    results = []
    while len(results) < len(ps):  # a worker that died (an error in its code) fails the row, not a hang
        try:
            results.append(out.get(timeout=5))
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in ps):
                for p in ps:
                    p.kill()
                raise RuntimeError(f"a worker process failed ({[p.exitcode for p in ps]})") from None
    for p in ps:
        p.join()
    wall = max(r[0] for r in results)
    lat = sorted(x for r in results for x in r[1])
    cpu_ms = sum(r[2] for r in results) / len(lat) * 1000
    srv_ms = sum(r[4] for r in results) / len(lat) * 1000
    return {"per_min": len(lat) / wall * 60, "p50": statistics.median(lat),
            "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))], "n": len(lat),
            "cpu_ms": cpu_ms, "load": f"{load0} -> {_load()}",
            "per_stmt": sum(r[3][1] for r in results) / max(1, sum(r[3][0] for r in results)),
            "srv_ms": srv_ms, "bound": (os.cpu_count() or 1) * 60_000 / max(1e-9, cpu_ms + srv_ms)}  # fmt: skip


def grid(playbook: dict, procs: list[int], threads: list[int], seconds: float, commit_delay: int = 0,
         before_tree: str | None = None, rounds: int = 1,
         paths: Sequence[str] = ("baseline", "old", "new"),
         shapes: Sequence[tuple[int, int]] = ()) -> None:  # fmt: skip
    db = f"nd_tpg_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {db}")
        settings = c.execute(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", (list(SERVER_SETTINGS),)
        ).fetchall()
    with psycopg.connect(_url(db), autocommit=True) as c:
        c.execute(COPY_TABLE)
    print("server:", ", ".join(f"{k}={v}" for k, v in sorted(settings)), f"(CPU cores: {os.cpu_count()})")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "five_steps.yaml"
            path.write_text(yaml.safe_dump(playbook, sort_keys=False))
            flushes = _capture_flushes(str(path), _url(db) + "?schema=capture", f"{tmp}/cap")
            n_ev = sum(len(f) for f in flushes)
            print(f"one execution: {len(flushes)} flushes, {n_ev} events, "
                  f"{sum(len(b) for f in flushes for _, _, b in f)} body bytes; {seconds:.0f} s per row")  # fmt: skip
            print(f"{'P x T':8} {'path':10} {'exec/min':>9} {'p50 ms':>8} {'p99 ms':>8} {'cpu ms/ex':>9} {'srv ms':>6} "
                  f"{'bound':>7} {'fl/st':>6} {'vs base':>7}  load 1/5/15 min (before -> after)")  # fmt: skip
            opt = f"&options=-c%20commit_delay%3D{commit_delay}"

            def engine(
                schema: str,
                t: int,
                group: bool,
                tree: str | None,
                free: bool = False,
                extra: str = "",
                durable: bool = False,
            ):  # type: ignore[no-untyped-def]
                return lambda i: (str(path), _url(db) + f"?schema={schema}{extra}", f"{tmp}/{schema}{i}", t, seconds,
                                  group, tree, free, durable)  # fmt: skip

            grid_shapes = list(shapes) if shapes else [(p, t) for p in procs for t in threads]
            # rounds: interleaved, and every other round runs its rows in reverse order (the load drifts)
            for k, (p, t) in enumerate([shape for _ in range(rounds) for shape in grid_shapes]):
                rows = []
                for name in paths if (k // len(grid_shapes)) % 2 == 0 else paths[::-1]:
                    if name == "baseline":
                        r = _tp_run(_tp_baseline, lambda i, t=t: (_url(db), flushes, t, seconds), p)
                    elif name == "old":  # group commit off; with --before-tree: that checkout's code as it is
                        r = _tp_run(_tp_engine, engine("oldpath", t, before_tree is not None, before_tree), p)
                        name = "before" if before_tree else "old path"
                    elif name == "new":
                        r = _tp_run(_tp_engine, engine("newpath", t, True, None), p)
                        name = "new path"
                    elif name == "durable":  # issue 46's before: a commit per step boundary (--durable)
                        r = _tp_run(_tp_engine, engine("durable", t, True, None, durable=True), p)
                        name = "per step"
                    elif (
                        name == "free"
                    ):  # the engine alone: what the machine allows if the store cost nothing
                        r = _tp_run(_tp_engine, engine("free", t, True, None, free=True), p)
                        name = "no store"
                    elif name == "delay":  # the server's own group commit, this session only
                        r = _tp_run(_tp_engine, engine("olddelay", t, False, None, extra=opt), p)
                        name = "old+delay"
                    else:
                        raise SystemExit(f"unknown path {name!r} (baseline, old, new, durable, free, delay)")
                    rows.append((name, r))
                base = next((r for n, r in rows if n == "baseline"), None)
                for label, r in rows:
                    vs = f"{r['per_min'] / base['per_min']:7.2f}" if base else f"{'-':>7}"
                    print(f"{p} x {t:<4} {label:10} {r['per_min']:9.0f} {r['p50'] * 1000:8.1f} {r['p99'] * 1000:8.1f} "
                          f"{r['cpu_ms']:9.2f} {r['srv_ms']:6.2f} {r['bound']:7.0f} {r['per_stmt']:6.1f} {vs}  {r['load']}",
                          flush=True)  # fmt: skip
    finally:
        with psycopg.connect(PG, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


if __name__ == "__main__":
    main()
