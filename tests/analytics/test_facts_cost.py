"""The tenant-cost model: a small fixture priced by hand, through the rollup views."""

from __future__ import annotations

from datetime import date

import pytest

from noetl_analytics.facts import FactWriter
from noetl_analytics.pricing import PriceConfigError, PriceTable
from noetl_analytics.rollups import refresh_rollups
from noetl_dagster.engine import events as E
from noetl_dagster.engine.events import Event

# per core-hour: 3.6 = 0.001 per CPU-second
VERSION = {
    "version": "v1",
    "valid_from": "2026-01-01",
    "compute": {"default": 3.6, "cpu.large": 7.2, "gpu.small": 36},
    "storage": {"default": 0.5, "s3": 0.25},
    "storage_months": 2,
    "egress": {"default": 0.1, "eu-west": 0.2},
    "call": {"http": 0.01},
}
PRICES = {"currency": "EUR", "worker_class_by_kind": {"duckdb": "cpu.large"}, "versions": [VERSION]}


def _ev(name, exe, ts, tenant, project, **kw):
    return Event(
        name, exe, timestamp=f"{ts}T10:00:00.000000+00:00", tenant_id=tenant, project_id=project, **kw
    )


def _task(exe, ts, tenant, project, kind, duration_ms, meta=None, attempt=1):
    outcome = {
        "status": "ok",
        "result": {"x": 1},
        "meta": {"attempt": attempt, "duration_ms": duration_ms, **(meta or {})},
    }
    return _ev(
        E.TASK_DONE,
        exe,
        ts,
        tenant,
        project,
        step="s",
        attempt=attempt,
        data={"task": f"t_{kind}", "kind": kind, "outcome": outcome, "directive": "continue"},
    )


def _ref(uri, size, store, producer=None):
    ref = {"uri": uri, "store": store, "format": "json", "size": size, "checksum": "sha256:00"}
    return {"$ref": ref if producer is None else {**ref, "execution_id": producer}}


def fixture_events() -> list[Event]:
    a, b, c = "exe-a", "exe-b", "exe-c"
    return [
        _ev(E.EXECUTION_REQUESTED, a, "2026-03-01", "acme", "p1", data={"playbook": "pb/a", "name": "a"}),
        _task(a, "2026-03-01", "acme", "p1", "python", 2000),  # 2 cpu-s x 0.001
        _task(a, "2026-03-01", "acme", "p1", "duckdb", 1000),  # cpu.large by kind: 1 x 0.002
        _task(
            a, "2026-03-01", "acme", "p1", "http", 500, {"egress_bytes": 3_000_000_000, "region": "eu-west"}
        ),
        _task(
            a,
            "2026-03-01",
            "acme",
            "p1",
            "http",
            500,
            {"worker_class": "gpu.small", "cpu_ms": 1500},
            attempt=2,
        ),
        _ev(
            E.STEP_DONE,
            a,
            "2026-03-01",
            "acme",
            "p1",
            step="s",
            data={"result": _ref("s3://bucket/a.json", 2_000_000_000, "s3"), "duration_ms": 4000},
        ),
        _ev(E.WORKFLOW_FINISHED, a, "2026-03-01", "acme", "p1", data={"status": "completed"}),
        _ev(E.EXECUTION_REQUESTED, b, "2026-03-02", "globex", "p2", data={"playbook": "pb/b", "name": "b"}),
        _task(b, "2026-03-02", "globex", "p2", "python", 4000, {"units": 2}),  # 8 cpu-s x 0.001
        _ev(
            E.STEP_DONE,
            b,
            "2026-03-02",
            "globex",
            "p2",
            step="s",
            data={"result": _ref("file:///p/b.json", 1_000_000_000, "file"), "duration_ms": 4000},
        ),
        _ev(
            E.STEP_DONE,
            b,
            "2026-03-02",
            "globex",
            "p2",
            step="t",
            data={"result": _ref("file:///p/b-out.json", 500_000_000, "file", producer=b), "duration_ms": 1},
        ),
        _ev(E.EXECUTION_REQUESTED, c, "2026-03-03", "globex", "p2", data={"playbook": "pb/b", "name": "b"}),
        _task(c, "2026-03-03", "globex", "p2", "python", 1000),
        # b's reference passed on as is (its producer, b, in it): billed to b only
        _ev(
            E.STEP_DONE,
            c,
            "2026-03-03",
            "globex",
            "p2",
            step="t",
            data={"result": _ref("file:///p/b-out.json", 500_000_000, "file", producer=b), "duration_ms": 1},
        ),
        # the user's path b wrote, named as c's result with no producer: c wrote it again (the next
        # run of the playbook re-writing its output), so c pays for it too, once (the one rule,
        # engine/usage_lines.BilledRefs: a storage act is billed to the execution that stored it;
        # the priced table billed a uri once across all executions before: here to b only)
        _ev(
            E.STEP_DONE,
            c,
            "2026-03-03",
            "globex",
            "p2",
            step="s",
            data={"result": _ref("file:///p/b.json", 1_000_000_000, "file"), "duration_ms": 1000},
        ),
    ]


# by hand:
ACME_0301 = {
    "compute": 0.002
    + 0.002
    + 0.0005
    + 0.015,  # python, duckdb as cpu.large, http, http on gpu.small (cpu_ms)
    "egress": 3 * 0.2,  # 3 GB to eu-west
    "call": 2 * 0.01,  # two http attempts
    "storage": 2 * 0.25 * 2,  # 2 GB on s3 for 2 months
}
# file has no price: the storage default; 1 GB (the user's path) + 0.5 GB (its own reference)
GLOBEX_0302 = {"compute": 8 * 0.001, "storage": (1 + 0.5) * 0.5 * 2}
GLOBEX_0303 = {"compute": 0.001, "storage": 1 * 0.5 * 2}  # its own write of the user's path only


def test_rollups_match_a_hand_computed_bill(facts_store):
    FactWriter(facts_store).write(fixture_events())
    report = refresh_rollups(facts_store, PriceTable.from_dict(PRICES))
    assert report.currency == "EUR" and report.tenants == 2
    by_day = {
        (t, d): amount
        for t, d, amount, _ in facts_store.query(
            "SELECT tenant_id, day, amount, currency FROM $db.cost_by_tenant_day ORDER BY tenant_id, day"
        )[1]
    }
    assert by_day == {
        ("acme", date(2026, 3, 1)): pytest.approx(sum(ACME_0301.values())),
        ("globex", date(2026, 3, 2)): pytest.approx(sum(GLOBEX_0302.values())),
        ("globex", date(2026, 3, 3)): pytest.approx(sum(GLOBEX_0303.values())),
    }
    lines = {
        (c, round(a, 9))
        for c, a in facts_store.query(
            "SELECT category, sum(amount) FROM $db.tenant_cost_fact WHERE tenant_id = 'acme' GROUP BY category"
        )[1]
    }
    assert lines == {(k, round(v, 9)) for k, v in ACME_0301.items()}
    pb = dict(
        facts_store.query("SELECT playbook, sum(amount) FROM $db.cost_by_playbook_day GROUP BY playbook")[1]
    )
    assert pb == {
        "pb/a": pytest.approx(sum(ACME_0301.values())),
        "pb/b": pytest.approx(sum(GLOBEX_0302.values()) + sum(GLOBEX_0303.values())),
    }
    proj = facts_store.query(
        "SELECT tenant_id, project_id, sum(amount) FROM $db.cost_by_project_day"
        " GROUP BY tenant_id, project_id ORDER BY tenant_id"
    )[1]
    assert [(t, p) for t, p, _ in proj] == [("acme", "p1"), ("globex", "p2")]


def test_refresh_reprices_and_reexport_changes_nothing(facts_store):
    events = fixture_events()
    FactWriter(facts_store).write(events)
    refresh_rollups(facts_store, PriceTable.from_dict(PRICES))
    first = facts_store.scalar("SELECT sum(amount) FROM $db.tenant_cost_fact")
    FactWriter(facts_store).write(events)  # re-export: the same event ids
    refresh_rollups(facts_store, PriceTable.from_dict(PRICES))
    assert facts_store.scalar("SELECT sum(amount) FROM $db.tenant_cost_fact") == pytest.approx(first)
    doubled = {**PRICES, "versions": [{**VERSION, "call": {"http": 0.02}}]}
    refresh_rollups(facts_store, PriceTable.from_dict(doubled))
    assert facts_store.scalar("SELECT sum(amount) FROM $db.tenant_cost_fact") == pytest.approx(first + 0.02)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"versions": [{"compute": {"default": -1}}]}, "compute.default must be a non-negative number"),
        ({"versions": [{"gpu": {"default": "cheap"}}]}, "gpu.default must be a non-negative number"),
        ({"versions": [{"gpu_hours": 1}]}, "unknown keys"),
        ({"versions": [{"storage_months": True}]}, "storage_months"),
        ({"compute": {"default": 0.5}}, "top-level price sections .* are no longer read"),
        ({"gpu_hours": {}}, "unknown price sections"),
        ({"versions": [{"version": "a"}, {"version": "a"}]}, "unique"),
        ({"distribution": {"idle": "sometimes"}}, "distribution.idle must be one of"),
        ({"worker_class_by_kind": {"http": 3}}, "worker_class_by_kind"),
        ([1, 2], "must be a mapping"),
    ],
)
def test_bad_price_tables_are_refused_with_a_clear_message(raw, message):
    with pytest.raises(PriceConfigError, match=message):
        PriceTable.from_dict(raw)


def test_price_table_files(tmp_path, monkeypatch):
    monkeypatch.delenv("NOETL_DAGSTER_PRICES", raising=False)
    assert PriceTable.load(data_dir=tmp_path).source.endswith(
        "noetl_analytics/prices.yaml"
    )  # packaged default
    own = tmp_path / "prices.yaml"
    own.write_text("currency: EUR\nversions: [{compute: 0.5}]\n")
    assert PriceTable.load(data_dir=tmp_path).currency == "EUR"  # <data dir>/prices.yaml wins
    with pytest.raises(PriceConfigError, match="not found"):
        PriceTable.load(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("compute: [unclosed")
    with pytest.raises(PriceConfigError, match="not valid YAML"):
        PriceTable.load(tmp_path / "bad.yaml")
