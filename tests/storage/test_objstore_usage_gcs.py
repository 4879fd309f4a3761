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
    pb.write_text(textwrap.dedent(f"""\
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
                  data: "{'g' * 60_000}"
              - get:
                  kind: gcs
                  operation: read
                  endpoint: http://127.0.0.1:{relay.port}
                  source: gs://noetl-gcs/usage/blob.txt
        """), encoding="utf-8")
    try:
        res = run_playbook(pb, data_dir=tmp_path / "data", event_store=f"sqlite:///{tmp_path / 'events.db'}")
        assert res.status == "completed", res
        with open_event_store(res.event_store_url) as store:
            events = store.read(res.execution_id)
        usage = {e.data["task"]: e.data["outcome"]["meta"]["usage"] for e in events if e.name == "task.done"}
        put, get = usage["put"], usage["get"]
        assert 60_000 < put["net_out_bytes"] < 64_000 and put["net_in_bytes"] < 4_000
        assert 60_000 < get["net_in_bytes"] < 64_000 and get["net_out_bytes"] < 4_000
        sent = put["net_out_bytes"] + get["net_out_bytes"]
        received = put["net_in_bytes"] + get["net_in_bytes"]
        assert (sent, received) == relay.wire, (usage, relay.up, relay.down, relay.interim)
        assert "egress_bytes" not in put and "egress_bytes" not in get  # 127.0.0.1 is inside the cluster
    finally:
        relay.close()
