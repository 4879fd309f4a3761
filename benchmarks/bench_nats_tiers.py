"""The event tiers on NATS (issue 45): append cost against the Postgres store, the projection's lag under
load, and stream storage before/after retention. One process, one run: the ratios compare rows of the
same run on the same machine.

1. append: the same events (``--executions`` x ``--events``, flushed ``--batch`` at a time as a step
   flushes) appended to the nats:// store (acknowledged by JetStream) and to the Postgres store; events/s
   and the ratio nats / postgres.
2. lag: a writer appends as fast as it can while a ``noetl-dagster projector`` process (batch 256) projects;
   the lag (stream last sequence - projection checkpoint) is sampled every 50 ms: p50, p99, max, and how long
   the projector needs to catch up once the writer stops.
3. retention: stream bytes and messages after the load, after the archiver wrote every finished execution's
   bundle and ``retention --min-age 0`` ran (one execution left running keeps its range).

Run: ``python -m benchmarks.bench_nats_tiers [--executions 40] [--events 50] [--batch 10]``. Needs the
nats-server (``$NOETL_TEST_NATS_URL``, default 127.0.0.1:4222) and Postgres (``$NOETL_TEST_PG_URL``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote

NATS = os.environ.get("NOETL_TEST_NATS_URL", "nats://127.0.0.1:4222")
PG_ADMIN = os.environ.get("NOETL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
DB = "nats_tiers_bench"
REPO = Path(__file__).resolve().parents[1]


def _events(execution_id: str, n: int) -> list:
    from noetl_dagster.engine.events import Event

    out = [Event("playbook.execution.requested", execution_id, data={"playbook": "bench"}),
           Event("workflow.started", execution_id)]  # fmt: skip
    for i in range(n - 4):
        out.append(Event("task.done", execution_id, step=f"s{i % 5}", task_run_id=f"t{i}", attempt=1,
                         data={"task": "t", "kind": "python", "outcome": {"status": "ok", "result": {"i": i, "v": "x" * 40}}}))  # fmt: skip
    out += [Event("workflow.finished", execution_id, data={"status": "completed"}),
            Event("playbook.processed", execution_id, data={"status": "completed"})]  # fmt: skip
    return out


def _append_all(store, executions: int, events: int, batch: int, tag: str) -> float:
    t = time.perf_counter()
    for k in range(executions):
        evs = _events(f"{tag}-{k}", events)
        for i in range(0, len(evs), batch):
            store.append(evs[i : i + batch])
    return time.perf_counter() - t


def _caught_up(client, proj, p, timeout: float = 300) -> None:
    last = client.call(client.js.stream_info(p.events_stream)).state.last_seq
    end = time.monotonic() + timeout
    while proj.checkpoint("state", p.region, p.shard, p.events_stream) < last:
        if time.monotonic() > end:
            raise TimeoutError("the projector did not catch up")
        time.sleep(0.02)


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--executions", type=int, default=40)
    ap.add_argument("--events", type=int, default=50)
    ap.add_argument("--batch", type=int, default=10)
    a = ap.parse_args(argv)

    import psycopg

    from noetl_dagster.storage import nats_consumers as nc
    from noetl_dagster.storage.event_stores import open_event_store
    from noetl_dagster.storage.nats_projection import Projection
    from noetl_dagster.storage.nats_streams import connect, placement_of

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB,)).fetchone():
            conn.execute(f'CREATE DATABASE "{DB}"')
    pg_db = PG_ADMIN.rsplit("/", 1)[0] + "/" + DB
    tag = uuid.uuid4().hex[:8]
    region, schema, pg_schema = f"b{tag}", f"bn_{tag}", f"bp_{tag}"
    payload = Path("/tmp") / f"noetl-bench-archive-{tag}"
    url = (f"{NATS}?projection={quote(f'{pg_db}?schema={schema}', safe='')}"
           f"&payload={quote('file://' + str(payload), safe='')}&region={region}")  # fmt: skip
    p = placement_of("default", "default", region=region)
    n_events = a.executions * a.events
    client = connect(NATS)
    proc = None
    try:
        # 1. append: nats vs postgres, same events, same process
        with open_event_store(f"{pg_db}?schema={pg_schema}") as pg, open_event_store(url) as nats:
            _append_all(pg, 2, a.events, a.batch, "warm-pg")  # connections, schema, JIT out of the figures
            _append_all(nats, 2, a.events, a.batch, "warm-nats")
            t_pg = _append_all(pg, a.executions, a.events, a.batch, "pg")
            t_nats = _append_all(nats, a.executions, a.events, a.batch, "nats")
        print(f"append {n_events} events in batches of {a.batch}: postgres {n_events / t_pg:,.0f} ev/s, "
              f"nats {n_events / t_nats:,.0f} ev/s, ratio nats/postgres {t_pg / t_nats:.2f}x throughput")  # fmt: skip

        # 2. lag under load: a projector process while a writer appends
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *(str(REPO / d) for d in
               ("analytics", "lineage", "registry_service"))])}  # fmt: skip
        cli = str(Path(sys.executable).with_name("noetl-dagster"))
        proc = subprocess.Popen([cli, "projector", "--store", url, "--shard", p.shard, "--batch", "256"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        proj = Projection(f"{pg_db}?schema={schema}")  # the schema exists before the projector starts
        lags: list[float] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                last = client.call(client.js.stream_info(p.events_stream)).state.last_seq
                lags.append(last - proj.checkpoint("state", p.region, p.shard, p.events_stream))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        _caught_up(client, proj, p)  # the projector started and applied the append phase's events
        sampler.start()
        with open_event_store(url) as nats:
            t_load = _append_all(nats, a.executions, a.events, a.batch, "load")
            # one execution left running: retention must keep its range
            nats.append(_events("still-running", 10)[:2])
        t0 = time.perf_counter()
        _caught_up(client, proj, p)
        catch_up = time.perf_counter() - t0
        done.set()
        sampler.join()
        rate = n_events / t_load
        print(f"projection lag while appending {rate:,.0f} ev/s: p50 {_pct(lags, 0.5):.0f} events, "
              f"p99 {_pct(lags, 0.99):.0f}, max {max(lags):.0f} ({max(lags) / rate * 1000:.0f} ms of appends); "
              f"caught up {catch_up * 1000:.0f} ms after the writer stopped; samples {len(lags)}")  # fmt: skip
        proc.terminate()
        proc.wait(20)
        proc = None

        # 3. storage before/after retention
        before = client.call(client.js.stream_info(p.events_stream)).state
        arch = nc.Archiver(url, p)
        arch.drain()
        arch.close()
        ret = nc.Retention(url, p, min_age_s=0)
        report = ret.enforce()
        ret.close()
        after = client.call(client.js.stream_info(p.events_stream)).state
        print(f"stream storage: before {before.bytes / 1e6:.2f} MB / {before.messages} msgs "
              f"({before.bytes / max(before.messages, 1):.0f} B/event); after archive + retention "
              f"{after.bytes / 1e6:.3f} MB / {after.messages} msgs (ratio {after.bytes / max(before.bytes, 1):.3f}); "
              f"{len(arch.archived)} bundles; evicted through {report.get('evicted_through')}, "
              f"the running execution holds from {report['active_first_seq']}")  # fmt: skip
        proj.close()
    finally:
        if proc is not None:
            proc.kill()
        for name in (p.events_stream, p.commands_stream, p.dlq_stream, p.archive_ack_stream):
            try:
                client.call(client.js.delete_stream(name))
            except Exception:  # noqa: BLE001, S110 - never created
                pass
        client.close()
        with psycopg.connect(pg_db, autocommit=True) as conn:
            for s in (schema, pg_schema):
                conn.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')
        import shutil

        shutil.rmtree(payload, ignore_errors=True)


if __name__ == "__main__":
    main()
