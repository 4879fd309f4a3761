"""Replay resolves every stored reference through the payload registry (seed 004 F.2): a run whose
payload store is a cloud emulator (``$NOETL_PAYLOAD_STORE_URL``), replayed by the CLI with
deterministic summaries by default and bodies on request within a bound; an archive written to one
cloud replays from another after its objects are copied."""

from __future__ import annotations

import json
import uuid

import pytest
from click.testing import CliRunner

from noetl_dagster.commands.main import cli
from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.archive import archive_execution
from noetl_dagster.storage.events import SqliteEventStore
from noetl_dagster.storage.payload import open_payload_store

BIG = {
    "apiVersion": "noetl.io/v2",
    "kind": "Playbook",
    "metadata": {"name": "replay_refs", "path": "tests/replay_refs"},
    "workload": {"n": 3000},
    "workflow": [
        {"step": "start", "tool": {"kind": "python", "input": {"n": "{{ n }}"},
                                   "code": "result = {'rows': [{'i': i, 'v': 'x' * 20} for i in range(n)]}"},
         "next": {"arcs": [{"step": "end"}]}},
        {"step": "end", "tool": {"kind": "noop"}},
    ],
}  # fmt: skip


def _replay(*args: str) -> dict:
    res = CliRunner().invoke(cli, ["replay", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


@pytest.mark.parametrize("kind", ["s3", "gcs", "azure"])
def test_a_run_on_a_cloud_store_replays_with_summaries_and_bodies(kind, emulators, tmp_path, monkeypatch):
    emu = emulators(kind)
    for k, v in emu.env().items():  # the cloud's standard emulator variables
        monkeypatch.setenv(k, v)
    url = emu.store_url(f"run-{uuid.uuid4().hex[:8]}") + ("?create_container=true" if kind == "azure" else "")
    monkeypatch.setenv("NOETL_PAYLOAD_STORE_URL", url)
    data = tmp_path / "noetl"
    r = run_playbook(load_playbook_dict(BIG), data_dir=data)
    assert r.status == "completed", r.to_json()
    out = _replay(r.execution_id, "--data-dir", str(data))
    ref = out["results"]["start"]["$ref"]  # a reference, not the body
    assert ref["execution_id"] == r.execution_id and ref["content_type"] == "application/json"  # typed (F.1)
    assert ref["locality"] == "in-cluster"
    assert ref["store"] == open_payload_store(url).name and ref["uri"].startswith(url.split("?")[0])
    (summary,) = out["references"]
    assert (
        summary["status"] == "ok"
        and summary["checksum"] == ref["checksum"]
        and summary["size"] == ref["size"]
    )
    assert summary["json_shape"]["fields"]["rows"] == {"type": "array", "length": 3000,
                                                       "items": {"type": "object", "keys": 2}}  # fmt: skip
    assert (
        _replay(r.execution_id, "--data-dir", str(data))["references"] == out["references"]
    )  # deterministic
    full = _replay(r.execution_id, "--data-dir", str(data), "--bodies")
    assert full["results"]["start"] == {"rows": [{"i": i, "v": "x" * 20} for i in range(3000)]}
    bounded = _replay(r.execution_id, "--data-dir", str(data), "--bodies", "--max-body-bytes", "1000")
    assert bounded["results"]["start"] == {"$ref": ref, "status": "too_large"}
    # a corrupted payload is reported, never printed
    store = open_payload_store(url)
    store.fs.pipe_file(store._path_of(ref["uri"]), b'{"rows": []}')
    bad = _replay(r.execution_id, "--data-dir", str(data), "--bodies")
    assert bad["results"]["start"] == {"$ref": ref, "status": "checksum_mismatch"}
    assert bad["references"][0]["status"] == "checksum_mismatch"


def test_an_archive_written_to_gcs_replays_from_azure_after_a_copy(emulators, tmp_path, monkeypatch):
    gcs, azure = emulators("gcs"), emulators("azure")
    for k, v in {**gcs.env(), **azure.env()}.items():
        monkeypatch.setenv(k, v)
    data = tmp_path / "noetl"
    r = run_playbook(load_playbook_dict(BIG), data_dir=data)
    assert r.status == "completed"
    events = SqliteEventStore(data / "events.db")
    src_url = gcs.store_url(f"arch-{uuid.uuid4().hex[:8]}")
    manifest = archive_execution(r.execution_id, events, src_url)
    assert manifest["uri"].startswith("gs://")
    src = open_payload_store(src_url)
    dst_url = azure.store_url(f"copy-{uuid.uuid4().hex[:8]}")
    dst = open_payload_store(dst_url + "?create_container=true")
    src_root, dst_root = src.uri_for("x")[:-1], dst.uri_for("x")[:-1]
    copied = 0
    for uri in src.list():
        key = uri[len(src_root) :]
        dst.put_bytes(key, src.get_bytes(uri))
        copied += 1
    assert copied == 6  # manifest, segment + sidecar, result manifest, lineage, metrics
    bundle = dst_root + manifest["uri"][len(src_root) :]
    assert bundle.startswith("azure://")
    report = _replay("--from-archive", bundle)
    assert report["match"] is True and report["status"] == "completed" and report["runs"] == r.runs
    (summary,) = report["references"]  # the big result, still where the run wrote it
    assert summary["status"] == "ok" and summary["uri"].startswith("file://")
    # and the copy is verified: a changed segment fails the replay with a checksum error
    seg = next(u for u in dst.list() if u.endswith(".jsonl.zst"))
    dst.put_bytes(seg[len(dst_root) :], b"not zstd")
    res = CliRunner().invoke(cli, ["replay", "--from-archive", bundle])
    assert res.exit_code != 0 and "checksum" in res.output.lower(), res.output
