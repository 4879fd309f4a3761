"""Regressions found while migrating legacy playbooks."""

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.runners.local import run_playbook


def test_mapping_key_wins_over_dict_method(data_dir):
    pb = load_playbook_dict({
        "apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "k", "path": "k"},
        "workload": {"items": [1, 2, 3], "values": "v"},
        "workflow": [{"step": "start", "tool": {"kind": "noop", "result": {"n": "{{ workload.items | length }}", "v": "{{ workload.values }}"}}}],
    })  # fmt: skip
    r = run_playbook(pb)
    assert r.results["start"] == {"n": 3, "v": "v"}


def test_workbook_input_is_readable_by_bare_name(data_dir):
    pb = load_playbook_dict({
        "apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "w", "path": "w"},
        "workbook": [{"name": "echo", "tool": {"kind": "noop", "input": {"summary": None}, "result": {"got": "{{ summary }}"}}}],
        "workflow": [{"step": "start", "tool": {"kind": "workbook", "name": "echo", "input": {"summary": "hello"}}}],
    })  # fmt: skip
    r = run_playbook(pb)
    assert r.results["start"] == {"got": "hello"}
