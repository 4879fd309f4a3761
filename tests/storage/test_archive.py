"""Execution archive bundles: write, verify, replay from the bundle alone."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote

import pytest
from click.testing import CliRunner

from noetl_dagster.commands.main import cli
from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.archive import (
    ArchiveConflict,
    archive_execution,
    read_archive_events,
    replay_from_archive,
)
from noetl_dagster.storage.events import SqliteEventStore
from noetl_dagster.storage.payload import ChecksumMismatch

BIG = {
    "apiVersion": "noetl.io/v2",
    "kind": "Playbook",
    "metadata": {"name": "archive_probe", "path": "tests/archive_probe"},
    "workload": {"n": 4000},
    "workflow": [
        {
            "step": "start",
            "tool": {
                "kind": "python",
                "input": {"n": "{{ n }}"},
                "code": "result = {'rows': [{'i': i, 'v': 'x' * 20} for i in range(n)]}",
            },
            "next": {"arcs": [{"step": "loop"}]},
        },
        {
            "step": "loop",
            "loop": {"in": "{{ [1, 2, 3] }}", "iterator": "k", "spec": {"mode": "parallel"}},
            "tool": {"kind": "python", "input": {"k": "{{ iter.k }}"}, "code": "result = k * 10"},
            "set": {"ctx.total": "{{ loop.results | sum }}"},
            "next": {"arcs": [{"step": "end"}]},
        },
        {"step": "end", "tool": {"kind": "noop"}},
    ],
}


@pytest.fixture
def executed(tmp_path):
    pb = load_playbook_dict(BIG)
    r = run_playbook(pb, data_dir=tmp_path / "noetl")
    assert r.status == "completed", r.to_json()
    assert r.ctx["total"] == 60
    return r, SqliteEventStore(tmp_path / "noetl" / "events.db")


def test_bundle_layout_and_replay(executed, tmp_path):
    r, store = executed
    manifest = archive_execution(r.execution_id, store, str(tmp_path / "archive"))
    assert manifest["status"] == "written"
    root = Path(unquote(manifest["uri"].removeprefix("file://")))
    assert (
        f"execution={r.execution_id}" in str(root) and "tenant=default" in str(root) and "shard=" in str(root)
    )
    for rel in ("manifest.json", "events/segment-000001.jsonl.zst", "events/segment-000001.sha256",
                "results/result-manifest.json", "lineage/lineage.json", "metrics/summary.json"):  # fmt: skip
        assert (root / rel).is_file(), rel
    results = json.loads((root / "results/result-manifest.json").read_text())
    assert any(a["format"] == "json" and a["size"] > 64 * 1024 for a in results["artifacts"]), (
        "the big result is a reference"
    )
    metrics = json.loads((root / "metrics/summary.json").read_text())
    assert metrics["steps_done"] == 3 and metrics["loop_iterations"] == 3
    report = replay_from_archive(manifest["uri"])
    assert report["match"] is True
    assert report["status"] == "completed" and report["runs"] == r.runs and report["ctx"] == {"total": 60}


def test_archiving_twice_is_idempotent(executed, tmp_path):
    r, store = executed
    first = archive_execution(r.execution_id, store, str(tmp_path / "a"))
    second = archive_execution(r.execution_id, store, str(tmp_path / "a"))
    assert second["status"] == "exists" and second["final_state_digest"] == first["final_state_digest"]


def test_tampered_bundle_fails_closed(executed, tmp_path):
    r, store = executed
    manifest = archive_execution(r.execution_id, store, str(tmp_path / "a"))
    root = Path(unquote(manifest["uri"].removeprefix("file://")))
    seg = root / "events/segment-000001.jsonl.zst"
    seg.write_bytes(seg.read_bytes()[:-4] + b"\x00\x00\x00\x00")
    with pytest.raises(ChecksumMismatch):
        read_archive_events(manifest["uri"])
    with pytest.raises(ChecksumMismatch):  # re-archiving verifies the existing bundle too
        archive_execution(r.execution_id, store, str(tmp_path / "a"))


def test_conflicting_archive_is_refused(executed, tmp_path):
    r, store = executed
    manifest = archive_execution(r.execution_id, store, str(tmp_path / "a"))
    root = Path(unquote(manifest["uri"].removeprefix("file://")))
    m = json.loads((root / "manifest.json").read_text())
    m["event_count"] += 1
    (root / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArchiveConflict):
        archive_execution(r.execution_id, store, str(tmp_path / "a"))


def test_unfinished_execution_is_not_archived(tmp_path):
    from noetl_dagster.engine.control import Engine
    from noetl_dagster.runners.local import build_services

    svc = build_services(data_dir=tmp_path)
    eng = Engine(load_playbook_dict(BIG), svc)
    eng.start({})
    with pytest.raises(ValueError, match="has not finished"):
        archive_execution(eng.execution_id, svc.event_store, str(tmp_path / "a"))


def test_cli_archive_registers_and_replays(executed, tmp_path, monkeypatch):
    r, store = executed
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path / "noetl"))
    res = CliRunner().invoke(cli, ["archive", r.execution_id, "--to", str(tmp_path / "arch"), "--json"])
    assert res.exit_code == 0, res.output
    manifest = json.loads(res.output)
    from noetl_registry.client import open_registry

    reg = open_registry(None, tenant="default", project="default")
    found = reg.list(type="execution_archive")
    items = found.items if hasattr(found, "items") else found
    assert any(r.execution_id in str(getattr(i, "uri", i)) for i in items)
    res = CliRunner().invoke(cli, ["replay", "--from-archive", manifest["uri"], "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["match"] is True


def test_cli_archive_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path))
    res = CliRunner().invoke(cli, ["archive", "missing-id", "--to", str(tmp_path / "a"), "--no-registry"])
    assert res.exit_code == 2 and "no events" in res.output
    res = CliRunner().invoke(cli, ["replay", "--from-archive", str(tmp_path / "nothing-here")])
    assert res.exit_code != 0


def test_archive_to_s3_and_replay_from_it(executed, s3_bucket, monkeypatch):
    endpoint, bucket, _ = s3_bucket
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    r, store = executed
    to = f"s3://{bucket}/archives?endpoint_url={endpoint}"
    manifest = archive_execution(r.execution_id, store, to)
    assert manifest["status"] == "written" and manifest["uri"].startswith(f"s3://{bucket}/archives/noetl/")
    again = archive_execution(r.execution_id, store, to)
    assert again["status"] == "exists"
    report = replay_from_archive(f"{manifest['uri']}?endpoint_url={endpoint}")
    assert report["match"] is True and report["runs"] == r.runs
