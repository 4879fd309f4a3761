"""A worker running the same playbook file for every request parses it once (issue 35).

``load_playbook`` keeps the parsed playbook of a file while the file (path, inode, size, mtime,
ctime), the registered kinds and ``$NOETL_MAX_STEPS`` stay the same; a changed file is parsed
again, an invalid one is never kept."""

from __future__ import annotations

import os

import pytest
import yaml

from noetl_dagster.dsl import files
from noetl_dagster.dsl.files import load_playbook
from noetl_dagster.dsl.parse import PlaybookInvalid
from noetl_dagster.runners.local import run_playbook

PLAYBOOK = {
    "apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "cached", "path": "t/cached"},
    "workflow": [{"step": "start", "tool": {"kind": "python", "code": "result = {'n': 1}"}}],
}  # fmt: skip


def _write(path, doc):
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_the_same_file_is_parsed_once_per_process(tmp_path):
    path = tmp_path / "p.yaml"
    _write(path, PLAYBOOK)
    before = files.parse_count[0]
    for _ in range(5):
        result = run_playbook(path, event_store=f"sqlite:///{tmp_path}/events.db", data_dir=tmp_path)
        assert result.status == "completed" and result.results["start"] == {"n": 1}
    assert files.parse_count[0] - before == 1


def test_a_changed_file_is_parsed_again(tmp_path):
    path = tmp_path / "p.yaml"
    _write(path, PLAYBOOK)
    first = load_playbook(path)
    changed = {
        **PLAYBOOK,
        "workflow": [{"step": "start", "tool": {"kind": "python", "code": "result = {'n': 2}"}}],
    }
    _write(path, changed)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # even within the clock's resolution
    second = load_playbook(path)
    assert second is not first and second.steps["start"].tool[0].config["code"].endswith("2}")


def test_an_invalid_file_is_never_kept(tmp_path):
    path = tmp_path / "p.yaml"
    _write(path, {**PLAYBOOK, "workflow": [{"step": "start", "tool": {"kind": "no_such_kind"}}]})
    before = files.parse_count[0]
    for _ in range(2):
        with pytest.raises(PlaybookInvalid):
            load_playbook(path)
    assert files.parse_count[0] - before == 2


def test_max_steps_is_part_of_the_key(tmp_path, monkeypatch):
    path = tmp_path / "p.yaml"
    _write(path, PLAYBOOK)
    load_playbook(path)
    monkeypatch.setenv("NOETL_MAX_STEPS", "1")
    load_playbook(path)  # one step: still valid, parsed again under the new limit
    monkeypatch.setenv("NOETL_MAX_STEPS", "0")
    two = {**PLAYBOOK, "workflow": PLAYBOOK["workflow"] + [{"step": "b", "tool": {"kind": "noop"}}]}
    _write(path, two)
    monkeypatch.setenv("NOETL_MAX_STEPS", "1")
    with pytest.raises(PlaybookInvalid):
        load_playbook(path)


def test_a_replaced_kind_makes_parsed_playbooks_stale(tmp_path):
    from pydantic import BaseModel

    from noetl_dagster.dsl.kinds import register_tool

    class Strict(BaseModel):
        model_config = {"extra": "forbid"}
        must: int

    path = tmp_path / "p.yaml"
    _write(path, {**PLAYBOOK, "workflow": [{"step": "start", "tool": {"kind": "cache_probe_kind", "x": 1}}]})
    register_tool("cache_probe_kind", lambda *a, **k: {})
    load_playbook(path)
    register_tool(
        "cache_probe_kind", lambda *a, **k: {}, config=Strict
    )  # now `x` is refused, `must` required
    with pytest.raises(PlaybookInvalid):
        load_playbook(path)


def test_run_max_step_runs_does_not_leak_into_the_shared_playbook(tmp_path):
    from click.testing import CliRunner

    from noetl_dagster.commands.main import cli

    path = tmp_path / "p.yaml"
    _write(path, PLAYBOOK)
    env = {"NOETL_DAGSTER_HOME": str(tmp_path / "home")}
    result = CliRunner().invoke(cli, ["run", str(path), "--max-step-runs", "7", "-q"], env=env)
    assert result.exit_code == 0, result.output
    assert "max_step_runs" not in load_playbook(path).executor.spec  # the option changed a copy
