"""Fact export throughput: 1M synthetic NoETL events -> ClickHouse facts (embedded chdb).

Measured in one process, best of N rounds each (the machine is shared):
- facts:      FactWriter.write_batch(events) — transform + Arrow + insert_arrow into the fact tables;
- raw events: insert_arrow of the same 1M events as rows (envelope columns, data as JSON text),
              prebuilt, into one MergeTree table — the primary baseline (targets: ratio >= 0.5 and
              >= 100k events/s);
- raw facts:  insert_arrow of the prebuilt fact rows into the same fact tables (their materialized
              view included) — shows the share of the transform itself.
Also: the exporter end to end (SQLite event log tail -> facts, cursor stored) on a smaller log.

    .venv/bin/python -m benchmarks.bench_facts [--events N] [--rounds R]
    .venv/bin/python -m benchmarks.bench_facts --only allocation [--allocation-rows 10000000]

Allocation (issue 18.2): N synthetic task attempts generated inside ClickHouse with numbers()
(50 tenants, 400 playbooks, 8 steps each, 90 days, measured-usage columns filled) are inserted
into task_fact with their request rows and usage lines, the priced table and the usage counters are
built from the deduplicated facts (refresh_rollups), then the dashboard's queries are timed against
the rollups and, for comparison, the raw facts.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from itertools import islice
from pathlib import Path

import pyarrow as pa

from noetl_analytics.exporter import FactExporter
from noetl_analytics.facts import FactBuilder, FactWriter, gc_paused
from noetl_analytics.store import FactsStore, close_all
from noetl_analytics.synthetic import SyntheticSpec, generate
from noetl_dagster.storage.events import SqliteEventStore

RAW_EVENTS_DDL = """CREATE TABLE {db}.event_raw (
    event_id String, sequence UInt64, execution_id String, parent_execution_id String,
    ts DateTime64(6, 'UTC'), source LowCardinality(String), name LowCardinality(String),
    entity LowCardinality(String), entity_id String, status LowCardinality(String),
    step LowCardinality(String), step_run_id String, task_run_id String, loop_id String,
    iteration Nullable(Int64), attempt Nullable(UInt32), tenant_id LowCardinality(String),
    project_id LowCardinality(String), schema_version LowCardinality(String), data String
) ENGINE = MergeTree ORDER BY (tenant_id, execution_id, sequence)"""


def raw_event_table(events: list) -> pa.Table:
    cols = {
        "event_id": [e.event_id for e in events],
        "sequence": [e.sequence for e in events],
        "execution_id": [e.execution_id for e in events],
        "parent_execution_id": [e.parent_execution_id for e in events],
        "ts": pa.array([e.timestamp for e in events]).cast(pa.timestamp("us", tz="UTC")),
        "source": [e.source for e in events],
        "name": [e.name for e in events],
        "entity": [e.entity for e in events],
        "entity_id": [e.entity_id for e in events],
        "status": [e.status for e in events],
        "step": [e.step for e in events],
        "step_run_id": [e.step_run_id for e in events],
        "task_run_id": [e.task_run_id for e in events],
        "loop_id": [e.loop_id for e in events],
        "iteration": pa.array([e.iteration for e in events], pa.int64()),
        "attempt": pa.array([e.attempt for e in events], pa.uint32()),
        "tenant_id": [e.tenant_id for e in events],
        "project_id": [e.project_id for e in events],
        "schema_version": [e.schema_version for e in events],
        "data": [json.dumps(e.data, separators=(",", ":")) for e in events],
    }
    return pa.table(cols)


def best(values: list[float]) -> float:
    return min(values)


ALLOC_INSERT = """INSERT INTO $db.task_fact (event_id, ts, tenant_id, project_id, execution_id, step, step_run_id,
    task_run_id, task, kind, attempt, status, duration_ms, playbook, cpu_ms, mem_bytes, mem_peak_bytes, bytes_read,
    bytes_written, net_in_bytes, net_out_bytes, egress_bytes, rows_moved, units)
SELECT toString(number), now64(6) - toIntervalSecond((number * 7919) % (90 * 86400)), concat('tenant-', toString(number % 50)),
    concat('project-', toString(number % 7)), concat('exec-', toString(intDiv(number, 12))),
    concat('step-', toString(number % 8)), toString(intDiv(number, 3)), toString(number), 'task', 'python',
    1 + (number % 97 = 0), if(number % 53 = 0, 'error', 'ok'), 5 + (cityHash64(number) % 5000) / 10.0,
    concat('playbooks/pb-', toString(number % 400)), (cityHash64(number, 1) % 4000) / 10.0,
    cityHash64(number, 2) % 200000000, 300000000, cityHash64(number, 3) % 1000000, cityHash64(number, 4) % 2000000,
    cityHash64(number, 5) % 100000, cityHash64(number, 6) % 10000, if(number % 10 = 0, cityHash64(number, 6) % 10000, 0),
    cityHash64(number, 7) % 5000, 1
FROM numbers({n:UInt64})"""

ALLOC_QUERIES = {
    "cost per tenant per day, 30 days (rollup)": (
        "SELECT tenant, day, sum(cost) FROM $db.allocation_cost_day WHERE day >= today() - 30 GROUP BY tenant, day"
    ),
    "top 10 playbooks of one tenant, 30 days (rollup)": (
        "SELECT playbook, sum(cost) AS c FROM $db.allocation_cost_day WHERE tenant = 'tenant-7' AND day >= today() - 30"
        " GROUP BY playbook ORDER BY c DESC LIMIT 10"
    ),
    "drill-down tenant -> playbook -> steps (rollup)": (
        "SELECT step, sum(cost), sum(attempts), sum(failed_attempts) / sum(attempts), sum(retries) / sum(attempts)"
        " FROM $db.allocation_cost_day WHERE tenant = 'tenant-7' AND playbook = 'playbooks/pb-207' GROUP BY step"
    ),
    "idle / unallocated per day (rollup)": "SELECT * FROM $db.allocation_summary_day ORDER BY day",
    "drill-down step -> executions (raw task_fact)": (
        "SELECT execution_id, sum(cpu_ms) / 3.6e6 AS cpu_h, count() FROM $db.task_fact WHERE tenant_id = 'tenant-7'"
        " AND playbook = 'playbooks/pb-207' AND step = 'step-7' GROUP BY execution_id ORDER BY cpu_h DESC LIMIT 20"
    ),
    "cost per tenant per day, 30 days (raw task_fact, for comparison)": (
        "SELECT tenant_id, toDate(ts) AS day, sum(coalesce(cpu_ms, 0)) / 3.6e6 * 0.031611 FROM $db.task_fact"
        " WHERE ts >= now() - INTERVAL 30 DAY GROUP BY tenant_id, day"
    ),
}


def bench_allocation(rows: int, rounds: int) -> None:
    from noetl_analytics.demo_history import derive_usage
    from noetl_analytics.pricing import PriceTable
    from noetl_analytics.rollups import refresh_rollups

    work = Path(tempfile.mkdtemp(prefix="bench_alloc_"))
    store = FactsStore(f"chdb://{work / 'facts'}", database="alloc")
    t = time.perf_counter()
    step = 2_000_000
    for start in range(0, rows, step):
        store.command(
            ALLOC_INSERT.replace(
                "FROM numbers({n:UInt64})", f"FROM numbers({start}, {min(step, rows - start)})"
            )
        )
    derive_usage(store, "tenant-")
    ins = time.perf_counter() - t
    _, c = store.query("SELECT count() FROM $db.task_fact")
    print(
        f"inserted {c[0][0]:,} task facts with their usage lines in {ins:.1f}s ({c[0][0] / ins:,.0f} rows/s)"
    )
    t = time.perf_counter()
    refresh_rollups(store, PriceTable.load())
    _, r = store.query("SELECT count() FROM $db.cost_line_day")
    print(f"priced table built from the facts: {r[0][0]:,} rows in {time.perf_counter() - t:.1f}s")
    for name, sql in ALLOC_QUERIES.items():
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            _, out = store.query(sql)
            times.append(time.perf_counter() - t)
        print(
            f"{best(times) * 1000:8.1f} ms  {name}  ({len(out)} rows; rounds: {', '.join(f'{x * 1000:.0f}' for x in times)})"
        )
    close_all()
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=250_000, help="events per Arrow batch")
    ap.add_argument("--exporter-events", type=int, default=100_000)
    ap.add_argument("--only", choices=["export", "allocation"], default=None)
    ap.add_argument("--allocation-rows", type=int, default=10_000_000)
    args = ap.parse_args()
    if args.only != "export":
        bench_allocation(args.allocation_rows, args.rounds)
        if args.only == "allocation":
            return

    t0 = time.perf_counter()
    spec = SyntheticSpec(executions=args.events // 75 + 1, steps=6)
    events = list(islice(generate(spec), args.events))
    print(f"generated {len(events):,} events in {time.perf_counter() - t0:.1f}s (not timed)")
    with gc_paused():
        builder = FactBuilder()
        builder.add(events)
        fact_tables = builder.tables()
    fact_rows = sum(t.num_rows for t in fact_tables.values())
    raw_events = raw_event_table(events)
    print(f"{fact_rows:,} fact rows: " + ", ".join(f"{k}={v.num_rows:,}" for k, v in fact_tables.items()))

    work = Path(tempfile.mkdtemp(prefix="bench_facts_"))
    url = f"chdb://{work / 'facts'}"
    ours, raw_ev, raw_facts = [], [], []
    for r in range(args.rounds):
        # fresh databases every round so no round inserts into another's rows
        store_raw_ev = FactsStore(url, database=f"raw_events_{r}", migrate=False)
        store_raw_ev.command(f"CREATE DATABASE IF NOT EXISTS raw_events_{r}")
        store_raw_ev.command(RAW_EVENTS_DDL.format(db=f"raw_events_{r}"))
        t = time.perf_counter()
        store_raw_ev.client.insert_arrow(f"raw_events_{r}.event_raw", raw_events)
        raw_ev.append(time.perf_counter() - t)

        store_raw_facts = FactsStore(url, database=f"raw_facts_{r}")
        t = time.perf_counter()
        for table, data in fact_tables.items():
            store_raw_facts.insert_arrow(table, data)
        raw_facts.append(time.perf_counter() - t)

        store_facts = FactsStore(url, database=f"facts_{r}")
        t = time.perf_counter()
        counts = FactWriter(store_facts, batch_events=args.batch).write_batch(events)
        ours.append(time.perf_counter() - t)
        assert sum(counts.values()) == fact_rows, (counts, fact_rows)
        print(
            f"round {r + 1}: facts {ours[-1]:.2f}s  raw events {raw_ev[-1]:.2f}s  raw fact rows {raw_facts[-1]:.2f}s"
        )

    n = len(events)
    t_ours, t_raw_ev, t_raw_facts = best(ours), best(raw_ev), best(raw_facts)
    print()
    print(f"facts export:              {n / t_ours:>12,.0f} events/s  ({t_ours:.2f}s for {n:,} events)")
    print(f"raw insert_arrow (events): {n / t_raw_ev:>12,.0f} events/s  ({t_raw_ev:.2f}s)")
    print(
        f"raw insert_arrow (facts):  {n / t_raw_facts:>12,.0f} events/s  ({t_raw_facts:.2f}s, {fact_rows:,} rows)"
    )
    ratio = t_raw_ev / t_ours
    print(
        f"ratio facts / raw events:  {ratio:.2f}  (target >= 0.5; >= 100k events/s: {'yes' if n / t_ours >= 1e5 else 'NO'})"
    )
    print(f"ratio facts / raw facts:   {t_raw_facts / t_ours:.2f}  (share of time spent inserting)")

    # end to end: SQLite event log -> exporter (cursor in ClickHouse) -> facts
    m = min(args.exporter_events, n)
    log = SqliteEventStore(work / "events.db")
    log.append(events[:m])
    store = FactsStore(url, database="exporter")
    t = time.perf_counter()
    report = FactExporter(store, log, batch_events=20_000).export()
    dt = time.perf_counter() - t
    print(
        f"exporter (SQLite tail -> facts): {report.events / dt:,.0f} events/s for {report.events:,} events,"
        f" lag after: {report.lag_events}"
    )
    log.close()
    close_all()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
