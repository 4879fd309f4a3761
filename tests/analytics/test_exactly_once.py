"""Exactly-once facts (issue 30.2): re-sending events never changes a rollup.

On the real runs' event log: a clean export is the reference; then, on another database, an export,
a lost (truncated) cursor and a second export; a crash between the facts insert and the cursor commit
(the batch's facts written, nothing else); and a real ``facts export`` subprocess killed with SIGKILL
in the middle of its batches, followed by a normal export. Every rollup (the priced table, the
tenant and allocation views, the usage counters) equals the clean export's, while every fact row
was inserted again (collapsed by ReplacingMergeTree + FINAL)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from facts_helpers import fact_totals

from noetl_analytics.exporter import FactExporter
from noetl_analytics.facts import FactWriter
from noetl_analytics.pricing import PriceTable
from noetl_analytics.store import FactsStore, close_all
from noetl_dagster.storage.events import SqliteEventStore

ROOT = Path(__file__).resolve().parents[2]
PRICES = {
    "currency": "USD",
    "worker_class_by_kind": {"duckdb": "cpu.large"},
    "distribution": {"idle": "proportional"},
    "versions": [{"version": "t", "valid_from": "2000-01-01", "compute": {"default": 36.0, "cpu.large": 72.0},
                  "ram": 3.6, "egress": 0.09, "storage": 0.023, "call": {"python": 0.0001}, "capacity": {"cores": 1}}],
}  # fmt: skip


def rollups(store: FactsStore) -> dict[str, object]:
    """Everything the cost views and dashboards read, rounded to 1e-9 USD (a hundredth of a millionth of a
    cent): the cluster summary is ~864 USD, where 1e-12 is past a double's 15-16 digits and the
    order ClickHouse sums in moved the last one (…427247 vs …427246 in one CI run)."""

    def q(sql: str) -> list[tuple]:
        return store.query(sql)[1]

    return {
        "cost_line_day": q("SELECT day, tenant_id, project_id, playbook, step, category, item, round(quantity, 9),"
                           " round(amount, 9) FROM $db.cost_line_day FINAL ORDER BY ALL"),
        "tenant_cost": q("SELECT tenant_id, round(sum(amount), 9) FROM $db.tenant_cost_fact GROUP BY tenant_id ORDER BY 1"),
        "allocation": q("SELECT tenant, playbook, step, day, attempts, failed_attempts, retries, executions,"
                        " round(cost, 9) FROM $db.allocation_cost_day ORDER BY ALL"),
        "summary": q("SELECT day, round(allocated, 9), round(idle, 9) FROM $db.allocation_summary_day ORDER BY day"),
        "facts": fact_totals(store),
    }  # fmt: skip


def _log(url: str) -> SqliteEventStore:
    return SqliteEventStore(url.removeprefix("sqlite:///"))


def _export(store: FactsStore, url: str, **kw) -> object:  # noqa: ANN003
    log = _log(url)
    try:
        return FactExporter(store, log, prices=PriceTable.from_dict(PRICES), **kw).export()
    finally:
        log.close()


def _parts(chdb: Path, database: str, table: str) -> int:
    """How many inserts a table received (the highest block number of its parts), read from the files:
    the exporting process holds the chdb path, so this process cannot open it."""
    meta = chdb / "metadata" / database / f"{table}.sql"
    if not meta.exists():
        return 0
    uuid = re.search(r"UUID '([0-9a-f-]+)'", meta.read_text()).group(1)
    blocks = [int(m.group(1)) for p in (chdb / "store" / uuid[:3] / uuid).glob("*_*_*_*")
              if (m := re.match(r".+_\d+_(\d+)_\d+$", p.name))]  # fmt: skip
    return max(blocks, default=0)


def test_reexport_lost_cursor_crash_and_kill9_leave_every_rollup_unchanged(real_runs, tmp_path):
    _, url, _ = real_runs
    chdb = tmp_path / "facts"
    clean = FactsStore(f"chdb://{chdb}", database="clean")
    first = _export(clean, url)
    want = rollups(clean)
    assert first.events > 100 and want["facts"]["task_attempts"] > 10 and want["cost_line_day"]

    # lost cursor: the second export re-sends every event
    chaos = FactsStore(f"chdb://{chdb}", database="chaos")
    _export(chaos, url)
    chaos.command("TRUNCATE TABLE $db.export_cursor")
    again = _export(chaos, url)
    assert again.events == first.events and again.cursor_before == 0
    assert again.rows == first.rows and again.rows["task_fact"] > 10  # every fact row was inserted again...
    assert rollups(chaos) == want  # ...and no rollup moved

    # a crash between the insert and the cursor commit: the batch's facts are in, the cursor is not
    log = _log(url)
    try:
        tail = [s.event for s in log.tail(first.cursor_after - 50, 50)]
    finally:
        log.close()
    FactWriter(chaos).write(tail)
    chaos.command("TRUNCATE TABLE $db.export_cursor")
    _export(chaos, url, batch_events=37)
    assert rollups(chaos) == want

    # kill -9 in the middle of a real `facts export` process (small batches: many insert/cursor rounds)
    close_all()  # the child needs the chdb path (one process per path)
    prices = tmp_path / "prices.yaml"
    prices.write_text(yaml.safe_dump(PRICES))
    env = dict(os.environ)  # tests/conftest.py put the repo and its three package folders on PYTHONPATH
    child = subprocess.Popen(
        [sys.executable, "-m", "noetl_dagster.commands.main", "facts", "export", "--clickhouse", f"chdb://{chdb}",
         "--database", "killed", "--events", url, "--batch", "3", "--prices", str(prices)],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while (
            _parts(chdb, "killed", "export_cursor") < 4
            and child.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.02)
        assert child.poll() is None, f"the export ended before it could be killed: {child.communicate()}"
        child.send_signal(signal.SIGKILL)
        assert child.wait(60) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    killed = FactsStore(f"chdb://{chdb}", database="killed")
    resumed_from = killed.scalar("SELECT argMax(cursor, updated_at) FROM $db.export_cursor")
    assert 0 < resumed_from < first.cursor_after  # it died mid-export
    after = _export(killed, url)
    assert after.cursor_before == resumed_from and after.cursor_after == first.cursor_after
    assert rollups(killed) == want
    print(
        f"events {first.events}, fact rows {first.rows}; re-inserted after the lost cursor {again.rows};"
        f" killed at cursor {resumed_from} of {first.cursor_after}, resumed {after.events} events;"
        f" tenant totals {want['tenant_cost']}"
    )  # for the record (pytest -s)
