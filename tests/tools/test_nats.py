"""kind: nats against the machine's NATS server with JetStream (127.0.0.1:4222)."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from pathlib import Path

import nats
import pytest

from noetl_dagster.dsl import load_playbook
from noetl_dagster.dsl.kinds import ToolConfigError, get_tool
from noetl_dagster.engine.ports import ToolError
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.tools.nats import nats_tool

URL = "nats://127.0.0.1:4222"
FIXTURE = Path("/work/shared/conformance/noetl-e2e/fixtures/playbooks/test_nats_kv.yaml")


def _run(coro):
    return asyncio.run(coro)


@pytest.fixture
def stream():
    name = f"NOETL_T_{uuid.uuid4().hex[:8].upper()}"

    async def make():
        nc = await nats.connect(URL)
        await nc.jetstream().add_stream(name=name, subjects=[f"{name.lower()}.>"])
        await nc.close()

    async def drop():
        nc = await nats.connect(URL)
        await nc.jetstream().delete_stream(name)
        await nc.close()

    _run(make())
    yield name
    _run(drop())


@pytest.fixture
def responder():
    """A real NATS service on its own thread: replies {echo: <request>, n: len}."""
    subject = f"noetl.test.svc.{uuid.uuid4().hex[:8]}"
    ready, stop = threading.Event(), threading.Event()

    def serve():
        async def main():
            nc = await nats.connect(URL)

            async def handle(msg):
                body = json.loads(msg.data)
                await msg.respond(json.dumps({"echo": body, "n": len(body)}).encode())

            await nc.subscribe(subject, cb=handle)
            await nc.flush()
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            await nc.close()

        asyncio.run(main())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    assert ready.wait(10)
    yield subject
    stop.set()
    t.join(5)


def test_publish_and_request_reply(responder, make_ctx):
    ctx = make_ctx()
    out = nats_tool(
        {"operation": "request", "subject": responder, "data": {"a": 1, "b": [1, 2]}, "servers": URL}, ctx
    )
    assert out["data"] == {"echo": {"a": 1, "b": [1, 2]}, "n": 2}
    assert nats_tool({"operation": "publish", "subject": responder + ".x", "data": "hello"}, ctx) == {
        "subject": responder + ".x",
        "bytes": 5,
    }


def test_jetstream_publish_and_durable_consume_resumes(stream, make_ctx):
    ctx = make_ctx()
    subj = f"{stream.lower()}.orders"
    acks = [
        nats_tool(
            {"operation": "js_publish", "subject": subj, "data": {"i": i}, "headers": {"k": str(i)}}, ctx
        )
        for i in range(25)
    ]
    assert [a["seq"] for a in acks] == list(range(1, 26)) and acks[0]["stream"] == stream
    first = nats_tool(
        {"operation": "js_consume", "stream": stream, "subject": subj, "durable": "w1", "batch": 10}, ctx
    )
    second = nats_tool(
        {
            "operation": "js_consume",
            "stream": stream,
            "subject": subj,
            "durable": "w1",
            "batch": 100,
            "timeout": 0.5,
        },
        ctx,
    )
    assert [m["data"]["i"] for m in first["messages"]] == list(range(10))
    assert [m["data"]["i"] for m in second["messages"]] == list(
        range(10, 25)
    )  # acked ones are not redelivered
    assert first["messages"][3]["headers"] == {"k": "3"} and first["messages"][3]["seq"] == 4
    # an ephemeral consumer reads from the start; info and get_msg
    assert nats_tool({"operation": "js_consume", "stream": stream, "batch": 5}, ctx)["count"] == 5
    info = nats_tool({"operation": "js_stream_info", "stream": stream}, ctx)
    assert info["messages"] == 25 and info["last_seq"] == 25
    assert nats_tool({"operation": "js_get_msg", "stream": stream, "seq": 7}, ctx)["data"] == {"i": 6}


def test_kv_put_get_delete(make_ctx):
    ctx = make_ctx()
    bucket = f"noetl_t_{uuid.uuid4().hex[:8]}"
    try:
        put = nats_tool({"operation": "kv_put", "bucket": bucket, "key": "k1", "value": {"x": 1}}, ctx)
        assert put["revision"] == 1
        assert nats_tool({"operation": "kv_get", "bucket": bucket, "key": "k1"}, ctx)["value"] == {"x": 1}
        assert nats_tool({"operation": "kv_keys", "bucket": bucket}, ctx)["keys"] == ["k1"]
        nats_tool({"operation": "kv_delete", "bucket": bucket, "key": "k1"}, ctx)
        assert nats_tool({"operation": "kv_get", "bucket": bucket, "key": "k1"}, ctx)["found"] is False
    finally:

        async def drop():
            nc = await nats.connect(URL)
            await nc.jetstream().delete_key_value(bucket)
            await nc.close()

        _run(drop())


def test_failures_are_error_outcomes(make_ctx):
    ctx = make_ctx()
    with pytest.raises(ToolError) as ei:
        nats_tool(
            {"operation": "request", "subject": f"nobody.{uuid.uuid4().hex}", "data": "x", "timeout": 1}, ctx
        )
    assert ei.value.kind in ("no_responders", "timeout")
    with pytest.raises(ToolError) as ei:
        nats_tool({"operation": "publish", "subject": "x", "servers": "nats://127.0.0.1:1"}, ctx)
    assert ei.value.kind == "connection_error" and ei.value.retryable
    with pytest.raises(ToolError) as ei:
        nats_tool({"operation": "js_stream_info", "stream": "NO_SUCH_STREAM_NOETL"}, ctx)
    assert ei.value.kind == "not_found"
    with pytest.raises(ToolError, match="KV bucket 'no_such_bucket_noetl' does not exist"):
        nats_tool({"operation": "kv_get", "bucket": "no_such_bucket_noetl", "key": "k"}, ctx)


def test_bad_config_is_a_clear_validation_error(make_ctx):
    with pytest.raises(ToolConfigError, match="kind 'nats': invalid config: operation"):
        get_tool("nats").check_config({"operation": "subscribe_forever"})
    with pytest.raises(ToolError, match="operation publish needs subject"):
        nats_tool({"operation": "publish"}, make_ctx())


def test_core_fixture_test_nats_kv_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("NOETL_CREDENTIAL_NATS_CREDENTIAL", json.dumps({"nats_url": URL}))
    res = run_playbook(load_playbook(str(FIXTURE)), data_dir=tmp_path)
    assert res.status == "completed", res
    assert res.results["kv_get"]["value"]["email"] == "test@example.com"
