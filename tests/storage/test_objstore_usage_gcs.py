"""GCS network bytes in the task's measured usage (issue 18.1): ``kind: gcs`` tasks against
gcp-storage-emulator (a real HTTP server speaking GCS's JSON API) behind the byte-counting TCP
relay; the tasks' usage must equal the bytes that crossed the wire."""

from __future__ import annotations

import socket
import textwrap

import pytest

from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store
from tests.storage.test_objstore_usage import Relay


@pytest.fixture(scope="module")
def gcs_emulator():
    from gcp_storage_emulator.server import create_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="noetl-gcs")
    server.start()
    yield ("127.0.0.1", port)
    server.stop()


def test_gcs_tasks_count_the_bytes_on_the_wire(tmp_path, gcs_emulator):
    relay = Relay(gcs_emulator)
    pb = tmp_path / "gcs.yaml"
    pb.write_text(
        textwrap.dedent(f"""\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {{name: gcs_usage, path: tests/gcs_usage}}
        workflow:
          - step: start
            tool:
              - put:
                  kind: gcs
                  operation: write
                  endpoint: http://127.0.0.1:{relay.port}
                  destination: gs://noetl-gcs/usage/blob.txt
                  data: "{"g" * 60_000}"
              - get:
                  kind: gcs
                  operation: read
                  endpoint: http://127.0.0.1:{relay.port}
                  source: gs://noetl-gcs/usage/blob.txt
              - down:
                  kind: gcs
                  operation: download
                  endpoint: http://127.0.0.1:{relay.port}
                  source: gs://noetl-gcs/usage/blob.txt
                  destination: copy.txt
              - up:
                  kind: gcs
                  operation: upload
                  endpoint: http://127.0.0.1:{relay.port}
                  source: copy.txt
                  destination: gs://noetl-gcs/usage/copy.txt
                  content_type: text/plain
        """),
        encoding="utf-8",
    )
    try:
        res = run_playbook(pb, data_dir=tmp_path / "data", event_store=f"sqlite:///{tmp_path / 'events.db'}")
        assert res.status == "completed", res
        with open_event_store(res.event_store_url) as store:
            events = store.read(res.execution_id)
        usage = {e.data["task"]: e.data["outcome"]["meta"]["usage"] for e in events if e.name == "task.done"}
        for name in ("put", "up"):  # write and upload: the object goes out
            assert 60_000 < usage[name]["net_out_bytes"] < 64_000 and usage[name]["net_in_bytes"] < 4_000, (
                usage
            )
        for name in ("get", "down"):  # read and download: it comes in
            assert 60_000 < usage[name]["net_in_bytes"] < 64_000 and usage[name]["net_out_bytes"] < 4_000, (
                usage
            )
        sent = sum(u["net_out_bytes"] for u in usage.values())
        received = sum(u["net_in_bytes"] for u in usage.values())
        # exact but for one exchange: download asks gcsfs for the object's info, which races a GET of
        # the object against a directory listing and cancels the loser once the GET answers; the
        # listing's bytes (about 200 each way here) crossed the wire but a cancelled request is not
        # counted (no response reaches the client hooks). write and read alone match exactly:
        # test_write_and_read_match_the_wire_exactly.
        up, down = relay.wire
        assert 0 <= up - sent < 1_000 and 0 <= down - received < 1_000, (usage, relay.up, relay.down)
        assert not any("egress_bytes" in u for u in usage.values())  # 127.0.0.1 is inside the cluster
    finally:
        relay.close()


def test_write_and_read_match_the_wire_exactly(tmp_path, gcs_emulator):
    relay = Relay(gcs_emulator)
    pb = tmp_path / "gcs2.yaml"
    pb.write_text(
        textwrap.dedent(f"""\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {{name: gcs_exact, path: tests/gcs_exact}}
        workflow:
          - step: start
            tool:
              - put:
                  kind: gcs
                  operation: write
                  endpoint: http://127.0.0.1:{relay.port}
                  destination: gs://noetl-gcs/exact/blob.json
                  data: {{rows: "{"r" * 30_000}"}}
              - get:
                  kind: gcs
                  operation: read
                  endpoint: http://127.0.0.1:{relay.port}
                  source: gs://noetl-gcs/exact/blob.json
        """),
        encoding="utf-8",
    )
    try:
        res = run_playbook(pb, data_dir=tmp_path / "data", event_store=f"sqlite:///{tmp_path / 'events.db'}")
        assert res.status == "completed", res
        with open_event_store(res.event_store_url) as store:
            events = store.read(res.execution_id)
        usage = [e.data["outcome"]["meta"]["usage"] for e in events if e.name == "task.done"]
        sent = sum(u["net_out_bytes"] for u in usage)
        received = sum(u["net_in_bytes"] for u in usage)
        assert (sent, received) == relay.wire, (usage, relay.up, relay.down, relay.interim)
    finally:
        relay.close()
