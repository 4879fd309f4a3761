"""kind: gcs. No GCS emulator is installable here, so the object operations run through the same
fsspec code path against fsspec's local-file and in-memory filesystems; the gs:// path is checked
up to building gcsfs's client (credentials, emulator endpoint)."""

from __future__ import annotations

import pytest

from noetl_dagster.dsl.kinds import ToolConfigError, get_tool
from noetl_dagster.engine.ports import ToolError
from noetl_dagster.tools.gcs import _fs, gcs_tool


def test_upload_read_list_download_delete(make_ctx, tmp_path):
    ctx = make_ctx()
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    work = tmp_path / "data" / "work" / "exec-test"
    work.mkdir(parents=True)
    (work / "report.json").write_text('{"rows": 3}')
    up = gcs_tool({"source": "report.json", "destination": f"file://{bucket}/out/report.json"}, ctx)
    assert up["size_bytes"] == 11
    assert gcs_tool({"operation": "read", "source": f"file://{bucket}/out/report.json"}, ctx)["data"] == {
        "rows": 3
    }
    gcs_tool({"operation": "write", "destination": f"file://{bucket}/out/b.txt", "data": "hello"}, ctx)
    listed = gcs_tool({"operation": "list", "source": f"file://{bucket}/out"}, ctx)
    assert listed["count"] == 2 and listed["uris"][0].endswith("out/b.txt")
    down = gcs_tool(
        {"operation": "download", "source": f"file://{bucket}/out/b.txt", "destination": "in/b.txt"}, ctx
    )
    assert (work / "in" / "b.txt").read_text() == "hello" and down["size_bytes"] == 5
    assert gcs_tool({"operation": "delete", "source": f"file://{bucket}/out/b.txt"}, ctx)["deleted"]
    mem = gcs_tool(
        {"operation": "write", "destination": "memory://noetl-test/x.json", "data": {"a": [1]}}, ctx
    )
    assert gcs_tool({"source": mem["uri"]}, ctx)["data"] == {"a": [1]}


def test_errors_are_error_outcomes(make_ctx, tmp_path):
    ctx = make_ctx()
    with pytest.raises(ToolError) as ei:
        gcs_tool({"operation": "read", "source": f"file://{tmp_path}/missing.json"}, ctx)
    assert ei.value.kind == "not_found"
    with pytest.raises(ToolError, match="outside the execution's work directory"):
        gcs_tool({"source": "/etc/passwd", "destination": "memory://b/p"}, ctx)
    with pytest.raises(ToolError, match="operation write needs destination"):
        gcs_tool({"operation": "write", "data": 1}, ctx)


def test_gs_uris_use_gcsfs_with_credentials_and_emulator_endpoint(make_ctx):
    ctx = make_ctx()
    fs = _fs("gs://bucket/key", {"endpoint": "http://127.0.0.1:1", "project": "p"}, ctx)
    assert type(fs).__module__.startswith("gcsfs") and fs._endpoint == "http://127.0.0.1:1"
    # (a read against a dead endpoint is not tested: gcsfs retries with backoff for ~90 s)


def test_bad_config_is_a_clear_validation_error():
    with pytest.raises(ToolConfigError, match="kind 'gcs': invalid config: operation"):
        get_tool("gcs").check_config({"operation": "copy"})
