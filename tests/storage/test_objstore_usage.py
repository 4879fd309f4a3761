"""Object-store network bytes in the task's measured usage (issue 18.1): S3 through s3fs against
moto in server mode, with a byte-counting TCP relay in front of it as the ground truth — the
usage must equal the bytes that crossed the wire, both ways; egress when the endpoint's host is
outside the cluster."""

from __future__ import annotations

import socket
import textwrap
import threading

import pytest
from aiohttp.abc import AbstractResolver

from noetl_dagster.engine.usage import Meter
from noetl_dagster.storage.object_stores import S3PayloadStore

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Relay:
    """A TCP relay to ``upstream`` on a loopback port, counting the bytes each way."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.up = 0  # client -> server
        self.down = 0  # server -> client
        self.interim = 0  # bytes of interim "100 Continue" responses, which the client never sees
        self._tail = b""
        self._lock = threading.Lock()
        self._srv = socket.create_server(("127.0.0.1", 0))
        self.port = self._srv.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def reset(self) -> None:
        with self._lock:
            self.up = self.down = self.interim = 0

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self._srv.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._pipe, args=(client, server, "up"), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, "down"), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, direction: str) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    setattr(self, direction, getattr(self, direction) + len(data))
                    if direction == "down":
                        seen = self._tail + data
                        self.interim += seen.count(_CONTINUE) * len(_CONTINUE)
                        self._tail = seen[-(len(_CONTINUE) - 1) :] if not seen.endswith(_CONTINUE) else b""
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    @property
    def wire(self) -> tuple[int, int]:
        """(bytes up, bytes down without the interim responses)."""
        return self.up, self.down - self.interim

    def close(self) -> None:
        self._stop = True
        self._srv.close()


@pytest.fixture
def relay(s3_bucket):
    endpoint, bucket, _ = s3_bucket
    host, port = endpoint.removeprefix("http://").split(":")
    r = Relay((host, int(port)))
    yield r, bucket
    r.close()


def _store(bucket: str, endpoint: str, **kw) -> S3PayloadStore:
    return S3PayloadStore(bucket, "usage", endpoint_url=endpoint, key="testing", secret="testing", **kw)


def test_s3_writes_and_reads_count_the_bytes_on_the_wire(relay):
    r, bucket = relay
    store = _store(bucket, f"http://127.0.0.1:{r.port}")
    value = {"blob": "x" * 300_000}
    r.reset()
    meter = Meter()
    ref = store.put_json("big.json", value)
    put = meter.stop()
    assert (put["net_out_bytes"], put["net_in_bytes"]) == r.wire, (put, r.up, r.down, r.interim)
    assert 300_000 < put["net_out_bytes"] < 300_000 + 4_000  # the body and a few request heads
    assert "egress_bytes" not in put  # 127.0.0.1 is inside the cluster

    r.reset()
    meter = Meter()
    assert store.get_json(ref) == value
    got = meter.stop()
    assert (got["net_out_bytes"], got["net_in_bytes"]) == r.wire, (got, r.up, r.down, r.interim)
    assert 300_000 < got["net_in_bytes"] < 300_000 + 4_000
    assert got["bytes_read"] == ref.size


def test_streamed_read_of_an_object_is_counted_when_its_body_ends(relay):
    r, bucket = relay
    store = _store(bucket, f"http://127.0.0.1:{r.port}")
    uri = store.put_bytes("blob.bin", b"b" * 120_000)
    r.reset()
    meter = Meter()
    with store.open_read(uri) as fh:
        assert len(fh.read()) == 120_000
    u = meter.stop()
    assert (u["net_out_bytes"], u["net_in_bytes"]) == r.wire
    assert u["net_in_bytes"] > 120_000


def test_outside_a_task_nothing_is_counted_and_nothing_breaks(relay):
    r, bucket = relay
    store = _store(bucket, f"http://127.0.0.1:{r.port}")
    uri = store.put_bytes("plain.bin", b"abc")
    assert store.get_bytes(uri) == b"abc"


class _StaticResolver(AbstractResolver):
    """DNS for the test: every name resolves to the loopback relay (as /etc/hosts would)."""

    def __init__(self, port: int):
        self.port = port

    async def resolve(self, host, port=0, family=socket.AF_INET):
        return [
            {
                "hostname": host,
                "host": "127.0.0.1",
                "port": port,
                "family": socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
        ]

    async def close(self):
        pass


def test_an_endpoint_outside_the_cluster_is_egress(relay):
    r, bucket = relay
    store = _store(
        bucket,
        f"http://s3.us-east-1.amazonaws.com:{r.port}",
        config_kwargs={"connector_args": {"resolver": _StaticResolver(r.port)}},
    )
    r.reset()
    meter = Meter()
    store.put_bytes("egress.bin", b"e" * 50_000)
    u = meter.stop()
    assert (u["net_out_bytes"], u["net_in_bytes"]) == r.wire
    assert u["egress_bytes"] == u["net_out_bytes"] > 50_000


def test_a_task_that_offloads_its_result_to_s3_has_the_network_bytes_in_its_usage(tmp_path, relay):
    from noetl_dagster.runners.local import build_services, run_playbook
    from noetl_dagster.storage.event_stores import open_event_store

    r, bucket = relay
    store = _store(bucket, f"http://127.0.0.1:{r.port}")
    pb = tmp_path / "s3usage.yaml"
    pb.write_text(
        textwrap.dedent("""\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: s3usage, path: tests/s3usage}
        workflow:
          - step: start
            tool:
              - big:
                  kind: python
                  code: |
                    result = ["row %d %s" % (i, "y" * 40) for i in range(5000)]
        """),
        encoding="utf-8",
    )
    db = f"sqlite:///{tmp_path / 'events.db'}"
    svc = build_services(event_store=db, data_dir=tmp_path / "data", payload_store=store)
    r.reset()
    res = run_playbook(pb, services=svc)
    assert res.status == "completed", res
    es = open_event_store(res.event_store_url)
    try:
        events = es.read(res.execution_id)
    finally:
        es.close()
    usage = next(e.data["outcome"]["meta"]["usage"] for e in events if e.name == "task.done")
    ref = next(e.data["outcome"]["result"]["$ref"] for e in events if e.name == "task.done")
    assert usage["bytes_written"] == ref["size"] > 200_000
    assert ref["size"] < usage["net_out_bytes"] <= r.up


def test_parallel_iterations_each_carry_their_own_upload(tmp_path, relay):
    """Three iterations in flight at once, each offloading a result of its own size to S3 through
    the same client: each task's usage holds its own upload (the counters follow the context)."""
    from noetl_dagster.runners.local import build_services, run_playbook
    from noetl_dagster.storage.event_stores import open_event_store

    r, bucket = relay
    store = _store(bucket, f"http://127.0.0.1:{r.port}")
    pb = tmp_path / "par.yaml"
    pb.write_text(
        textwrap.dedent("""\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: s3par, path: tests/s3par}
        workflow:
          - step: start
            loop:
              in: "{{ [100, 200, 300] }}"
              iterator: item
              spec: {mode: parallel, max_in_flight: 3}
            tool:
              - big:
                  kind: python
                  input: {k: "{{ iter.item }}"}
                  code: |
                    import time
                    time.sleep(0.2)
                    result = "z" * (k * 1000)
        """),
        encoding="utf-8",
    )
    svc = build_services(
        event_store=f"sqlite:///{tmp_path / 'events.db'}", data_dir=tmp_path / "data", payload_store=store
    )
    r.reset()
    res = run_playbook(pb, services=svc)
    assert res.status == "completed", res
    with open_event_store(res.event_store_url) as es:
        events = es.read(res.execution_id)
    done = sorted(
        (e.data["outcome"]["result"]["$ref"]["size"], e.data["outcome"]["meta"]["usage"])
        for e in events
        if e.name == "task.done"
    )
    assert [size // 1000 for size, _ in done] == [100, 200, 300]
    for size, usage in done:
        assert size < usage["net_out_bytes"] < size + 4_000, (size, usage)
    assert sum(u["net_out_bytes"] for _, u in done) <= r.up
