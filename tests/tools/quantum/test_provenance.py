"""Quantum provenance beyond the events: the OpenLineage run facet (noetl_quantum) of the step that ran
the jobs, built from a real sweep's event log."""

from __future__ import annotations

import json

import pytest
from openlineage.client.serde import Serde
from quantum_helpers import BELL, DEMO, EXAMPLES

from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store
from noetl_lineage.convert import LineageConverter
from noetl_lineage.quantum_facet import SCHEMA_URL
from noetl_lineage.validate import LineageValidator


def test_sweep_step_run_carries_a_quantum_provenance_facet(home):
    r = run_playbook(
        EXAMPLES / "quantum_sweep.yaml", {"n_theta": 2, "n_phi": 2, "shots": 200}, data_dir=home, **DEMO
    )
    assert r.status == "completed", r.results
    events = open_event_store(None, data_dir=home).read(r.execution_id)
    conv = LineageConverter()
    runs = [x for e in events for x in conv.convert(e)]
    done = [x for x in runs if x.job.name.endswith(".sweep") and x.eventType.name == "COMPLETE"]
    assert len(done) == 1, [(x.job.name, x.eventType) for x in runs]
    facet = done[0].run.facets["noetl_quantum"]
    assert len(facet.jobs) == 4 and facet.truncated == 0
    seeds = sorted(j["seeds"]["simulator"] for j in facet.jobs)
    assert seeds == [7, 8, 9, 10]  # workload.seed + point.i
    for j in facet.jobs:
        assert j["provider"] == "aer" and j["backend"]["name"] == "aer_simulator" and j["backend"]["version"]
        assert j["shots"] == 200 and j["transpiler"]["seed_transpiler"] == j["seeds"]["simulator"]
        assert j["calibration"]["timestamp"] and j["queue_seconds"] == 0.0 and j["execution_seconds"] >= 0
        assert j["circuit_sha256"] and j["job_id"].startswith("aer-")
        assert "counts" not in j
    # it serialises as a custom facet with its own schema URL
    doc = json.loads(Serde.to_json(done[0]))
    f = doc["run"]["facets"]["noetl_quantum"]
    assert f["_schemaURL"] == SCHEMA_URL and len(f["jobs"]) == 4
    # and validates against the OpenLineage spec plus our facet schema (lineage/noetl_lineage/facets/)
    assert LineageValidator().errors(doc) == []
    # steps that ran no quantum job carry no such facet
    others = [x for x in runs if x.job.name.endswith((".start", ".aggregate"))]
    assert others and all("noetl_quantum" not in (x.run.facets or {}) for x in others)


SWEEP_TABLE = "noetl://demo/examples/quantum/dataset/ry_pair_sweep"


def test_sweep_table_is_a_parquet_asset_with_provenance_in_its_registry_record(tmp_path, monkeypatch):
    from urllib.parse import unquote

    import dagster as dg
    import pyarrow.parquet as pq

    from noetl_dagster.resources.noetl import NoetlResource, close_all_services
    from noetl_dagster.translator import compile_playbooks
    from noetl_registry.client import open_registry

    data = tmp_path / "data"
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(data))
    res = NoetlResource(data_dir=str(data), tenant="demo", project="examples")
    defs = compile_playbooks(
        [EXAMPLES / "quantum_sweep.yaml"], include_sensor=False, resource=res
    ).definitions
    key = dg.AssetKey(["quantum", "ry_pair_sweep"])
    assert defs.resolve_assets_def(key).is_executable
    try:
        with dg.instance_for_test() as instance:
            result = defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=instance)
            assert result.success
            mats = {
                e.materialization.asset_key: e.materialization.metadata
                for e in result.get_asset_materialization_events()
            }
    finally:
        close_all_services()
    md = mats[key]
    assert md["dagster/row_count"].value == 9  # the default 3 x 3 grid
    # the registry record of the table holds the sweep's provenance
    reg = open_registry(str(data / "registry.db"), tenant="demo", project="examples")
    plan = reg.resolve(SWEEP_TABLE + "@latest")
    rec = reg.get(plan.resource_id) if hasattr(plan, "resource_id") else plan
    meta = rec.metadata
    assert meta["provider"] == "aer" and meta["backend"] == "aer_simulator" and meta["backend_version"]
    assert meta["shots"] == 2000 and meta["seeds"] == list(range(7, 16)) and meta["circuit_sha256"]
    # counts and expectation values are stored by reference: the Parquet file at the resource's location
    loc = rec.locations[0].uri
    table = pq.read_table(unquote(loc.removeprefix("file://")))
    assert table.num_rows == 9 and {"zz", "exact", "counts", "seed", "backend_version"} <= set(
        table.column_names
    )
    assert json.loads(table.column("counts")[0].as_py())


def test_shots_and_device_seconds_reach_the_usage_and_the_task_facts(home):
    from noetl_analytics.facts import FactBuilder
    from noetl_dagster.dsl import load_playbook_dict

    emu = {"queue_depth": 0, "execution_seconds": 0.05, "calibration_period_s": 3600, "noise": False}
    doc = {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "q_usage", "path": "tests/q_usage"},
           "workflow": [
               {"step": "start", "tool": [{"sim": {"kind": "quantum", "circuit": BELL, "shots": 300, "seed": 1}}],
                "next": {"arcs": [{"step": "qpu"}]}},
               {"step": "qpu", "tool": [
                   {"sub": {"kind": "quantum", "operation": "submit", "provider": "emulated_qpu", "circuit": BELL,
                            "shots": 200, "seed": 2, "provider_options": emu}},
                   {"fetch": {"kind": "quantum", "operation": "run", "provider": "aer", "circuit": BELL, "shots": 50,
                              "seed": 3}},
                   {"res": {"kind": "quantum", "operation": "result", "job_id": "{{ sub.job_id }}",
                            "spec": {"policy": {"rules": [{"when": "{{ outcome.status == 'error' }}",
                                                           "then": {"do": "retry", "attempts": 100, "delay": 0.05}}]}}}},
                   {"again": {"kind": "quantum", "operation": "result", "job_id": "{{ sub.job_id }}"}}]}]}  # fmt: skip
    r = run_playbook(load_playbook_dict(doc), None, data_dir=home)
    assert r.status == "completed", r.results
    events = open_event_store(None, data_dir=home).read(r.execution_id)
    usage = {e.data["task"]: (e.data["outcome"].get("meta") or {}).get("usage") or {}
             for e in events if e.name == "task.done" and e.data["outcome"]["status"] == "ok"}  # fmt: skip
    assert usage["sim"]["shots"] == 300 and usage["sim"]["quantum_jobs"] == 1
    assert "shots" not in usage["sub"]  # submitted, not yet run: nothing to count
    assert usage["res"]["shots"] == 200 and usage["res"]["qpu_s"] == pytest.approx(0.05)
    assert "shots" not in usage["again"]  # fetched twice, counted once
    fb = FactBuilder()
    fb.add(events)
    shots = {t["task"]: t["shots"] for t in fb.tables()["task_fact"].to_pylist() if t["status"] == "ok"}
    assert shots["sim"] == 300 and shots["res"] == 200 and shots["fetch"] == 50
