"""Parsing cost that grows with the playbook: each task must not redo per-process work."""

from __future__ import annotations

import yaml

from noetl_dagster.dsl import kinds
from noetl_dagster.dsl.parse import load_playbook_dict, parse_playbook


def _chain(n: int) -> dict:
    steps = []
    for i in range(n):
        step: dict = {"step": "start" if i == 0 else f"s{i}", "tool": {"kind": "noop"}}
        if i < n - 1:
            step["next"] = {"arcs": [{"step": f"s{i + 1}"}]}
        steps.append(step)
    return {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "chain", "path": "t/chain"},
            "workflow": steps}  # fmt: skip


def test_distribution_metadata_is_read_once_per_entry_point_not_per_task(monkeypatch):
    # reading a distribution's name parses its METADATA file (~1 ms); the parser asked it for
    # every entry point of every task: 4.4 s to parse a 200-step chain, 22 ms a task
    kinds.refresh_entry_points()
    # as in a fresh process: no tool module imported yet (the parser then answers from the catalogue)
    monkeypatch.setattr(kinds, "_REGISTRY", {})
    calls = []
    real = kinds._dist_name

    def counted(ep):
        calls.append(ep)
        return real(ep)

    monkeypatch.setattr(kinds, "_dist_name", counted)
    doc = _chain(60)
    pb = load_playbook_dict(yaml.safe_load(yaml.safe_dump(doc)), source_file="chain.yaml")
    assert len(pb.workflow) == 60
    # built-in kinds only (issue 35): no entry-point scan, no distribution metadata read at all
    assert calls == [] and kinds._ENTRY_POINTS is None
    # a name that is not built in scans the entry points once; each distribution name is read at most once
    doc["workflow"][1]["tool"] = {"kind": "no_such_kind_here"}
    _, issues = parse_playbook(doc, source_file="chain.yaml")
    assert [i.rule for i in issues] == ["unknown-tool-kind"]
    assert kinds._ENTRY_POINTS is not None
    assert len(calls) <= len(kinds._entry_points())
    parse_playbook(doc, source_file="chain.yaml")
    assert len(calls) <= len(kinds._entry_points())
