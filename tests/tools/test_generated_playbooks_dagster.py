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
