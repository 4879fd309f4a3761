"""``kind: qdrant`` through the real engine, on qdrant-client local mode on disk."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import uuid

import pyarrow as pa
import pytest
from qdrant_client import QdrantClient
from qdrant_helpers import qstep

from noetl_dagster.resources.qdrant import QdrantResource
from noetl_dagster.tools import qdrant as q
from noetl_dagster.tools.registry import ToolError, get_tool

# Four points on the unit axes of a 4-d space, with payloads to filter on.
POINTS = [
    {"id": 1, "vector": [1.0, 0.0, 0.0, 0.0], "payload": {"city": "Berlin", "n": 1, "tags": ["a"]}},
    {"id": 2, "vector": [0.9, 0.1, 0.0, 0.0], "payload": {"city": "Paris", "n": 2, "tags": ["b"]}},
    {"id": 3, "vector": [0.0, 1.0, 0.0, 0.0], "payload": {"city": "Berlin", "n": 3, "tags": ["a", "b"]}},
    {"id": 4, "vector": [0.0, 0.0, 1.0, 0.0], "payload": {"city": "Rome", "n": 4, "tags": []}},
]


def test_kind_is_registered():
    assert get_tool("qdrant") is not None


def test_create_upsert_query_delete(run, home):
    r = run([
        qstep("create", operation="create", collection="c", dimension=4, distance="cosine"),
        qstep("upsert", operation="upsert", collection="c", points="{{ workload.points }}"),
        qstep("query", operation="query", collection="c", vector=[1.0, 0.0, 0.0, 0.0], limit=2),
        qstep("delete", operation="delete", collection="c", ids=[2]),
        qstep("after", operation="query", collection="c", vector=[1.0, 0.0, 0.0, 0.0], limit=2, with_payload=False),
        qstep("info", operation="info", collection="c"),
    ], {"points": POINTS})  # fmt: skip
    assert r.status == "completed", r.result.to_json()
    res = r.results
    assert res["create"] == {"collection": "c", "operation": "create", "created": True, "dimension": 4,
                             "distance": "cosine", "count": 0}  # fmt: skip
    assert res["upsert"] == {"collection": "c", "operation": "upsert", "count": 4, "points_count": 4}
    hits = res["query"]["hits"]
    assert res["query"]["count"] == 2
    assert [h["id"] for h in hits] == [1, 2]
    assert hits[0]["score"] == pytest.approx(1.0)
    assert hits[0]["payload"] == {"city": "Berlin", "n": 1, "tags": ["a"]}
    assert res["delete"] == {"collection": "c", "operation": "delete", "count": 1, "points_count": 3}
    assert [h["id"] for h in res["after"]["hits"]] == [1, 3]
    assert "payload" not in res["after"]["hits"][0]
    assert res["info"]["count"] == 3 and res["info"]["dimension"] == 4
    # the default location is <data_dir>/qdrant, on disk
    assert (home / "qdrant" / "collection" / "c").is_dir()


def test_payload_filters(run):
    r = run([
        qstep("load", operation="upsert", collection="f", create_if_missing=True, points="{{ workload.points }}"),
        qstep("match", collection="f", vector=[1, 0, 0, 0], filter={"city": "Berlin"}),
        qstep("any", collection="f", vector=[1, 0, 0, 0], filter={"city": ["Paris", "Rome"]}),
        qstep("range", collection="f", vector=[1, 0, 0, 0], filter={"n": {"gte": 2, "lt": 4}}),
        qstep("native", collection="f", vector=[1, 0, 0, 0],
              filter={"must": [{"key": "tags", "match": {"value": "b"}}], "must_not": [{"key": "city", "match": {"value": "Paris"}}]}),
        qstep("count", operation="count", collection="f", filter={"city": "Berlin"}),
        qstep("scroll", operation="scroll", collection="f", filter={"n": {"gt": 1}}, limit=10),
        qstep("drop_berlin", operation="delete", collection="f", filter={"city": "Berlin"}),
        qstep("left", operation="count", collection="f"),
    ], {"points": POINTS})  # fmt: skip
    assert r.status == "completed", r.result.to_json()
    ids = {k: sorted(h["id"] for h in r.results[k]["hits"]) for k in ("match", "any", "range", "native")}
    assert ids == {"match": [1, 3], "any": [2, 4], "range": [2, 3], "native": [3]}
    assert r.results["count"]["count"] == 2
    assert sorted(p["id"] for p in r.results["scroll"]["points"]) == [2, 3, 4]
    assert r.results["drop_berlin"]["count"] == 2
    assert r.results["left"]["count"] == 2


def test_bad_filter_is_a_config_error(run):
    r = run([
        qstep("load", operation="upsert", collection="bf", create_if_missing=True, points="{{ workload.points }}"),
        qstep("bad", collection="bf", vector=[1, 0, 0, 0], filter={"n": {"between": [1, 2]}}),
    ], {"points": POINTS})  # fmt: skip
    assert r.status == "failed"
    err = r.error("bad")
    assert err["kind"] == "config_error" and "filter on 'n'" in err["message"]


def test_dimension_mismatch_is_a_clear_error(run):
    bad = [{"id": 9, "vector": [1.0, 0.0, 0.0]}]
    r = run([
        qstep("create", operation="create", collection="d", dimension=4),
        qstep("upsert", operation="upsert", collection="d", points="{{ workload.bad }}"),
    ], {"bad": bad})  # fmt: skip
    assert r.status == "failed"
    err = r.error("upsert")
    assert err["kind"] == "qdrant_dimension" and err["retryable"] is False
    assert "expects vectors of dimension 4" in err["message"] and "has 3" in err["message"]

    r = run([
        qstep("create", operation="create", collection="d", dimension=4),
        qstep("query", operation="query", collection="d", vector=[1, 0]),
    ])  # fmt: skip
    err = r.error("query")
    assert err["kind"] == "qdrant_dimension" and "dimension 4, got 2" in err["message"]

    r = run([qstep("again", operation="create", collection="d", dimension=8)])
    err = r.error("again")
    assert err["kind"] == "qdrant_dimension" and "exists with dimension 4, not 8" in err["message"]


def test_ragged_arrow_vectors_are_refused():
    table = pa.table({"id": [1, 2], "vector": pa.array([[1.0, 0.0], [1.0]], type=pa.list_(pa.float32()))})
    with pytest.raises(ToolError) as e:
        q.points_from_arrow(table)
    assert e.value.kind == "qdrant_dimension" and "differ in length" in e.value.message


def test_missing_collection(run):
    r = run([qstep("query", operation="query", collection="nope", vector=[1, 0])])
    assert r.status == "failed"
    err = r.error("query")
    assert err["kind"] == "qdrant_not_found" and err["retryable"] is False
    assert "'nope' does not exist" in err["message"]
    r = run([qstep("upsert", operation="upsert", collection="nope", points=[{"id": 1, "vector": [1, 0]}])])
    assert r.error("upsert")["kind"] == "qdrant_not_found"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.filterwarnings("ignore:Api key is used with an insecure connection")  # the point of this test
def test_server_down_is_retryable_and_the_key_is_redacted(run, monkeypatch):
    secret = "qd-key-" + uuid.uuid4().hex
    cred = {"url": f"http://127.0.0.1:{_free_port()}", "api_key": secret}
    monkeypatch.setenv("NOETL_CREDENTIAL_QDRANT_PROD", json.dumps(cred))
    step = qstep("query", operation="query", collection="c", vector=[1, 0], auth="qdrant_prod", timeout=2)
    step["tool"]["spec"] = {"policy": {"rules": [
        {"when": "{{ outcome.error.retryable }}", "then": {"do": "retry", "attempts": 2, "delay": 0}},
    ]}}  # fmt: skip
    r = run([step])
    assert r.status == "failed"
    done = r.task_done("query")
    assert len(done) == 2  # retried once because the error is retryable
    err = done[-1].data["outcome"]["error"]
    assert err["kind"] == "qdrant_unavailable" and err["retryable"] is True
    assert "server unreachable" in err["message"]
    assert secret not in json.dumps([e.data for e in r.events], default=str)


def test_reupsert_is_idempotent_by_point_id(run):
    docs = [{"id": f"doc-{i}", "vector": [1.0, float(i), 0.0], "title": f"t{i}"} for i in range(5)]
    changed = [dict(docs[0], title="new title"), *docs[1:]]
    r = run([
        qstep("first", operation="upsert", collection="idem", create_if_missing=True, points="{{ workload.docs }}"),
        qstep("second", operation="upsert", collection="idem", points="{{ workload.docs }}"),
        qstep("third", operation="upsert", collection="idem", points="{{ workload.changed }}"),
        qstep("get", operation="retrieve", collection="idem", ids=["doc-0", "doc-4"]),
        qstep("near", collection="idem", vector=[1.0, 0.0, 0.0], limit=1),
    ], {"docs": docs, "changed": changed})  # fmt: skip
    assert r.status == "completed", r.result.to_json()
    assert [r.results[s]["points_count"] for s in ("first", "second", "third")] == [5, 5, 5]
    got = {p["id"]: p["payload"] for p in r.results["get"]["points"]}
    # string ids come back as given; the payload is replaced, not merged into a duplicate
    assert got == {"doc-0": {"title": "new title"}, "doc-4": {"title": "t4"}}
    assert r.results["near"]["hits"][0]["id"] == "doc-0"


def test_rows_from_duckdb_feed_an_upsert(run):
    r = run([
        {"step": "make", "tool": {"kind": "duckdb", "query":
            "SELECT i AS id, [i::FLOAT, 1.0, 0.0] AS vector, 'g' || (i % 2) AS grp FROM range(6) t(i)"}},
        qstep("load", operation="upsert", collection="rows", create_if_missing=True, distance="euclid",
              points="{{ make }}"),
        qstep("near", collection="rows", vector=[5.0, 1.0, 0.0], limit=2, filter={"grp": "g0"}),
    ])  # fmt: skip
    assert r.status == "completed", r.result.to_json()
    assert r.results["load"]["count"] == 6
    hits = r.results["near"]["hits"]
    assert [h["id"] for h in hits] == [4, 2] and hits[0]["payload"] == {"grp": "g0"}


def test_text_with_embedding(run):
    docs = [
        {"id": 1, "text": "vector search with qdrant collections"},
        {"id": 2, "text": "relational tables in postgres"},
        {"id": 3, "text": "orchestrating pipelines with dagster"},
    ]
    emb = {"model": "hashing", "dim": 64}
    r = run([
        qstep("create", operation="create", collection="t", embedding=emb),
        qstep("load", operation="upsert", collection="t", embedding=emb, points="{{ workload.docs }}"),
        qstep("ask", collection="t", embedding=emb, text="qdrant vector collections", limit=1),
    ], {"docs": docs})  # fmt: skip
    assert r.status == "completed", r.result.to_json()
    assert r.results["create"]["dimension"] == 64
    hit = r.results["ask"]["hits"][0]
    assert hit["id"] == 1 and hit["payload"]["text"] == docs[0]["text"]


def test_config_errors_are_clear(run):
    r = run([qstep("x", operation="upsert", collection="c")])
    assert r.error("x") == {"kind": "config_error", "message": "qdrant: upsert needs points (`points`, `records`, `input` or `data`)",
                            "retryable": False, "code": None}  # fmt: skip
    r = run(
        [qstep("x", operation="upsert", collection="c", create_if_missing=True, points=[{"vector": [1, 2]}])]
    )
    assert "has no 'id'" in r.error("x")["message"]
    r = run([qstep("x", operation="rename", collection="c")])
    assert "unknown operation 'rename'" in r.error("x")["message"]
    r = run([qstep("x", operation="create", collection="c", dimension=3, distance="hamming")])
    assert "unknown distance" in r.error("x")["message"]
    r = run([qstep("x", operation="delete", collection="c")])
    assert r.error("x")["kind"] in ("config_error", "qdrant_not_found")


def test_one_shared_client_per_path(run, home):
    steps = [
        qstep(
            "load",
            operation="upsert",
            collection="s",
            create_if_missing=True,
            points=[{"id": 1, "vector": [1, 0]}],
        )
    ]
    assert run(steps).status == "completed"
    assert run(steps).status == "completed"  # a second execution in this process reuses the client
    shared = q.shared_client(path=home / "qdrant")
    assert QdrantResource(path=str(home / "qdrant")).get_client() is shared.client
    # what the sharing avoids: a second client on the same path fails, even in one process
    with pytest.raises(RuntimeError, match="already accessed"):
        QdrantClient(path=str(home / "qdrant"))
    assert QdrantResource(path=str(home / "qdrant")).count("s") == 1


def test_path_held_by_another_process_is_a_retryable_error(run, tmp_path):
    path = tmp_path / "held"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from qdrant_client import QdrantClient
            c = QdrantClient(path={str(path)!r})
            print("ready", flush=True)
            sys.stdin.read()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "ready"
        r = run([qstep("q", operation="info", collection="c", path=str(path))])
        err = r.error("q")
        assert err["kind"] == "qdrant_locked" and err["retryable"] is True
        assert "one client per path" in err["message"]
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def test_drop_and_recreate_with_another_dimension(run):
    r = run([
        qstep("create", operation="create", collection="re", dimension=2),
        qstep("load", operation="upsert", collection="re", points=[{"id": 1, "vector": [1, 0]}]),
        qstep("ask2", collection="re", vector=[1, 0]),
        qstep("drop", operation="drop", collection="re"),
        qstep("gone", operation="count", collection="re"),
    ])  # fmt: skip
    assert r.results["drop"]["dropped"] is True
    assert r.error("gone")["kind"] == "qdrant_not_found"
    r = run([
        qstep("create", operation="create", collection="re", dimension=3, if_exists="recreate"),
        qstep("load", operation="upsert", collection="re", points=[{"id": 7, "vector": [0, 0, 1]}]),
        qstep("ask3", collection="re", vector=[0, 0, 1]),
    ])  # fmt: skip
    assert r.status == "completed", r.result.to_json()
    assert r.results["ask3"]["hits"][0]["id"] == 7
