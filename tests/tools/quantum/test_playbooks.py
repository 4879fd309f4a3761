"""The example playbooks through the local runner: sweep, variational cycle, QPU fallback with submit/poll/fetch."""

from __future__ import annotations

import pytest
from quantum_helpers import BELL, DEMO, EXAMPLES

from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.tools.quantum import quantum_tool


def _task_results(home, execution_id, task):
    store = open_event_store(None, data_dir=home)
    try:
        return [
            e.data["outcome"]
            for e in store.read(execution_id)
            if e.name == "task.done" and e.data.get("task") == task
        ]
    finally:
        store.close()


def test_parameter_sweep_aggregates_a_parallel_grid_and_records_provenance(home):
    r = run_playbook(EXAMPLES / "quantum_sweep.yaml", {"n_theta": 4, "n_phi": 3}, data_dir=home, **DEMO)
    assert r.status == "completed", r.to_json()
    agg = r.results["aggregate"]
    assert agg["points"] == 12 and r.results["sweep"]["stats"] == {"total": 12, "ok": 12, "failed": 0}
    assert agg["max_abs_error"] < agg["shot_noise_bound"]  # <Z0 Z1> matches cos(theta) cos(phi)
    # every point's provider job, seeds and transpiler settings are in the event log
    outcomes = _task_results(home, r.execution_id, "measure")
    assert len(outcomes) == 12
    seeds = sorted(o["result"]["metadata"]["seeds"]["simulator"] for o in outcomes)
    assert seeds == list(range(7, 19))
    assert len({o["result"]["job_id"] for o in outcomes}) == 12
    assert all(o["result"]["metadata"]["tags"]["experiment"] == "ry_pair_sweep" for o in outcomes)
    # reproducible: the same workload gives the same aggregate, point for point
    again = run_playbook(EXAMPLES / "quantum_sweep.yaml", {"n_theta": 4, "n_phi": 3}, data_dir=home, **DEMO)
    assert again.results["aggregate"] == agg


def test_the_sweep_on_cirq_agrees_with_aer(home):
    a = run_playbook(EXAMPLES / "quantum_sweep.yaml", {"shots": 4000}, data_dir=home, **DEMO)
    c = run_playbook(
        EXAMPLES / "quantum_sweep.yaml", {"shots": 4000, "provider": "cirq"}, data_dir=home, **DEMO
    )
    assert c.status == "completed", c.to_json()
    for (t1, p1, z1), (t2, p2, z2) in zip(
        a.results["aggregate"]["grid"], c.results["aggregate"]["grid"], strict=True
    ):
        assert (t1, p1) == (t2, p2) and abs(z1 - z2) < 0.1


def test_vqe_cycle_converges_by_routing_on_the_loss_delta(home):
    r = run_playbook(EXAMPLES / "quantum_vqe.yaml", data_dir=home, **DEMO)
    assert r.status == "completed", r.to_json()
    rep = r.results["report"]
    assert rep["converged"] and rep["energy"] < -0.98 and abs(rep["theta"] - 3.14159) < 0.2
    assert (
        r.runs["evaluate"] == rep["iterations"] >= 3
    )  # the cycle ran until the delta fell under the tolerance
    assert len(_task_results(home, r.execution_id, "center")) == rep["iterations"]
    # a tolerance it cannot reach stops on max_iterations, not converged
    capped = run_playbook(
        EXAMPLES / "quantum_vqe.yaml", {"tolerance": 0.0, "max_iterations": 3}, data_dir=home, **DEMO
    )
    assert capped.runs["evaluate"] == 3 and not capped.results["report"]["converged"]


def test_fallback_to_the_simulator_when_the_queue_is_too_long(home):
    r = run_playbook(EXAMPLES / "quantum_fallback.yaml", data_dir=home, **DEMO)
    assert r.status == "completed", r.to_json()
    assert r.results["start"]["route"] == "simulator" and r.results["start"]["estimated_wait_seconds"] == 20.0
    assert "qpu_submit" not in r.runs
    assert r.results["report"]["route"] == "simulator" and r.results["report"]["ghz_fidelity_estimate"] == 1.0


def test_short_queue_goes_to_the_qpu_and_polls_through_queue_and_transient_errors(home):
    qpu = {"queue_depth": 3, "seconds_per_job": 0.15, "execution_seconds": 0.2, "transient_error_rate": 0.3,
           "error_seed": 1, "calibration_period_s": 60}  # fmt: skip
    r = run_playbook(EXAMPLES / "quantum_fallback.yaml", {"qpu": qpu}, data_dir=home, **DEMO)
    assert r.status == "completed", r.to_json()
    rep = r.results["report"]
    assert rep["route"] == "qpu" and rep["backend"] == "emulated_qpu_5q" and rep["cost_usd"] == 0.65
    assert rep["calibration"].startswith("emulated_qpu_5q-cal-")
    assert 0.85 < rep["ghz_fidelity_estimate"] < 1.0  # a noisy device
    polls = _task_results(home, r.execution_id, "poll")
    states = [o["result"]["status"] if o["status"] == "ok" else o["error"]["kind"] for o in polls]
    assert states[-1] == "done" and "queued" in states  # retried while queued (and on injected 503s)
    fetched = _task_results(home, r.execution_id, "fetch")[-1]["result"]
    assert fetched["job_id"] == r.results["qpu_submit"]["job_id"]
    assert fetched["metadata"]["queue_seconds"] > 0.4 and fetched["metadata"]["seeds"]["simulator"] == 99


def test_a_job_submitted_by_one_execution_is_fetched_by_another(home, tmp_path):
    """Resume by job id: a later execution (after a restart) picks the job up from the data dir."""
    ctx_sub = {"provider": "emulated_qpu", "operation": "submit", "circuit": BELL, "shots": 200, "seed": 4,
               "provider_options": {"queue_depth": 1, "seconds_per_job": 0.1}}  # fmt: skip
    pb1 = tmp_path / "submit.yaml"
    pb1.write_text(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: qsub, path: t/qsub}\nworkload: {}\n"
        "workflow:\n  - step: start\n    tool:\n      - submit: {kind: quantum, provider: emulated_qpu, operation: submit,"
        " circuit: {file: bell.qasm}, shots: 200, seed: 4, provider_options: {queue_depth: 1, seconds_per_job: 0.1}}\n"
    )
    (tmp_path / "bell.qasm").write_text(BELL)
    first = run_playbook(pb1, data_dir=home, **DEMO)
    job_id = first.results["start"]["job_id"]
    pb2 = tmp_path / "fetch.yaml"
    pb2.write_text(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: qfetch, path: t/qfetch}\nworkload: {job_id: x}\n"
        "workflow:\n  - step: start\n    tool:\n      - fetch:\n          kind: quantum\n          operation: result\n"
        "          job_id: '{{ workload.job_id }}'\n          spec:\n            policy:\n              rules:\n"
        "                - when: \"{{ outcome.status == 'error' and outcome.error.kind == 'not_ready' }}\"\n"
        "                  then: {do: retry, attempts: 100, delay: 0.05}\n"
    )
    second = run_playbook(pb2, {"job_id": job_id}, data_dir=home, **DEMO)
    assert second.status == "completed", second.to_json()
    assert (
        second.results["start"]["job_id"] == job_id and sum(second.results["start"]["counts"].values()) == 200
    )
    assert ctx_sub["shots"] == second.results["start"]["metadata"]["shots"]


def test_credentials_come_from_the_keychain_and_never_reach_the_log(ctx, tmp_path):
    from noetl_dagster.engine.keychain import FileProvider, Keychain

    (tmp_path / "c.json").write_text(
        '{"credentials": {"ibm_quantum": {"type": "ibm", "data": {"token": "tok-SECRET-123"}}}}'
    )
    ctx.keychain = Keychain([], providers=[FileProvider(tmp_path / "c.json")])
    r = quantum_tool({"circuit": BELL, "shots": 10, "seed": 1, "credential": "ibm_quantum"}, ctx)
    assert r["status"] == "done" and "tok-SECRET-123" in ctx.redacted
    assert "tok-SECRET-123" not in repr(r)


@pytest.mark.parametrize("name", ["quantum_sweep", "quantum_vqe", "quantum_fallback"])
def test_examples_validate(name):
    from noetl_dagster.dsl import load_playbook

    assert load_playbook(EXAMPLES / f"{name}.yaml").metadata.name == name


def test_a_bad_workload_fails_the_sweep_with_a_config_error(home):
    r = run_playbook(
        EXAMPLES / "quantum_sweep.yaml", {"n_theta": 2, "n_phi": 1, "shots": 0}, data_dir=home, **DEMO
    )
    assert r.status == "failed"
    sweep = r.results["sweep"]  # a loop keeps its results and stats when iterations fail (SEMANTICS §4)
    assert sweep["stats"] == {"total": 2, "ok": 0, "failed": 2}
    assert all(
        x["error"]["kind"] == "config_error" and "shots" in x["error"]["message"] for x in sweep["results"]
    )
    assert "aggregate" not in r.runs


def test_a_qpu_job_that_never_finishes_falls_back_to_the_simulator(home):
    # the poll gives up (attempts exhausted) long before a 1,000-second job finishes
    qpu = {"queue_depth": 0, "execution_seconds": 1000, "calibration_period_s": 60}
    r = run_playbook(
        EXAMPLES / "quantum_fallback.yaml", {"qpu": qpu, "poll_attempts": 5}, data_dir=home, **DEMO
    )
    assert r.status == "completed", r.to_json()
    assert r.results["start"]["route"] == "qpu" and r.results["report"]["route"] == "simulator"
    assert r.runs["qpu_fetch"] == 1 and r.runs["simulate"] == 1
    # the abandoned job was cancelled while running (so it is still charged, like a cloud QPU)
    assert r.results["qpu_cancel"] == {"job_status": "cancelled", "cost_usd": 0.65}
