"""OpenLineage events from real executions: every event validates offline against
the spec (OpenLineage.json + facet schemas), runs are well formed (START first, one
COMPLETE or FAIL last), jobs/parents/datasets/facets say what happened."""

from __future__ import annotations

import copy
from collections import defaultdict

import pytest
from lineage_helpers import as_json

from noetl_dagster.engine import events as E
from noetl_dagster.engine.events import Event
from noetl_lineage.convert import LineageConverter, convert_all, playbook_run_id, step_run_id
from noetl_lineage.emitter import registry_describer


@pytest.fixture(scope="module")
def converted(lineage_runs):
    data_dir, events, _ = lineage_runs
    describe = registry_describer(str(data_dir / "registry.db"))
    return [as_json(r) for r in convert_all(events, describe=describe)]


def test_every_event_validates_against_the_spec(converted, validator):
    assert len(converted) > 100
    bad = {i: errs for i, ev in enumerate(converted) if (errs := validator.errors(ev))}
    assert not bad, list(bad.items())[:5]
    seen_types = {ev["eventType"] for ev in converted}
    assert seen_types == {"START", "RUNNING", "COMPLETE", "FAIL"}
    run_facets = {k for ev in converted for k in ev["run"]["facets"]}
    assert {"parent", "processing_engine", "errorMessage"} <= run_facets
    assert any("root" in ev["run"]["facets"].get("parent", {}) for ev in converted)
    dataset_facets = {k for ev in converted for ds in ev["inputs"] + ev["outputs"] for k in ds["facets"]}
    assert {"schema", "version", "storage"} <= dataset_facets
    assert any("outputStatistics" in ds["outputFacets"] for ev in converted for ds in ev["outputs"])
    assert {ev["job"]["facets"]["jobType"]["jobType"] for ev in converted} == {"PLAYBOOK", "STEP"}


def test_each_run_starts_first_and_ends_once(converted):
    by_run = defaultdict(list)
    for ev in converted:
        by_run[ev["run"]["runId"]].append(ev["eventType"])
    for run_id, types in by_run.items():
        assert types[0] == "START", (run_id, types)
        assert types.count("START") == 1
        assert types[-1] in ("COMPLETE", "FAIL") and sum(t in ("COMPLETE", "FAIL") for t in types) == 1, types


def test_run_ids_are_deterministic(lineage_runs, converted):
    _, events, _ = lineage_runs
    again = [as_json(r) for r in convert_all(events)]
    assert [e["run"]["runId"] for e in again] == [e["run"]["runId"] for e in converted]
    first = events[0]
    assert converted[0]["run"]["runId"] == playbook_run_id(first.execution_id)
    step = next(e for e in events if e.name == E.STEP_STARTED)
    assert step_run_id(step.execution_id, step.step_run_id) in {e["run"]["runId"] for e in converted}


def test_jobs_parents_and_roots(lineage_runs, converted):
    _, events, _ = lineage_runs
    requested = {e.execution_id: e for e in events if e.name == E.EXECUTION_REQUESTED}
    portfolio = next(
        e for e in requested.values() if e.data["name"] == "customer_portfolio" and e.tenant_id == "acme"
    )
    children = [e for e in requested.values() if e.parent_execution_id == portfolio.execution_id]
    assert len(children) == 3
    parent_run = playbook_run_id(portfolio.execution_id)
    child_starts = [
        ev
        for ev in converted
        if ev["eventType"] == "START"
        and ev["run"]["runId"] in {playbook_run_id(c.execution_id) for c in children}
    ]
    assert len(child_starts) == 3
    for ev in child_starts:
        assert ev["job"] == {
            "namespace": "noetl://acme/sales",
            "name": "examples/score_customer",
            "facets": ev["job"]["facets"],
        }
        parent = ev["run"]["facets"]["parent"]
        assert parent["run"]["runId"] == parent_run and parent["job"]["name"] == "examples/customer_portfolio"
        assert parent["root"]["run"]["runId"] == parent_run
    # a step of a child: parent = the child's playbook run, root = the top execution
    child_run_ids = {playbook_run_id(c.execution_id) for c in children}
    child_steps = [
        ev
        for ev in converted
        if ev["job"]["name"] == "examples/score_customer.start"
        and ev["run"]["facets"]["parent"]["run"]["runId"] in child_run_ids
    ]
    assert child_steps and all(
        ev["run"]["facets"]["parent"]["root"]["run"]["runId"] == parent_run for ev in child_steps
    )


def test_failing_playbook_fails_with_the_error(converted):
    fails = [ev for ev in converted if ev["eventType"] == "FAIL"]
    jobs = {ev["job"]["name"] for ev in fails}
    assert {"tests/facts_fail", "tests/facts_fail.flaky"} <= jobs
    for ev in fails:
        msg = ev["run"]["facets"]["errorMessage"]
        assert msg["programmingLanguage"] == "python" and msg["message"]
        if ev["job"]["name"].startswith("tests/facts_fail"):
            assert "attempt 2 fails" in msg["message"]
    # a handled step failure (customers_http routes a 404 to a fallback) fails the step, not the playbook
    assert "examples/customers_http" not in jobs
    assert any(j.startswith("examples/customers_http.") for j in jobs)


def test_datasets_from_references_and_the_registry(converted):
    def last(job, tenant="acme"):
        return [
            ev
            for ev in converted
            if ev["job"]["name"] == job
            and ev["job"]["namespace"] == f"noetl://{tenant}/sales"
            and ev["eventType"] == "COMPLETE"
        ][-1]

    save = last("tests/facts_refs.save")
    table = next(ds for ds in save["outputs"] if ds["namespace"] == "noetl://acme/sales")
    assert table["name"] == "tests/dataset/facts_rows"
    assert table["facets"]["version"]["datasetVersion"] == "v1"
    assert table["facets"]["storage"] == {
        **table["facets"]["storage"],
        "storageLayer": "file",
        "fileFormat": "parquet",
    }
    assert [f["name"] for f in table["facets"]["schema"]["fields"]] == [
        "id",
        "name",
        "score",
    ]  # from the registry
    assert table["outputFacets"]["outputStatistics"]["rowCount"] == 2000
    # the offloaded input of `save` (start's result) is an output of `start`, a file dataset
    start = last("tests/facts_refs.start")
    payload = start["outputs"][0]
    assert payload["namespace"] == "file" and payload["name"].endswith(".json")
    assert payload["outputFacets"]["outputStatistics"]["rowCount"] == 2000
    load = last("tests/facts_refs.load")
    assert [(ds["namespace"], ds["name"]) for ds in load["inputs"]] == [
        ("noetl://acme/sales", "tests/dataset/facts_rows")
    ]
    fanout = last("tests/facts_refs.fanout")
    assert (
        len([ds for ds in fanout["outputs"] if ds["namespace"] == "file"]) >= 3
    )  # iterations stored by reference
    playbook = last("tests/facts_refs")
    names = {ds["name"] for ds in playbook["outputs"]}
    assert "tests/dataset/facts_rows" in names
    # the table it read was written by itself: not an input from outside
    assert "tests/dataset/facts_rows" not in {ds["name"] for ds in playbook["inputs"]}


def test_nominal_time_for_scheduled_runs(validator):
    exe = "01900000-0000-7000-8000-000000000001"
    events = [
        Event(
            E.EXECUTION_REQUESTED,
            exe,
            data={
                "playbook": "examples/nightly_report",
                "name": "nightly_report",
                "nominal_time": "2026-05-29T02:00:00+00:00",
            },
        ),
        Event(
            E.WORKFLOW_STARTED, exe, data={"workload": {"input": "noetl://default/default/raw/dataset/x@v2"}}
        ),
        Event(E.WORKFLOW_FINISHED, exe, data={"status": "completed"}),
    ]
    out = [as_json(r) for r in convert_all(events)]
    assert [ev["eventType"] for ev in out] == ["START", "RUNNING", "COMPLETE"]
    assert out[0]["run"]["facets"]["nominalTime"]["nominalStartTime"] == "2026-05-29T02:00:00+00:00"
    assert out[-1]["inputs"][0]["name"] == "raw/dataset/x"  # a noetl:// URI in the workload is an input
    for ev in out:
        assert validator.errors(ev) == []


def test_a_stream_joined_mid_execution_still_starts_each_run(validator):
    exe = "01900000-0000-7000-8000-000000000002"
    conv = LineageConverter()
    out = conv.convert(Event(E.STEP_DONE, exe, step="late", step_run_id="sr1", data={"result": 1}))
    out += conv.convert(Event(E.WORKFLOW_FINISHED, exe, data={"status": "failed"}, status="error"))
    types = [(r.job.name, r.eventType.value) for r in out]
    assert types == [
        (f"execution-{exe}", "START"),
        (f"execution-{exe}.late", "START"),
        (f"execution-{exe}.late", "COMPLETE"),
        (f"execution-{exe}", "FAIL"),
    ]
    for r in out:
        assert validator.errors(as_json(r)) == []


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda ev: ev["run"].update(runId="not-a-uuid"), "is not a 'uuid'"),
        (lambda ev: ev.update(eventTime="yesterday"), "is not a 'date-time'"),
        (lambda ev: ev["run"]["facets"]["errorMessage"].pop("programmingLanguage"), "programmingLanguage"),
        (
            lambda ev: ev["run"]["facets"].update(parentRun=ev["run"]["facets"].pop("parent")),
            "not 'parentRun'",
        ),
        (lambda ev: ev["run"]["facets"]["parent"]["run"].pop("runId"), "runId"),
        (
            lambda ev: ev["job"]["facets"]["jobType"].update(
                _schemaURL="https://example.com/x.json#/$defs/X"
            ),
            "not in the local spec",
        ),
    ],
)
def test_the_validator_rejects_broken_events(converted, validator, mutate, expected):
    fail = next(ev for ev in converted if ev["eventType"] == "FAIL" and "parent" in ev["run"]["facets"])
    broken = copy.deepcopy(fail)
    mutate(broken)
    errors = validator.errors(broken)
    assert errors and any(expected in e for e in errors), errors


def test_the_stream_keeps_the_rules_across_events(converted):
    """Run lifecycles, parents that exist, stable datasets (OpenLineage's compatibility rules)."""
    from noetl_lineage.validate import semantic_errors

    assert semantic_errors(converted) == []
    assert all("dataSource" in ds["facets"] for ev in converted for ds in ev["inputs"] + ev["outputs"])


def _break_parent(events):
    child = next(ev for ev in events if "parent" in ev["run"]["facets"])
    child["run"]["facets"]["parent"]["run"]["runId"] = "01890000-0000-7000-8000-000000000000"


def _rename_job(events):
    run_id = events[0]["run"]["runId"]
    later = next(ev for ev in events[1:] if ev["run"]["runId"] == run_id)
    later["job"]["name"] = later["job"]["name"] + ".renamed"


def _event_after_end(events):
    end = next(ev for ev in events if ev["eventType"] in ("COMPLETE", "FAIL"))
    events.append(copy.deepcopy(end) | {"eventType": "RUNNING"})


def _drop_terminal(events):
    end = next(i for i, ev in enumerate(events) if ev["eventType"] in ("COMPLETE", "FAIL"))
    del events[end]


def _flip_format(events):
    ds = next(ds for ev in events for ds in ev["outputs"] if "storage" in ds["facets"])
    twin = next(
        ev
        for ev in events
        for d in ev["outputs"] + ev["inputs"]
        if (d["namespace"], d["name"]) == (ds["namespace"], ds["name"]) and d is not ds
    )
    for d in twin["outputs"] + twin["inputs"]:
        if (d["namespace"], d["name"]) == (ds["namespace"], ds["name"]):
            d["facets"]["storage"] = dict(ds["facets"]["storage"], fileFormat="something-else")


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (_break_parent, "is not in the stream"),
        (_rename_job, "changed job"),
        (_event_after_end, "after its"),
        (_drop_terminal, "never ends"),
        (_flip_format, "changed fileFormat"),
    ],
)
def test_the_stream_rules_catch_broken_streams(converted, mutate, expected):
    from noetl_lineage.validate import semantic_errors

    broken = copy.deepcopy(converted)
    mutate(broken)
    errors = semantic_errors(broken)
    assert any(expected in e for e in errors), errors[:5]
