"""Where the Postgres event store's client CPU goes (issue 35), measured in one process.

The machine is shared (2 cores, other work running), so wall times and even CPU times drift from
one minute to the next. Every row here is measured in the same process, rows interleaved round by
round, and the figures are CPU seconds (``time.process_time``) and counts:

* the split of a five-step execution's client CPU: the engine with a store that only numbers the
  events (no encoding, no database), + the append's encoding (``_Batch``), + the execution
  summary folded per flush (``_summarize``), and the real store (+ the statements and their waits);
* the same execution on this checkout's store and on ``--before-tree``'s ``postgres_events``
  module loaded next to it (``before_postgres_events``), so "against main" is the same process;
* what a blocking wait costs the client: ``SELECT 1`` against ``SELECT pg_sleep(x)`` for the
  statement's own latency (a sleeping client pays for the wake-up: the scheduler and cold caches,
  more the longer it slept and the busier the machine);
* the frontend messages per execution and per store open, counted on the wire (``pgwire``);
* opening a store (``PostgresEventStore(url).close()``): CPU and wire counts, both checkouts;
* ``--server``: the server's floor. The append statements of a ``--threads``-thread run (group commit
  rounds as they form) are captured and replayed one after the other on one connection, against the
  same rows written the cheapest way Postgres takes them (``COPY`` into a copy of the event table:
  same columns, keys and indexes; one transaction per round), the server backend's CPU read from
  ``/proc/PID/schedstat`` (ns): what the server needs per execution for these rows, whatever the client.

Run: ``python -m benchmarks.bench_pg_client [--before-tree DIR] [--rounds 5] [--executions 100]``
or ``python -m benchmarks.bench_pg_client --server [--threads 24] [--seconds 6] [--rounds 3]``
(needs Postgres at 127.0.0.1:5432).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import yaml

from benchmarks.bench_throughput import PLAYBOOK
from benchmarks.pgwire import WireCounter

PG = os.environ.get("NOETL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _before_module(tree: str) -> Any:
    """``noetl_dagster/storage/postgres_events.py`` of another checkout, imported next to this one's,
    with that checkout's execution summary cache (``engine/explain_summary.py``: when it writes)."""
    before = _load("before_postgres_events", Path(tree) / "noetl_dagster" / "storage" / "postgres_events.py")
    summary = _load("before_explain_summary", Path(tree) / "noetl_dagster" / "engine" / "explain_summary.py")
    before.SummaryCache = summary.SummaryCache
    return before


def _stand_ins(store: Any) -> dict[str, Any]:
    """Stores that stop part of the way: number only, + encode, + summary (the same pool and caches)."""
    from noetl_dagster.storage import postgres_events as pe

    class NumberOnly(type(store)):  # type: ignore[misc]
        def __init__(self, inner: Any):
            self.__dict__.update(inner.__dict__)
            self._n: dict[str, int] = {}

        def append(self, events):  # type: ignore[no-untyped-def]
            for e in events:
                self._n[e.execution_id] = e.sequence = self._n.get(e.execution_id, 0) + 1
            return list(events)

    class Encode(NumberOnly):
        def append(self, events):  # type: ignore[no-untyped-def]
            pe._Batch(events).params(1)
            return super().append(events)

    class EncodeSummary(NumberOnly):
        def append(self, events):  # type: ignore[no-untyped-def]
            pe._Batch(events).params(1)
            with self._pool.connection() as conn:
                self._summarize(conn, events)
            return super().append(events)

    return {"engine, events numbered only": NumberOnly(store), "+ encoding (_Batch)": Encode(store),
            "+ execution summary (_summarize)": EncodeSummary(store)}  # fmt: skip


def _cpu_per_call(fn: Callable[[], Any], n: int) -> float:
    c = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - c) / n * 1000


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--before-tree", help="another checkout (e.g. a worktree of main): its store, same process"
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--executions", type=int, default=100, help="per row and round")
    ap.add_argument(
        "--server", action="store_true", help="only the server's CPU floor (replayed rounds vs COPY)"
    )
    ap.add_argument("--threads", type=int, default=24, help="--server: threads of the captured run")
    ap.add_argument("--seconds", type=float, default=6.0, help="--server: seconds of the captured run")
    args = ap.parse_args(argv)
    if args.server:
        server_floor(args.threads, args.seconds, args.rounds)
        return
    from noetl_dagster.runners.local import run_playbook
    from noetl_dagster.storage.postgres_events import PostgresEventStore

    before = _before_module(args.before_tree) if args.before_tree else None
    tmp = Path(tempfile.mkdtemp(prefix="bench_pg_client_"))
    path = tmp / "five_steps.yaml"
    path.write_text(yaml.safe_dump(PLAYBOOK, sort_keys=False))
    schemas = []

    def url(tag: str) -> str:
        schemas.append(f"pgc_{tag}_{uuid.uuid4().hex[:8]}")
        return f"{PG}?schema={schemas[-1]}"

    print(
        f"load average {os.getloadavg()[0]:.1f}; {args.rounds} rounds x {args.executions} executions per row"
    )
    try:
        after = PostgresEventStore(url("after"))
        rows: dict[str, Any] = {**_stand_ins(after), "this checkout's store": after}
        if before is not None:
            rows["--before-tree's store"] = before.PostgresEventStore(url("before"))
        for store in rows.values():  # warm: imports, the prepared statement, caches
            for _ in range(10):
                run_playbook(path, event_store=store, data_dir=tmp)
        cpu: dict[str, list[float]] = {k: [] for k in rows}
        for _ in range(args.rounds):
            for label, store in rows.items():
                cpu[label].append(_cpu_per_call(lambda s=store: run_playbook(path, event_store=s, data_dir=tmp),
                                                args.executions))  # fmt: skip
        print("client CPU per five-step execution (median of rounds, ms):")
        for label, xs in cpu.items():
            print(f"  {label:36} {statistics.median(xs):7.3f}   rounds {[round(x, 2) for x in xs]}")
        _waits(after)
        for store in rows.values():
            if hasattr(store, "_n"):
                continue
            store.close()
        _wire(path, tmp, url, before)
        _opens(url, before, args.rounds)
    finally:
        with psycopg.connect(PG, autocommit=True) as c:
            for s in schemas:
                c.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')
    print(f"load average {os.getloadavg()[0]:.1f}")


def _waits(store: Any) -> None:
    """A blocking wait's client CPU: one statement that returns at once, then ones that sleep."""
    with store._pool.connection() as conn:
        w = time.perf_counter()
        one = _cpu_per_call(lambda: conn.execute("SELECT 1").fetchall(), 500)
        one_wall = (time.perf_counter() - w) / 500 * 1000
        print(f"a statement's client CPU by how long it blocks (load {os.getloadavg()[0]:.1f}):")
        print(f"  SELECT 1 (answered in {one_wall:.2f} ms)        {one * 1000:6.0f} us")
        for ms in (2, 5, 10):
            n = max(20, 400 // ms)
            c = _cpu_per_call(lambda ms=ms: conn.execute(f"SELECT pg_sleep({ms / 1000})").fetchall(), n)
            print(f"  SELECT pg_sleep({ms / 1000:<5}) (blocks {ms:2d} ms) {c * 1000:6.0f} us")


def _wire(path: Path, tmp: Path, url: Callable[[str], str], before: Any) -> None:
    from noetl_dagster.runners.local import run_playbook
    from noetl_dagster.storage.postgres_events import PostgresEventStore

    print("frontend messages per five-step execution (wire, after the first):")
    for label, cls in (
        ("this checkout", PostgresEventStore),
        ("before", getattr(before, "PostgresEventStore", None)),
    ):
        if cls is None:
            continue
        with WireCounter() as wc:
            store = cls(wc.url(url("wire")))
            run_playbook(path, event_store=store, data_dir=tmp)
            a = wc.snapshot()
            for _ in range(10):
                run_playbook(path, event_store=store, data_dir=tmp)
            d = wc.snapshot() - a
            store.close()
        print(f"  {label:14} round trips {d['round_trips'] / 10:4.1f}  statements prepared {d['P'] / 10:3.1f}  "
              f"executed {d['E'] / 10:4.1f}  simple queries {d['Q'] / 10:3.1f}  connections {d['connections'] / 10:3.1f}")  # fmt: skip


def _opens(url: Callable[[str], str], before: Any, rounds: int) -> None:
    from noetl_dagster.storage.postgres_events import PostgresEventStore

    classes = {"this checkout": PostgresEventStore}
    if before is not None:
        classes["before"] = before.PostgresEventStore
    print("opening a store whose schema is current (PostgresEventStore(url).close()):")
    urls = {k: url("open") for k in classes}
    for k, cls in classes.items():
        cls(urls[k]).close()
    cpu: dict[str, list[float]] = {k: [] for k in classes}
    for _ in range(rounds):
        for k, cls in classes.items():
            cpu[k].append(_cpu_per_call(lambda c=cls, u=urls[k]: c(u).close(), 10))
    for k, cls in classes.items():
        with WireCounter() as wc:
            cls(wc.url(urls[k])).close()
            d = wc.snapshot()
        print(f"  {k:14} client CPU {statistics.median(cpu[k]):6.2f} ms  connections {d['connections']}  "
              f"round trips {d['round_trips']} (simple queries {d['Q']}, extended {d['S']})")  # fmt: skip


# ---- the server's floor: the same rounds replayed, against the same rows by COPY -------------------

COPY_TABLE = """CREATE TABLE {t} (gid BIGSERIAL PRIMARY KEY, event_id TEXT NOT NULL UNIQUE,
    execution_id TEXT NOT NULL, sequence BIGINT NOT NULL, name TEXT NOT NULL, ts TEXT NOT NULL,
    body JSON NOT NULL, hash BYTEA, UNIQUE (execution_id, sequence))"""


def _capture_rounds(
    threads: int, seconds: float
) -> tuple[list[tuple[tuple[Any, ...], list[tuple[Any, ...]], int]], int]:
    """The group-commit rounds of a threaded run: (statement parameters, the rows as stored, flushes)."""
    import threading

    from noetl_dagster.runners.local import run_playbook
    from noetl_dagster.storage import postgres_events as pe

    tmp = Path(tempfile.mkdtemp(prefix="bench_pg_server_"))
    path = tmp / "five_steps.yaml"
    path.write_text(yaml.safe_dump(PLAYBOOK, sort_keys=False))
    schema = f"pgs_cap_{uuid.uuid4().hex[:8]}"
    store = pe.PostgresEventStore(f"{PG}?schema={schema}", pool_size=8)
    run_playbook(path, event_store=store, data_dir=tmp)
    rounds: list[tuple[tuple[Any, ...], list[tuple[Any, ...]], int]] = []
    statement, summarize, chain = store._append_one_statement, store._summarize, pe._chain
    seen: list[list[str]] = []
    chained: list[Any] = []

    def summarized(conn, events, guess=None):  # type: ignore[no-untyped-def]
        seen.append(out := summarize(conn, events, guess))
        return out

    def chain_recorded(batches, guess):  # type: ignore[no-untyped-def]
        chained.append(out := chain(batches, guess))
        return out

    pe._chain = chain_recorded  # type: ignore[assignment]

    def recorded(batches):  # type: ignore[no-untyped-def]
        params = pe._Batch.combine(batches).params(store._append_lock)
        got = statement(batches)
        pv, hashes, _heads = chained.pop()
        events = [(ev, tail) for b in batches for ev, tail in zip(b.events, b.tails, strict=True)]
        rows = [(ev.event_id, ev.execution_id, ev.sequence, ev.name, ev.timestamp,
                 f'{{"sequence":{ev.sequence},{tail}', bytes.fromhex(h))
                for (ev, tail), h in zip(events, hashes.split(pe.SEP), strict=True)]  # fmt: skip
        rounds.append(((params[0], *pv, *params[1:8], *seen.pop(), *params[8:], hashes), rows, len(batches)))
        return got

    store._summarize, store._append_one_statement = summarized, recorded  # type: ignore[method-assign]
    if store._group is not None:
        store._group._run_batch = recorded
    done = [0]

    def loop() -> None:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            run_playbook(path, event_store=store, data_dir=tmp)
            done[0] += 1

    ts = [threading.Thread(target=loop) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    store.close()
    with psycopg.connect(PG, autocommit=True) as c:
        c.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return rounds, done[0]


def _on_cpu(pid: int) -> float:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


def server_floor(threads: int, seconds: float, repeats: int) -> None:
    from noetl_dagster.storage.postgres_events import PostgresEventStore

    rounds, executions = _capture_rounds(threads, seconds)
    flushes = sum(r[2] for r in rounds)
    events = sum(len(r[1]) for r in rounds)
    print(f"captured {len(rounds)} rounds of a {threads}-thread run: {flushes} flushes "
          f"({flushes / len(rounds):.1f} a round), {events} events, ~{executions} executions; load {os.getloadavg()[0]:.1f}")  # fmt: skip
    cols = "event_id, execution_id, sequence, name, ts, body, hash"
    schemas: list[str] = []
    cpu: dict[str, list[float]] = {}
    try:
        for _ in range(repeats):  # fresh tables each repeat, variants interleaved round by round
            variants: dict[str, tuple[psycopg.Connection, Callable[[Any], Any]]] = {}
            for label, opts in (("append statement (the store's)", ""),
                                ("append statement, synchronous_commit=off", "?options=-c%20synchronous_commit%3Doff"),
                                ("COPY of the same rows, one transaction a round", "")):  # fmt: skip
                schemas.append(schema := f"pgs_{uuid.uuid4().hex[:8]}")
                conn = psycopg.connect(PG + opts, autocommit=True)
                if label.startswith("COPY"):
                    conn.execute(f'CREATE SCHEMA "{schema}"')
                    conn.execute(COPY_TABLE.format(t=f'"{schema}".ev'))

                    def run(r, conn=conn, schema=schema):  # type: ignore[no-untyped-def]
                        with (
                            conn.transaction(),
                            conn.cursor().copy(f'COPY "{schema}".ev ({cols}) FROM STDIN') as cp,
                        ):
                            for row in r[1]:
                                cp.write_row(row)
                else:
                    store = PostgresEventStore(f"{PG}?schema={schema}", group_commit=False)
                    sql_text = store._append_sql
                    store.close()

                    def run(r, conn=conn, sql_text=sql_text):  # type: ignore[no-untyped-def]
                        conn.execute(sql_text, r[0], prepare=True).fetchall()

                variants[label] = (conn, run)
            spent = dict.fromkeys(variants, 0.0)
            for r in rounds:
                for label, (conn, run) in variants.items():
                    pid = conn.info.backend_pid
                    c0 = _on_cpu(pid)
                    run(r)
                    spent[label] += _on_cpu(pid) - c0
            for label, (conn, _) in variants.items():
                cpu.setdefault(label, []).append(spent[label] / flushes * 7 * 1000)
                conn.close()
        print("server CPU per five-step execution (7 flushes, 39 events), median of repeats, ms:")
        for label, xs in cpu.items():
            print(f"  {label:48} {statistics.median(xs):6.3f}   repeats {[round(x, 3) for x in xs]}")
    finally:
        with psycopg.connect(PG, autocommit=True) as c:
            for s in schemas:
                c.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')


if __name__ == "__main__":
    main()
