"""The shared NATS layout (storage/nats_streams.py) against the real nats-server with JetStream."""

from __future__ import annotations

import uuid

import pytest

from noetl_dagster.engine.events import TASK_DONE, Event
from noetl_dagster.storage import nats_streams as ns

NATS_URL = "nats://127.0.0.1:4222"


def test_shard_is_stable_and_in_range():
    # a fixed vector: every process and release must agree on a tenant's streams
    assert ns.shard_of("t_acme_lab", "p_genomics_01") == ns.shard_of("t_acme_lab", "p_genomics_01")
    assert ns.shard_of("t_acme_lab", "p_genomics_01", shard_count=256) == "s0030"
    from noetl_dagster.dsl.locator import object_prefix

    assert "shard=s0030/" in object_prefix("t_acme_lab", "p_genomics_01")  # the archive names the same shard
    shards = {ns.shard_of(f"t{i}", "p", shard_count=16) for i in range(400)}
    assert shards == {f"s{i:04d}" for i in range(16)}


def test_names_follow_the_seed():
    p = ns.Placement(region="usw2", cell="usw2-a", shard="s0042")
    assert (p.events_stream, p.commands_stream, p.dlq_stream, p.archive_ack_stream) == (
        "NOETL_EVT_usw2_s0042",
        "NOETL_CMD_usw2_s0042",
        "NOETL_DLQ_usw2_s0042",
        "NOETL_ARCHIVE_ACK_usw2_s0042",
    )
    assert p.event_subject("t_acme", "p.1", "e*1") == "noetl.evt.usw2.s0042.t_acme.p~2E1.e~2A1"
    q = ns.placement_of("t_acme_lab", "p_genomics_01", region="usw2")
    assert q.object_prefix("t_acme_lab", "p_genomics_01") == (
        "noetl/env=dev/region=usw2/cell=usw2-a/shard=s0030/tenant=t_acme_lab/project=p_genomics_01/"
    )


def test_bad_region_is_refused_with_the_rule():
    with pytest.raises(ns.StreamLayoutError, match=r"region 'us\.west'.*letters, digits"):
        ns.placement_of("t", "p", region="us.west")


def test_tokens_are_reversible_and_never_split_a_subject():
    names = ["a.b", "a~2Eb", "*", ">", "a b", "", "~", "ünï", "a_b-c"]
    toks = [ns.token(n) for n in names]
    assert len(set(toks)) == len(names)
    for t in toks:
        assert "." not in t and "*" not in t and ">" not in t and " " not in t and t


def test_envelope_round_trips_the_event():
    e = Event(
        TASK_DONE,
        "exec-1",
        data={"x": 1},
        step="s",
        step_run_id="sr",
        task_run_id="tr",
        tenant_id="t_acme",
        project_id="p1",
        sequence=7,
        attempt=2,
    )
    p = ns.placement_of("t_acme", "p1", region="usw2")
    rec = ns.envelope(e, p)
    for key in (
        "event_id",
        "schema_version",
        "tenant_id",
        "project_id",
        "execution_id",
        "step_id",
        "task_id",
        "region",
        "cell",
        "shard",
        "causation_id",
        "correlation_id",
    ):
        assert key in rec
    assert rec["shard"] == p.shard and rec["cell"] == "usw2-a" and rec["causation_id"] == "tr"
    back = ns.event_of(ns.decode(ns.encode(rec)))
    assert back.to_dict() == e.to_dict()


def test_connect_creates_the_four_streams_and_publishes():
    region = "t" + uuid.uuid4().hex[:8]
    p = ns.placement_of("tenant", "proj", region=region)
    with ns.connect(NATS_URL) as client:
        try:
            client.ensure_streams(p)
            client.ensure_streams(p)  # idempotent
            ack = client.call(
                client.js.publish(
                    p.event_subject("tenant", "proj", "e1"), b"{}", headers={"Nats-Msg-Id": "x1"}
                )
            )
            dup = client.call(
                client.js.publish(
                    p.event_subject("tenant", "proj", "e1"), b"{}", headers={"Nats-Msg-Id": "x1"}
                )
            )
            assert ack.stream == p.events_stream and dup.duplicate and dup.seq == ack.seq
            for name in (p.events_stream, p.commands_stream, p.dlq_stream, p.archive_ack_stream):
                assert client.call(client.js.stream_info(name)).config.name == name
        finally:
            for name in (p.events_stream, p.commands_stream, p.dlq_stream, p.archive_ack_stream):
                client.call(client.js.delete_stream(name))


def test_connect_to_nothing_says_where():
    with pytest.raises(ConnectionError, match="127.0.0.1:1"):
        ns.connect("nats://127.0.0.1:1", connect_timeout=1)


def test_event_stream_names_lists_the_regions_event_streams_only():
    region = "t" + uuid.uuid4().hex[:8]
    shards = [ns.placement_of(t, "p", region=region) for t in ("a", "b")]
    other = ns.placement_of("a", "p", region=region + "x")
    with ns.connect(NATS_URL) as client:
        try:
            for p in (*shards, other):
                client.ensure_streams(p)
            names = client.call(client.event_stream_names(region))
            assert names == sorted({p.events_stream for p in shards})
        finally:
            for p in (*shards, other):
                for cfg in ns.stream_configs(p):
                    try:
                        client.call(client.js.delete_stream(cfg["name"]))
                    except Exception:  # noqa: BLE001, S110 - the same shard twice
                        pass
