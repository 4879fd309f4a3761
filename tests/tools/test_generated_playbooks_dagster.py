"""A generated (inline) child under the Dagster runner: the same engine call, the same boundary."""

from __future__ import annotations

import dagster as dg
import pytest
from test_generated_playbooks import CHILD, GENERATED_OK, parent_doc

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.dsl.builder import playbook_id
from noetl_dagster.resources.noetl import close_all_services
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.translator.runner import run_playbook_dagster


@pytest.fixture
def instance(tmp_path):
    inst = dg.DagsterInstance.ephemeral()
    yield inst
    inst.dispose()
    close_all_services()


def test_generated_child_runs_and_is_refused_the_same_under_dagster(tmp_path, instance, monkeypatch):
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path / "home"))
    url = f"sqlite:///{tmp_path / 'events.db'}"
    ok = run_playbook_dagster(load_playbook_dict(parent_doc({"definition": CHILD, "input": {"b": 40}}, generated=GENERATED_OK)),
                              event_store=url, data_dir=tmp_path / "home", instance=instance)  # fmt: skip
    assert ok.status == "completed", ok.results
    assert ok.results["run_child"]["sum"] == 41
    assert ok.results["run_child"]["playbook_id"] == playbook_id(load_playbook_dict(CHILD))
    store = open_event_store(url)
    reqs = [se.event for se in store.iter_all()
            if se.event.name == "playbook.execution.requested" and se.event.parent_execution_id == ok.execution_id]  # fmt: skip
    assert len(reqs) == 1 and reqs[0].data["ephemeral"] is True
    refused = run_playbook_dagster(load_playbook_dict(parent_doc({"definition": CHILD}, generated={"allow_kinds": ["noop"]})),
                                   event_store=url, data_dir=tmp_path / "home", instance=instance)  # fmt: skip
    assert refused.status == "failed"
    assert refused.results["run_child"]["error"]["kind"] == "generated_playbook_refused"


def test_a_generated_child_shows_up_under_its_parents_run(tmp_path, instance, monkeypatch):
    """No run of its own: the child runs inside the parent's op; the parent's run is tagged with it and its
    events are log lines of the parent run."""
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path / "home"))
    url = f"sqlite:///{tmp_path / 'events.db'}"
    before = {r.run_id for r in instance.get_runs()}
    ok = run_playbook_dagster(load_playbook_dict(parent_doc({"definition": CHILD}, generated=GENERATED_OK)),
                              event_store=url, data_dir=tmp_path / "home", instance=instance)  # fmt: skip
    assert ok.status == "completed", ok.results
    runs = [r for r in instance.get_runs() if r.run_id not in before]
    assert len(runs) == 1, [r.job_name for r in runs]  # no unexplained extra job
    run = runs[0]
    child_eid = ok.results["run_child"]["execution_id"]
    pid = playbook_id(load_playbook_dict(CHILD))
    assert run.tags["noetl/execution_id"] == ok.execution_id
    assert run.tags["noetl/child_executions"] == child_eid
    assert run.tags["noetl/generated_playbooks"] == pid
    logs = "\n".join(e.user_message for e in instance.all_logs(run.run_id) if e.user_message)
    assert f"generated child execution {child_eid} ({pid}) of {ok.execution_id}" in logs
    assert f"[sub-playbook {child_eid[-12:]}]" in logs and "task.done add.calc ok" in logs, logs
