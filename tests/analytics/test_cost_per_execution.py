"""The Python cost of an execution (analytics/noetl_analytics/pricing.py: usage_lines priced by PriceTable, what Dagster's
cost metadata uses) equals what the priced table (cost_line_day via allocation_cost_day, embedded chDB)
charges for the same events: the same usage lines, the same price version for each day."""

from __future__ import annotations

from collections import defaultdict
from datetime import date
from pathlib import Path

import pytest

from noetl_analytics.exporter import FactExporter
from noetl_analytics.pricing import (
    COMPONENTS,
    BilledRefs,
    Cost,
    PriceTable,
    UsageLine,
    cost_of_events,
    event_cost,
    utc_day,
)
from noetl_analytics.rollups import refresh_rollups
from noetl_dagster.engine.events import Event
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.events import SqliteEventStore

DAY1, DAY2 = "2026-03-10", "2026-03-11"  # the second day is priced by the second version
PRICES = PriceTable.from_dict(
    {
        "allocation": [
            {
                "version": "v-old",
                "valid_from": "2026-01-01",
                "cpu_core_hour": 0.031611,
                "ram_gb_hour": 0.004237,
                "egress_gb": 0.09,
                "shot": 0.0009,
                "qpu_second": 1.6,
            },
            {
                "version": "v-new",
                "valid_from": DAY2,
                "cpu_core_hour": 0.05,
                "ram_gb_hour": 0.01,
                "egress_gb": 0.12,
                "shot": 0.00145,
                "qpu_second": 1.2,
            },
        ]
    }  # fmt: skip
)


def _done(eid: str, step: str, attempt: int, ts: str, meta: dict, *, status: str = "ok", http: dict | None = None,
          tenant: str = "acme") -> Event:  # fmt: skip
    outcome: dict = {"status": status, "meta": {"attempt": attempt, **meta}}
    if status == "error":
        outcome["error"] = {"kind": "boom", "message": "failed"}
    if http is not None:
        outcome["http"] = http
    return Event("task.done", eid, {"task": f"{step}_t", "kind": "python", "outcome": outcome},
                 status="error" if status == "error" else "success", step=step, step_run_id=f"{eid}-{step}",
                 task_run_id=f"{eid}-{step}-{attempt}", attempt=attempt, tenant_id=tenant, project_id="p",
                 timestamp=ts)  # fmt: skip


def _attempts(eid: str) -> list[Event]:
    """Usage rows of every shape the facts writer reads: measured usage (CPU with child CPU, RAM delta
    x duration, egress), a retried attempt that failed, a tool's own cpu_ms and egress_bytes in meta,
    HTTP request bytes, quantum shots and QPU seconds, and an attempt recorded before usage was measured
    (runtime x units)."""
    t1, t2 = f"{DAY1}T23:59:58.5+00:00", f"{DAY2}T00:00:01.25+00:00"
    return [
        _done(
            eid,
            "load",
            1,
            t1,
            {
                "duration_ms": 812.5,
                "usage": {
                    "cpu_s": 0.61,
                    "child_cpu_s": 0.2,
                    "wall_s": 0.81,
                    "mem_delta_bytes": 734003200,
                    "mem_peak_bytes": 9e8,
                    "egress_bytes": 12_345_678,
                },
            },
            status="error",
        ),  # fmt: skip
        _done(
            eid,
            "load",
            2,
            t1,
            {
                "duration_ms": 433.25,
                "usage": {
                    "cpu_s": 0.4,
                    "mem_delta_bytes": 52428800,
                    "egress_bytes": 5_000_000,
                    "net_out_bytes": 6_000_000,
                },
            },
        ),  # fmt: skip
        _done(
            eid,
            "fetch",
            1,
            t1,
            {"duration_ms": 120.0, "usage": {"cpu_s": 0.01}},
            http={"request_bytes": 2_500_000},
        ),
        _done(
            eid,
            "tool_meta",
            1,
            t2,
            {
                "duration_ms": 3000.0,
                "cpu_ms": 2500.0,
                "egress_bytes": 7_000_000_000,
                "usage": {"cpu_s": 9.0, "mem_delta_bytes": 1_000_000_000, "egress_bytes": 1},
            },
        ),  # fmt: skip
        _done(
            eid,
            "qpu",
            1,
            t2,
            {
                "duration_ms": 2100.0,
                "usage": {"cpu_s": 0.05, "shots": 4000, "qpu_s": 1.75, "quantum_jobs": 1},
            },
        ),  # fmt: skip
        _done(eid, "legacy", 1, t2, {"duration_ms": 1500.0, "units": 2.0}),
        _done(eid, "legacy", 2, t2, {"duration_ms": 900.0}),
    ]


_SQL_COMPONENTS = ", ".join(f"{'cpu' if c == 'cpu' else c}_cost" for c in COMPONENTS)


def _sql_costs(store) -> dict[tuple[str, date], tuple]:  # noqa: ANN001
    _, rows = store.query(
        f"SELECT step, day, cost, {_SQL_COMPONENTS}, price_version, attempts FROM $db.allocation_cost_day"
        " ORDER BY step, day"
    )
    return {(r[0], r[1]): r[2:] for r in rows}


def _python_costs(events: list[Event], prices: PriceTable = PRICES) -> dict[tuple[str, date], Cost]:
    out: dict[tuple[str, date], Cost] = defaultdict(Cost)
    billed = BilledRefs()
    for ev in events:
        c = event_cost(prices, ev.name, ev.data, ev.timestamp, billed)
        if c.amounts:
            key = (ev.step or "", utc_day(ev.timestamp))
            out[key] = out[key] + c
    return dict(out)


def _export(store, log) -> None:  # noqa: ANN001
    FactExporter(store, log).export()
    refresh_rollups(store, PRICES)


def _assert_same(sql: dict, py: dict) -> None:
    assert set(sql) == set(py)
    for key, (cost, *parts, version, attempts) in sql.items():
        c = py[key]
        assert (c.price_version, c.attempts) == (version, attempts), key
        assert c.total == pytest.approx(cost, rel=1e-9, abs=1e-15), key
        for name, want in zip(COMPONENTS, parts, strict=True):
            assert getattr(c, name) == pytest.approx(want, rel=1e-9, abs=1e-15), (key, name)


def test_python_cost_equals_the_allocation_sql_for_every_usage_shape(facts_store, tmp_path):
    log = SqliteEventStore(tmp_path / "events.db")
    eid = "exec-cost-1"
    events = [Event("playbook.execution.requested", eid, {"playbook": "tests/cost"}, tenant_id="acme",
                    project_id="p", timestamp=f"{DAY1}T23:59:58+00:00"), *_attempts(eid)]  # fmt: skip
    try:
        log.append(events)
        _export(facts_store, log)
    finally:
        log.close()
    sql, py = _sql_costs(facts_store), _python_costs(events)
    _assert_same(sql, py)
    # every component is exercised, on both price versions
    assert {v[-2] for v in sql.values()} == {"v-old", "v-new"}
    for i, name in enumerate(COMPONENTS, start=1):  # cpu, ram, egress and quantum are exercised
        if name in ("cpu", "ram", "egress", "shot", "qpu"):
            assert sum(v[i] for v in sql.values()) > 0, name
    # the whole execution: one figure, from the step costs
    total = sum(cost_of_events(PRICES, events).values(), Cost())
    assert total.total == pytest.approx(
        facts_store.scalar("SELECT sum(cost) FROM $db.allocation_cost_day"), rel=1e-9
    )
    assert total.price_version == "v-new,v-old" and total.attempts == 7
    # hand-checked: the qpu attempt on DAY2 = 4000 shots x 0.00145 + 1.75 s x 1.2 (+ its tiny CPU)
    assert py[("qpu", date.fromisoformat(DAY2))].quantum == pytest.approx(4000 * 0.00145 + 1.75 * 1.2)
    # the tool's own cpu_ms and egress_bytes win over the measured usage, as in task_fact
    tm = py[("tool_meta", date.fromisoformat(DAY2))]
    assert tm.cpu == pytest.approx(2500 / 3.6e6 * 0.05) and tm.egress == pytest.approx(7 * 0.12)
    # before any version: no price, no version (the SQL's ASOF LEFT JOIN gives 0 and '')
    assert PRICES.line_cost(UsageLine("compute", "default", 1.0), date(2025, 12, 31)) == (0.0, "")


PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: cost_probe, path: tests/cost_probe}
workload: {n: 300000}
workflow:
  - step: start
    tool:
      - crunch:
          kind: python
          input: {n: "{{ workload.n }}"}
          code: |
            data = [i * i for i in range(n)]
            result = {"sum": sum(data) % 1000}
    next: {arcs: [{step: again}]}
  - step: again
    tool:
      - more:
          kind: python
          input: {n: "{{ workload.n }}"}
          code: |
            result = {"len": len(bytearray(n * 20))}
"""


def test_python_cost_equals_the_allocation_sql_on_a_real_run(facts_store, tmp_path):
    pb = tmp_path / "cost_probe.yaml"
    pb.write_text(PLAYBOOK)
    home = tmp_path / "home"
    r = run_playbook(pb, None, data_dir=home, tenant="acme", project="lab")
    assert r.status == "completed", r.to_json()
    log = SqliteEventStore(home / "events.db")
    try:
        events = log.read(r.execution_id)
        _export(facts_store, log)
    finally:
        log.close()
    done = [e for e in events if e.name == "task.done"]
    assert len(done) == 2 and all(e.data["outcome"]["meta"]["usage"]["cpu_s"] > 0 for e in done)
    sql, py = _sql_costs(facts_store), _python_costs(events)
    _assert_same(sql, py)
    # CPU is priced on every attempt (RAM only when RSS rose past its start during the task, which depends
    # on the process's earlier high-water mark: compared above, not required to be positive here)
    assert all(c.cpu > 0 for (step, _), c in py.items() if step)  # step '': the execution's platform line


def test_the_default_price_table_has_one_price_per_unit():
    """analytics/noetl_analytics/prices.yaml: one versioned table; list prices per shot (Braket, Rigetti Ankaa-3) and per
    QPU-second (IBM Pay-As-You-Go, USD 96/min); one CPU price (per core-hour) for tasks and the platform."""
    prices = PriceTable.load(
        Path(__file__).resolve().parents[2] / "analytics" / "noetl_analytics" / "prices.yaml"
    )
    v = prices.version_on(date(2026, 11, 25))
    assert (v.version, v.price("quantum", "shot"), v.price("quantum", "qpu_second")) == (
        "2026-01",
        0.0009,
        1.6,
    )
    assert v.price("compute", "default") == v.price("platform", "default") == 0.031611
    day = date(2026, 11, 25)
    job = sum(
        prices.line_cost(UsageLine("quantum", i, q), day)[0] for i, q in (("shot", 1000), ("qpu_second", 2.5))
    )
    assert job == pytest.approx(1000 * 0.0009 + 2.5 * 96 / 60)
