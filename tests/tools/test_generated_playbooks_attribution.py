"""A generated child's work is attributed to its parent's tenant and project: its events, its
OpenLineage run events (job namespace, parent facet) and its analytics facts (task and execution rows)."""

from __future__ import annotations

from test_generated_playbooks import CHILD, GENERATED_OK, all_events, parent_doc

from noetl_analytics.facts import FactBuilder
from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store
from noetl_lineage.convert import LineageConverter, job_namespace


def test_child_work_lands_in_the_parents_tenant_and_project(tmp_path, monkeypatch):
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path / "home"))
    url = f"sqlite:///{tmp_path / 'events.db'}"
    # the generated definition names no tenant; a hostile one could not pick another (it has no field for it)
    res = run_playbook(load_playbook_dict(parent_doc({"definition": CHILD}, generated=GENERATED_OK)), None,
                       event_store=url, data_dir=tmp_path / "home", tenant="acme", project="quantum")  # fmt: skip
    assert res.status == "completed", res.results
    child = res.results["run_child"]["execution_id"]
    events = all_events(open_event_store(url))
    mine = [e for e in events if e.execution_id == child]
    assert mine and {(e.tenant_id, e.project_id) for e in mine} == {("acme", "quantum")}

    conv = LineageConverter()
    runs = [r for e in events for r in conv.convert(e)]
    child_runs = [r for r in runs if r.job.name.startswith("generated/sum")]
    assert child_runs, [r.job.name for r in runs]
    assert {r.job.namespace for r in child_runs} == {job_namespace("acme", "quantum")}
    parent_run_ids = {r.run.runId for r in runs if r.job.name == "tests/parent"}
    top = [r for r in child_runs if r.job.name == "generated/sum"]
    assert top and all(r.run.facets["parent"].run.runId in parent_run_ids for r in top)

    fb = FactBuilder()
    fb.add(events)
    tables = fb.tables()
    ex = tables["execution_fact"].to_pylist()
    row = next(r for r in ex if r["execution_id"] == child)
    assert (row["tenant_id"], row["project_id"]) == ("acme", "quantum")
    tasks = [r for r in tables["task_fact"].to_pylist() if r["execution_id"] == child]
    assert tasks and {(r["tenant_id"], r["project_id"]) for r in tasks} == {("acme", "quantum")}
