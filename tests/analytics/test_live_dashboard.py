"""Live dashboards on the embedded store (issue 43 item 2), with real processes and real chdb.

A ``dashboard serve`` subprocess owns the embedded facts store; a playbook runs; its facts get
there through ``facts export`` (another process) or the Dagster export run (a real run of
``noetl_facts_export_job``, launched from a real sensor tick), both handed to the owner, or
through the owner's own export loop, and the served ``/api/data`` shows the run. The freshness
(seconds from the execution's end to its row in the served dashboard) is printed (pytest -s).
Another process that needs the store is told who holds it (pid, kind, since); an owner file
left by a dead process is taken over.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import httpx
import pytest

from noetl_analytics import store_owner
from noetl_analytics.export_handoff import export_facts
from noetl_analytics.store import FactsStore, FactsStoreHeld, close_all
from noetl_dagster.commands.facts_demo import run_playbooks
from noetl_dagster.sensors.facts import EXPORT_JOB, RESOURCE_KEY, FactsStoreResource, build_facts_definitions
from noetl_dagster.storage.events import SqliteEventStore
from noetl_registry.service import Registry

PLAYBOOK = Path(__file__).parent / "playbooks" / "facts_refs.yaml"
CLI = [sys.executable, "-m", "noetl_dagster.commands.main"]
ENV = {**os.environ, "NOETL_DAGSTER_CHDB_WAIT": "1"}  # tests/conftest.py set PYTHONPATH
FRESHNESS_BOUND = 60.0  # issue 43: a run shows within a minute of its end

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A `dashboard serve` subprocess over ``home`` (facts under home/facts, events in home/events.db)."""

    def __init__(self, home: Path, export_every: float):
        self.home, self.port = home, _free_port()
        reg = Registry(f"sqlite:///{home / 'registry.db'}")
        self.key = reg.create_api_key("platform")[1]
        args = ["dashboard", "serve", "--data-dir", str(home), "--registry", f"sqlite:///{home / 'registry.db'}",
                "--admin-tenant", "platform", "--port", str(self.port), "--warm", "0",
                "--export-every", str(export_every)]  # fmt: skip
        self.proc = subprocess.Popen([*CLI, *args], env=ENV, cwd=home, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()
            try:
                if httpx.get(f"{self.url}/login", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        raise AssertionError("dashboard serve did not answer within 120 s")

    def tenants(self) -> set[str]:
        answer = httpx.get(
            f"{self.url}/api/data", headers={"Authorization": f"Bearer {self.key}"}, timeout=30
        )
        assert answer.status_code == 200, answer.text
        return {row["tenant"] for row in answer.json()["rows"]}

    def freshness(self, tenant: str, ended: float) -> float:
        """Seconds from ``ended`` until the served data holds ``tenant``'s rows."""
        while time.time() - ended < FRESHNESS_BOUND:
            if tenant in self.tenants():
                return time.time() - ended
            time.sleep(0.2)
        raise AssertionError(f"{tenant} not in the served dashboard {FRESHNESS_BOUND:.0f} s after its run")

    def stop(self) -> tuple[str, str]:
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.communicate()


def _run(home: Path, tenant: str) -> float:
    """Run the playbook for ``tenant`` into home/events.db; the wall time it ended."""
    log = SqliteEventStore(home / "events.db")
    try:
        results = run_playbooks([PLAYBOOK], home, tenants=((tenant, "live"),), event_store=log)
    finally:
        log.close()
    assert not isinstance(results[0][3], Exception), results
    return time.time()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    home = tmp_path_factory.mktemp("live")
    close_all()  # the subprocess owns the store; this process must not hold it
    server = Served(home, export_every=0)  # no loop: every export below is handed over
    yield server
    out, err = server.stop()
    assert server.proc.returncode in (0, -signal.SIGINT), (out, err)


def test_facts_export_hands_its_export_to_the_serving_dashboard(served):
    """Regression: `facts export` failed after 11 s while `dashboard serve` ran, blaming a sensor."""
    assert "live-cli" not in served.tenants()
    ended = _run(served.home, "live-cli")
    out = subprocess.run([*CLI, "facts", "export", "--data-dir", str(served.home), "--json"], env=ENV,
                         cwd=served.home, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["events"] > 0
    assert report["exported_by"].startswith(
        f"pid {served.proc.pid} (dashboard serve on 127.0.0.1:{served.port}"
    )
    seconds = served.freshness("live-cli", ended)
    print(f"freshness via facts export (CLI process start included): {seconds:.2f} s")


def test_the_dagster_export_run_hands_off_to_the_serving_dashboard(served):
    ended = _run(served.home, "live-dagster")
    resource = FactsStoreResource(data_dir=str(served.home))
    defs = build_facts_definitions(resource=resource)
    with dg.instance_for_test() as instance:
        ctx = dg.build_sensor_context(instance=instance, resources={RESOURCE_KEY: resource}, cursor="0")
        tick = defs.resolve_sensor_def("noetl_facts_exporter")(ctx)
        assert isinstance(tick, dg.SensorResult) and len(tick.run_requests or []) == 1
        result = defs.resolve_job_def(EXPORT_JOB).execute_in_process(
            instance=instance, tags=tick.run_requests[0].tags
        )
    assert result.success
    meta = result.get_asset_materialization_events()[0].materialization.metadata
    assert meta["exported_by"].value.startswith(f"pid {served.proc.pid} (dashboard serve")
    assert meta["events_exported"].value > 0
    seconds = served.freshness("live-dagster", ended)
    print(f"freshness via the Dagster export run (sensor tick + run): {seconds:.2f} s")


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args, "--data-dir", str(home)], env=ENV, cwd=home, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def test_query_and_refresh_run_in_the_serving_dashboard(served):
    out = _cli(served.home, "facts", "query", "SELECT count() AS n FROM $db.export_cursor", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)[0]["n"] >= 0
    out = _cli(served.home, "facts", "query", "TRUNCATE TABLE $db.task_fact")  # read-only there too
    assert out.returncode == 2 and "facts query is read-only" in out.stderr, out.stderr
    out = _cli(served.home, "facts", "refresh", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["rows"] > 0


def test_the_dagster_rollups_run_in_the_serving_dashboard(served):
    resource = FactsStoreResource(data_dir=str(served.home))
    defs = build_facts_definitions(resource=resource)
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("noetl_cost_rollups_job").execute_in_process(instance=instance)
    assert result.success
    metadata = {
        e.materialization.asset_key.to_user_string(): e.materialization.metadata
        for e in result.get_asset_materialization_events()
    }
    assert metadata["noetl/cost_rollups"]["rows"].value > 0
    assert metadata["noetl/rollups/cost_line_day"]["rows"].value > 0


def test_another_command_is_told_which_process_holds_the_store(served):
    out = _cli(served.home, "facts", "focus-export", "--all-tenants", "--out", str(served.home / "focus.csv"))
    assert out.returncode == 2
    assert (
        f"held by pid {served.proc.pid} (dashboard serve on 127.0.0.1:{served.port}, since 20" in out.stderr
    )
    assert "a running Dagster sensor" not in out.stderr  # the old message blamed the wrong process
    holder = store_owner.read_holder(served.home / "facts")
    assert holder is not None and holder.pid == served.proc.pid and holder.endpoint


def test_a_forged_hand_off_is_refused(served):
    holder = store_owner.read_holder(served.home / "facts")
    assert holder is not None and holder.endpoint
    answer = httpx.post(f"{holder.endpoint}/export", json={}, headers={"Authorization": "Bearer guess"})
    assert answer.status_code == 401


def test_the_serving_dashboard_exports_on_its_own_cadence(tmp_path):
    close_all()
    server = Served(tmp_path, export_every=1)
    try:
        ended = _run(tmp_path, "live-loop")
        seconds = server.freshness("live-loop", ended)
        print(f"freshness via the dashboard's own export loop (every 1 s): {seconds:.2f} s")
    finally:
        server.stop()


HOLD = """
import sys, time
from noetl_analytics.store import FactsStore
from noetl_analytics.store_owner import set_process_kind
set_process_kind("facts export (test holder)")
FactsStore("chdb://" + sys.argv[1])
print("held", flush=True)
time.sleep(600)
"""


def _holder(path: Path) -> subprocess.Popen:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], env=ENV, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def test_an_export_is_told_which_exporter_holds_the_store(tmp_path):
    close_all()
    child = _holder(tmp_path / "facts")
    try:
        SqliteEventStore(tmp_path / "events.db").close()
        out = subprocess.run([*CLI, "facts", "export", "--data-dir", str(tmp_path)], env=ENV, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert out.returncode == 2
        assert f"held by pid {child.pid} (facts export (test holder), since 20" in out.stderr
        assert "wait for it to finish or stop it" in out.stderr
    finally:
        child.kill()
        child.wait()


def test_an_owner_file_left_by_a_dead_process_is_taken_over(tmp_path, monkeypatch):
    close_all()
    monkeypatch.setenv("NOETL_DAGSTER_CHDB_WAIT", "1")
    path = tmp_path / "facts"
    child = _holder(path)
    held = store_owner.read_holder(path)
    assert held is not None and held.pid == child.pid
    with pytest.raises(FactsStoreHeld, match=rf"held by pid {child.pid} \(facts export \(test holder\)"):
        FactsStore(f"chdb://{path}")
    child.send_signal(signal.SIGKILL)  # no clean-up: its owner file stays behind
    child.wait()
    assert json.loads(store_owner.owner_file(path).read_text())["pid"] == child.pid
    assert store_owner.read_holder(path) is None  # the kernel dropped its lock: stale
    store = FactsStore(f"chdb://{path}")
    try:
        assert store.scalar("SELECT 1") == 1
        assert json.loads(store_owner.owner_file(path).read_text())["pid"] == os.getpid()
    finally:
        close_all()
    assert store_owner.read_holder(path) is None  # released with the store


def test_the_budget_sensor_is_evaluated_by_the_serving_dashboard(served):
    _run(served.home, "live-budget")
    assert export_facts(data_dir=str(served.home))["exported_by"].startswith(f"pid {served.proc.pid} ")
    budgets = served.home / "budgets.yaml"
    budgets.write_text(
        "budgets:\n  - {tenant: live-budget, monthly: 1.0e-12}\n  - {tenant: live-nobody, monthly: 5}\n"
    )
    resource = FactsStoreResource(data_dir=str(served.home), budgets=str(budgets))
    defs = build_facts_definitions(resource=resource, rollup_cron=None)
    with dg.instance_for_test() as instance:
        ctx = dg.build_sensor_context(instance=instance, resources={RESOURCE_KEY: resource})
        result = defs.resolve_sensor_def("noetl_cost_budgets")(ctx)
    assert isinstance(result, dg.SensorResult), result  # a SkipReason "facts store busy" before
    assert [r.tags["noetl/budget"] for r in result.run_requests] == ["live-budget"]


def test_a_second_dashboard_on_the_same_store_names_the_first(served):
    registry = f"sqlite:///{served.home / 'registry.db'}"
    out = _cli(served.home, "dashboard", "serve", "--registry", registry, "--port", str(_free_port()))
    assert out.returncode == 2, out.stdout
    assert (
        f"held by pid {served.proc.pid} (dashboard serve on 127.0.0.1:{served.port}, since 20" in out.stderr
    )
