"""The documented example flow (docs/flow.md, README) runs, and flows run the same on Dagster
as with the local runner."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import flow_seed_examples as S
from flow_helpers import python_tasks

from noetl_dagster.dsl.flow import flow_to_mermaid, load_flow_playbook
from noetl_dagster.dsl.flow.mermaid import check_state_diagram
from noetl_dagster.runners.local import run_playbook

DATA = Path(__file__).with_name("data")
EXAMPLE = DATA / "customer_scores.flow"


def _copy_example(tmp_path: Path) -> Path:
    work = tmp_path / "example"
    shutil.copytree(DATA, work)
    return work / EXAMPLE.name


def test_documented_example_runs(tmp_path, data_dir):
    flow_file = _copy_example(tmp_path)
    r = run_playbook(load_flow_playbook(flow_file), data_dir=data_dir)
    assert r.status == "completed"
    scores = json.loads((flow_file.parent / "out" / "scores.json").read_text())
    assert scores == [{"id": "C1", "risk": 0.25}, {"id": "C2", "risk": 0.75}, {"id": "C3", "risk": 0.0}]
    report = json.loads((flow_file.parent / "out" / "report.json").read_text())
    assert report == {"alerts": ["C2"], "customers": 3, "mean_risk": 1 / 3}
    assert check_state_diagram(flow_to_mermaid(EXAMPLE.read_text())) == []


def _same(a, b) -> None:
    ja, jb = a.to_json(), b.to_json()
    ja.pop("execution_id"), jb.pop("execution_id")
    assert ja == jb


def test_flows_run_the_same_on_dagster(tmp_path, data_dir):
    from noetl_dagster.translator.runner import run_playbook_dagster

    flow_file = _copy_example(tmp_path)
    example = load_flow_playbook(flow_file)
    local = run_playbook(example, data_dir=data_dir)
    on_dagster = run_playbook_dagster(example, data_dir=data_dir)
    assert on_dagster.extra["dagster"]["statuses"] == ["SUCCESS"]
    _same(local, on_dagster)

    # guards that skip branches: the join after them still runs once, on both runners
    guards = tmp_path / "guards.flow"
    guards.write_text(
        "@task A (- {kind: python, code: \"result = {'status': input['status']}\"} -);\n"
        + python_tasks(["B", "C", "D", "E"], "result = {'{name}': input}")
        + S.GUARDS_IN_SUBFLOW
    )
    pb = load_flow_playbook(guards)
    for status in (1, -1):
        local = run_playbook(pb, {"status": status}, data_dir=data_dir)
        on_dagster = run_playbook_dagster(pb, {"status": status}, data_dir=data_dir)
        _same(local, on_dagster)
        assert on_dagster.runs["E_7"] == 1
