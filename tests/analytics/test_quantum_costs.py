"""Quantum as its own price line (issue 20.4) on a real run: the emulated QPU job's shots and
device seconds flow from the quantum tool's usage into task_fact, the allocation rollup and the
versioned price table's per-shot and per-QPU-second prices (sql/V004__quantum_prices.sql)."""

from __future__ import annotations

from pathlib import Path

import pytest

from noetl_analytics.allocation import allocation_totals
from noetl_analytics.exporter import FactExporter
from noetl_analytics.pricing import PriceConfigError, PriceTable
from noetl_analytics.rollups import refresh_rollups
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store

EXAMPLES = Path(__file__).resolve().parents[2] / "example_project" / "playbooks"
# a short queue: the playbook routes to the emulated QPU (submit / poll / fetch)
QPU = {"queue_depth": 1, "seconds_per_job": 0.05, "execution_seconds": 0.3, "transient_error_rate": 0.0,
       "calibration_period_s": 60}  # fmt: skip
SHOT, QPU_SECOND = 0.00035, 1.6
pytestmark = pytest.mark.slow  # the QPU run (emulated queue and device time) takes ~5 s, shared by the tests


@pytest.fixture(scope="module")
def qpu_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("quantum_costs") / "home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NOETL_DAGSTER_HOME", str(home))
        r = run_playbook(
            EXAMPLES / "quantum_fallback.yaml", {"qpu": QPU}, data_dir=home, tenant="acme", project="lab"
        )
    assert r.status == "completed", r.to_json()
    assert r.results["report"]["route"] == "qpu"
    return home, r.execution_id


@pytest.fixture
def qpu_run(qpu_home, facts_store):
    home, execution_id = qpu_home
    log = open_event_store(None, data_dir=home)
    try:
        fetched = [e.data["outcome"]["result"] for e in log.read(execution_id)
                   if e.name == "task.done" and e.data.get("task") == "fetch" and e.data["outcome"]["status"] == "ok"]  # fmt: skip
        FactExporter(facts_store, log).export()
    finally:
        log.close()
    return facts_store, fetched[-1]["metadata"]


def test_shots_and_qpu_seconds_are_priced_as_their_own_line(qpu_run):
    store, meta = qpu_run
    shots, qpu_s = meta["shots"], meta["execution_seconds"]
    assert shots == 1000 and qpu_s >= 0.3  # the emulator ran the job for execution_seconds
    prices = PriceTable.from_dict(
        {
            "allocation": [
                {
                    "version": "q1",
                    "valid_from": "2000-01-01",
                    "cpu_core_hour": 0.03,
                    "shot": SHOT,
                    "qpu_second": QPU_SECOND,
                }
            ]
        }  # fmt: skip
    )
    refresh_rollups(store, prices)
    _, lines = store.query(
        "SELECT unit, sum(quantity), sum(cost), any(price_version) FROM $db.allocation_cost_line_day"
        " WHERE category = 'quantum' AND tenant = 'acme' GROUP BY unit ORDER BY unit"
    )
    assert [(u, v) for u, _, _, v in lines] == [("qpu_second", "q1"), ("shot", "q1")]
    (_, q_qpu, c_qpu, _), (_, q_shot, c_shot, _) = lines
    assert q_shot == shots and c_shot == pytest.approx(shots * SHOT)
    assert q_qpu == pytest.approx(qpu_s) and c_qpu == pytest.approx(qpu_s * QPU_SECOND)
    # once per job: the poll attempts and the submit carry none, the fetch carries it
    _, by_step = store.query("SELECT step, sum(shots) FROM $db.task_fact WHERE shots > 0 GROUP BY step")
    assert by_step == [("qpu_fetch", shots)]
    # the quantum line is part of the row's cost, next to compute
    _, rows = store.query(
        "SELECT sum(cost), sum(cpu_cost + ram_cost + egress_cost), sum(quantum_cost) FROM $db.allocation_cost_day"
    )
    total, classical, quantum = rows[0]
    assert quantum == pytest.approx(shots * SHOT + qpu_s * QPU_SECOND) and total == pytest.approx(
        classical + quantum
    )
    totals = allocation_totals(store)
    assert totals["shots"] == shots and totals["quantum_cost"] == pytest.approx(quantum)


def test_quantum_prices_are_versioned(qpu_run):
    store, meta = qpu_run
    _, days = store.query("SELECT max(toDate(ts)) FROM $db.task_fact")
    day = str(days[0][0])
    prices = PriceTable.from_dict(
        {
            "allocation": [
                {"version": "old", "valid_from": "2000-01-01", "shot": 1.0},
                {"version": "new", "valid_from": day, "shot": 0.001},
            ]
        }  # fmt: skip
    )
    refresh_rollups(store, prices)
    _, rows = store.query(
        "SELECT price_version, sum(cost) FROM $db.allocation_cost_line_day WHERE category = 'quantum'"
        " AND unit = 'shot' GROUP BY price_version"
    )
    assert rows == [("new", pytest.approx(meta["shots"] * 0.001))]
    with pytest.raises(PriceConfigError, match=r"versions\[0\]: shot must be a non-negative number"):
        PriceTable.from_dict({"allocation": [{"shot": -1}]})


def test_a_store_at_v003_upgrades_and_prices_quantum(qpu_home, tmp_path, monkeypatch):
    """An existing facts database (V001..V003, with a rebuild's staging table of the old shape) takes
    V004 and V005: the rollup's new column sits where the exact rebuild's positional INSERT puts it."""
    import shutil

    from noetl_analytics import schema
    from noetl_analytics.store import FactsStore, close_all

    old = tmp_path / "sql_v003"
    old.mkdir()
    for f in sorted(schema.SQL_DIR.glob("V00[123]__*.sql")):
        shutil.copy(f, old / f.name)
    url = f"chdb://{tmp_path / 'facts_v003'}"
    try:
        monkeypatch.setattr(schema, "SQL_DIR", old)
        store = FactsStore(url)
        assert store.migrate() == [] and schema.latest_version() == 3
        # what a V003 rebuild leaves behind: the staging table in the old shape
        store.command("CREATE TABLE $db.allocation_step_day_next AS $db.allocation_step_day")
        monkeypatch.setattr(schema, "SQL_DIR", schema.Path(schema.__file__).parent / "sql")
        assert store.migrate() == [4, 5, 6, 7]
        home, _ = qpu_home
        log = open_event_store(None, data_dir=home)
        try:
            FactExporter(store, log).export()  # the rollups of the exported days, rebuilt from the facts
        finally:
            log.close()
        _, mv = store.query("SELECT sum(shots), sum(qpu_seconds) FROM $db.allocation_step_day")
        refresh_rollups(store, PriceTable.from_dict({"allocation": {"shot": SHOT, "qpu_second": QPU_SECOND}}))
        _, exact = store.query(
            "SELECT sum(shots), sum(qpu_seconds), sum(quantum_cost) FROM $db.allocation_cost_day"
        )
        shots, qpu_s, cost = exact[0]
        assert shots == 1000 and qpu_s >= 0.3 and (shots, pytest.approx(qpu_s)) == (mv[0][0], mv[0][1])
        assert cost == pytest.approx(shots * SHOT + qpu_s * QPU_SECOND)
    finally:
        close_all()


def test_tenant_cost_lines_carry_quantum(qpu_run):
    """The tenant-cost model (V002 price lines, V005): `quantum` lines per shot and per QPU-second."""
    store, meta = qpu_run
    shots, qpu_s = meta["shots"], meta["execution_seconds"]
    refresh_rollups(
        store,
        PriceTable.from_dict(
            {"currency": "EUR", "versions": [{"quantum": {"shot": SHOT, "qpu_second": QPU_SECOND}}]}
        ),
    )
    _, rows = store.query(
        "SELECT item, unit, sum(quantity), any(unit_price), sum(amount), any(currency) FROM $db.tenant_cost_fact"
        " WHERE category = 'quantum' AND tenant_id = 'acme' GROUP BY item, unit ORDER BY item"
    )
    (i1, u1, q1, p1, a1, c1), (i2, u2, q2, p2, a2, c2) = rows
    assert (i1, u1, p1, c1) == ("qpu_second", "qpu_second", QPU_SECOND, "EUR") and (i2, u2, p2, c2) == (
        "shot",
        "shot",
        SHOT,
        "EUR",
    )
    assert q1 == pytest.approx(qpu_s) and a1 == pytest.approx(qpu_s * QPU_SECOND)
    assert q2 == shots and a2 == pytest.approx(shots * SHOT)
    with pytest.raises(
        PriceConfigError, match=r"quantum prices are per shot and per qpu_second, got \['gate'\]"
    ):
        PriceTable.from_dict({"versions": [{"quantum": {"gate": 1.0}}]})
