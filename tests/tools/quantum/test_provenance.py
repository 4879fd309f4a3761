"""Quantum provenance beyond the events: the OpenLineage run facet (noetl_quantum) of the step that ran
the jobs, built from a real sweep's event log."""

from __future__ import annotations

import json

from openlineage.client.serde import Serde
from quantum_helpers import EXAMPLES

from lineage.convert import LineageConverter
from lineage.quantum_facet import SCHEMA_URL
from lineage.validate import LineageValidator
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store


def test_sweep_step_run_carries_a_quantum_provenance_facet(home):
    r = run_playbook(EXAMPLES / "quantum_sweep.yaml", {"n_theta": 2, "n_phi": 2, "shots": 200}, data_dir=home)
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
    # and validates against the OpenLineage spec plus our facet schema (lineage/facets/)
    assert LineageValidator().errors(doc) == []
    # steps that ran no quantum job carry no such facet
    others = [x for x in runs if x.job.name.endswith((".start", ".aggregate"))]
    assert others and all("noetl_quantum" not in (x.run.facets or {}) for x in others)
