"""Production-path benchmarks (issue 8).

1. Events appended per second to the Postgres EventStore by 4 concurrent writers
   (processes, batches of 50 events as a step flush writes them), next to the
   same rows inserted by 4 writers with plain psycopg ``executemany`` into a bare
   table in the same run (ratio). Target: >= 5,000 events/s.
2. Recovery after kill -9: time from ``resume`` to the first resumed step, and
   the whole resume next to the same remaining work run uninterrupted. Target:
   <= 2 s plus the work left.

Run: ``python -m benchmarks.bench_deploy`` (needs Postgres at 127.0.0.1:5432, trust auth).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sqlite3
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

PG = os.environ.get("NOETL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
WRITERS = 4
EVENTS_PER_WRITER = 5_000
BATCH = 50


def _make_db() -> str:
    name = f"nd_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return name


def _drop_db(name: str) -> None:
    with psycopg.connect(PG, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _url(db: str) -> str:
    return PG.rsplit("/", 1)[0] + "/" + db


def _events(execution_id: str, n: int):
    from noetl_dagster.engine.events import Event

    return [
        Event(
            "task.done",
            execution_id,
            {"task": "t", "outcome": {"status": "ok", "result": {"i": i}}},
            step="s",
        )
        for i in range(n)
    ]


def _store_writer(url: str, start: mp.Barrier, out: mp.Queue) -> None:
    from noetl_dagster.storage.postgres_events import PostgresEventStore

    store = PostgresEventStore(url)
    evs = _events(str(uuid.uuid4()), EVENTS_PER_WRITER)
    start.wait()
    t0 = time.perf_counter()
    for i in range(0, len(evs), BATCH):
        store.append(evs[i : i + BATCH])
    out.put(time.perf_counter() - t0)
    store.close()


def _raw_writer(url: str, start: mp.Barrier, out: mp.Queue) -> None:
    from noetl_dagster.util.jsonutil import dumps

    evs = _events(str(uuid.uuid4()), EVENTS_PER_WRITER)
    rows = [
        (e.event_id, e.execution_id, n + 1, e.name, e.timestamp, dumps(e.to_dict()))
        for n, e in enumerate(evs)
    ]
    with psycopg.connect(url, autocommit=False) as c:
        start.wait()
        t0 = time.perf_counter()
        for i in range(0, len(rows), BATCH):
            with c.cursor() as cur:
                cur.executemany(
                    "INSERT INTO raw_events (event_id, execution_id, sequence, name, ts, body) VALUES (%s,%s,%s,%s,%s,%s)",
                    rows[i : i + BATCH],
                )
            c.commit()
        out.put(time.perf_counter() - t0)


def _concurrent(target, url: str) -> float:
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(WRITERS + 1)
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(url, start, out)) for _ in range(WRITERS)]
    for p in procs:
        p.start()
    start.wait()
    t0 = time.perf_counter()
    for p in procs:
        p.join()
    wall = time.perf_counter() - t0
    return WRITERS * EVENTS_PER_WRITER / wall


def bench_event_store() -> dict[str, float]:
    db = _make_db()
    try:
        url = _url(db)
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(
                "CREATE TABLE raw_events (gid BIGSERIAL PRIMARY KEY, event_id TEXT UNIQUE, execution_id TEXT,"
                " sequence INT, name TEXT, ts TEXT, body JSONB)"
            )
        from noetl_dagster.storage.postgres_events import PostgresEventStore

        PostgresEventStore(url).close()  # migrate once, outside the timed part
        raw = _concurrent(_raw_writer, url)
        ours = _concurrent(_store_writer, url)
        return {"store_events_per_s": ours, "raw_events_per_s": raw, "ratio": ours / raw}
    finally:
        _drop_db(db)


def _child(data_dir: str, eid: str) -> None:
    from noetl_dagster.runners.local import run_playbook

    run_playbook(
        Path(__file__).resolve().parents[1] / "tests" / "runners" / "recovery" / "probe.yaml",
        data_dir=data_dir,
        execution_id=eid,
    )
    os._exit(0)


def bench_recovery() -> dict[str, float]:
    from noetl_dagster.runners.local import resume_execution, run_playbook

    probe = Path(__file__).resolve().parents[1] / "tests" / "runners" / "recovery" / "probe.yaml"
    with tempfile.TemporaryDirectory() as d:
        run_playbook(probe, data_dir=Path(d) / "warm")  # imports and code caches warm
        t0 = time.perf_counter()
        run_playbook(probe, data_dir=Path(d) / "base")
        full = time.perf_counter() - t0
        with sqlite3.connect(Path(d) / "base" / "events.db") as c:
            total = c.execute("SELECT COUNT(*) FROM noetl_event").fetchone()[0]
        eid = str(uuid.uuid4())
        ctx = mp.get_context("fork")
        p = ctx.Process(target=_child, args=(str(Path(d) / "k"), eid))
        p.start()
        db = Path(d) / "k" / "events.db"
        while p.is_alive():
            try:
                with sqlite3.connect(db, timeout=5) as c:
                    if c.execute("SELECT COUNT(*) FROM noetl_event").fetchone()[0] >= total // 2:
                        break
            except sqlite3.OperationalError:
                pass
            time.sleep(0.001)
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        with sqlite3.connect(db) as c:
            durable = c.execute("SELECT COUNT(*) FROM noetl_event").fetchone()[0]
        first_step: list[float] = []
        t1 = time.perf_counter()
        resume_execution(eid, playbook=probe, data_dir=Path(d) / "k",
                         on_step=lambda run: first_step.append(time.perf_counter() - t1) if not first_step else None)  # fmt: skip
        resume_total = time.perf_counter() - t1
    return {
        "uninterrupted_s": full,
        "killed_after_events": durable,
        "total_events": total,
        "resume_total_s": resume_total,
        "time_to_first_resumed_step_s": first_step[0] if first_step else float("nan"),
    }


def main() -> None:
    print("== Postgres EventStore, 4 concurrent writers ==")
    try:
        r = bench_event_store()
        print(f"  EventStore.append : {r['store_events_per_s']:>10,.0f} events/s")
        print(f"  raw executemany   : {r['raw_events_per_s']:>10,.0f} events/s")
        print(f"  ratio (ours/raw)  : {r['ratio']:.2f}   target >= 5,000 events/s: "
              f"{'PASS' if r['store_events_per_s'] >= 5000 else 'MISS'}")  # fmt: skip
    except psycopg.OperationalError as e:
        print(f"  skipped: Postgres not reachable at {PG}: {e}")
    print("== Recovery after kill -9 ==")
    r = bench_recovery()
    print(f"  uninterrupted run        : {r['uninterrupted_s']:.3f} s")
    print(f"  killed after             : {r['killed_after_events']} of {r['total_events']} events")
    print(f"  resume (fold + rest)     : {r['resume_total_s']:.3f} s")
    print(f"  time to first resumed step: {r['time_to_first_resumed_step_s']:.3f} s   target <= 2 s + work left: "
          f"{'PASS' if r['time_to_first_resumed_step_s'] <= 2 else 'MISS'}")  # fmt: skip


if __name__ == "__main__":
    main()
