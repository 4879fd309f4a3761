"""Qdrant IO manager: real Dagster runs, a real registry (SQLite) and qdrant-client local mode on disk."""

from __future__ import annotations

import dagster as dg
import numpy as np
import pyarrow as pa
import pytest

from noetl_dagster.dsl.locator import parse_locator
from noetl_dagster.io_managers.qdrant import (
    IndexHandle,
    QdrantIOManager,
    collection_name,
    open_index,
    parse_location,
)
from noetl_dagster.resources.qdrant import QdrantResource
from noetl_dagster.resources.registry import NoetlRegistryResource
from noetl_dagster.tools.qdrant.embeddings import get_embedder
from noetl_registry.client import open_registry
from noetl_registry.errors import Forbidden

URI = "noetl://acme/lab/search/index/docs"


@pytest.fixture
def registry_db(home):
    return f"sqlite:///{home / 'registry.db'}"


@pytest.fixture
def io_manager(registry_db, home):
    def make(tenant: str = "acme", project: str = "lab") -> QdrantIOManager:
        return QdrantIOManager(
            qdrant=QdrantResource(path=str(home / "qdrant")),
            registry=NoetlRegistryResource(url=registry_db, tenant=tenant, project=project),
        )

    return make


def _records(n: int = 12, dim: int = 3) -> list[dict]:
    return [
        {"id": i, "vector": [float(i), 1.0] + [0.0] * (dim - 2), "payload": {"n": i, "odd": i % 2 == 1}}
        for i in range(n)
    ]


def test_output_is_upserted_and_registered_as_an_index(io_manager, registry_db, home):
    seen: dict = {}

    @dg.asset(io_manager_key="index_io", metadata={"noetl/uri": URI + "@v1", "noetl/distance": "euclid"})
    def docs_index():
        return _records()

    @dg.asset(io_manager_key="index_io")
    def nearest(docs_index: IndexHandle) -> None:
        seen["handle"] = docs_index
        seen["hits"] = docs_index.query([11.0, 1.0, 0.0], limit=3, filter={"odd": True})
        seen["count"] = docs_index.count()

    result = dg.materialize([docs_index, nearest], resources={"index_io": io_manager()})
    assert result.success
    meta = {k: v.value for k, v in result.asset_materializations_for_node("docs_index")[0].metadata.items()}
    assert (
        meta["noetl/uri"] == URI + "@v1" and meta["noetl/dimension"] == 3 and meta["dagster/row_count"] == 12
    )
    assert meta["noetl/collection"] == "acme__lab__search__docs__v1"

    plan = open_registry(registry_db, tenant="acme", project="lab").resolve(URI + "@v1")
    assert plan.kind == "index" and plan.rows == 12
    assert plan.location.storage_type == "qdrant"
    assert (
        plan.location.uri
        == f"qdrant+file://{(home / 'qdrant').resolve()}?collection=acme__lab__search__docs__v1"
    )
    md = plan.metadata
    assert (md["dimension"], md["distance"], md["points"], md["collection"]) == (
        3,
        "euclid",
        12,
        "acme__lab__search__docs__v1",
    )
    assert md["location"] == plan.location.uri

    handle = seen["handle"]
    assert (handle.collection, handle.dimension, handle.points) == ("acme__lab__search__docs__v1", 3, 12)
    assert [h["id"] for h in seen["hits"]] == [11, 9, 7]
    assert seen["count"] == 12


def test_unversioned_uri_gets_numbered_versions_and_fresh_collections(io_manager, registry_db):
    @dg.asset(io_manager_key="index_io", metadata={"noetl/uri": URI})
    def docs_index():
        return _records(5)

    for _ in range(2):
        assert dg.materialize([docs_index], resources={"index_io": io_manager()}).success
    client = open_registry(registry_db, tenant="acme", project="lab")
    v1, v2 = client.resolve(URI + "@v1"), client.resolve(URI + "@v2")
    assert v1.metadata["collection"] != v2.metadata["collection"]
    assert client.resolve(URI).version == "v2"  # unversioned resolves to the newest


def test_rematerialising_a_version_upserts_by_id(io_manager, registry_db):
    batches = iter(
        [_records(6), _records(6)[:3] + [{"id": 100, "vector": [0.0, 0.0, 1.0], "payload": {"n": 100}}]]
    )

    @dg.asset(io_manager_key="index_io", metadata={"noetl/uri": URI + "@stable"})
    def docs_index():
        return next(batches)

    for _ in range(2):
        assert dg.materialize([docs_index], resources={"index_io": io_manager()}).success
    handle = open_index(open_registry(registry_db, tenant="acme", project="lab"), URI + "@stable")
    assert handle.collection == collection_name(parse_locator(URI + "@stable"))
    assert handle.count() == 7  # 6, the 3 re-sent ones replaced themselves, plus id 100


def test_arrow_table_output_and_text_queries(io_manager, registry_db):
    emb = {"model": "hashing", "dim": 32}
    texts = ["qdrant stores vectors", "postgres stores rows", "dagster runs ops"]
    vectors = get_embedder(emb).embed(texts)

    @dg.asset(io_manager_key="index_io", metadata={"noetl/uri": URI + "@arrow", "noetl/embedding": emb})
    def docs_index() -> pa.Table:
        flat = pa.array(vectors.reshape(-1), type=pa.float32())
        return pa.table(
            {"id": ["a", "b", "c"], "vector": pa.FixedSizeListArray.from_arrays(flat, 32), "text": texts}
        )

    assert dg.materialize([docs_index], resources={"index_io": io_manager()}).success
    handle = open_index(open_registry(registry_db, tenant="acme", project="lab"), URI + "@arrow")
    hits = handle.query(text="where are vectors stored", limit=1)
    assert hits[0]["id"] == "a" and hits[0]["payload"] == {"text": texts[0]}
    assert handle.retrieve(["c"])[0]["payload"]["text"] == "dagster runs ops"
    np.testing.assert_allclose(handle.query(vectors[1], limit=1)[0]["score"], 1.0, rtol=1e-5)


def _reader_job(uri: str):
    got: dict = {}

    @dg.op(ins={"index": dg.In(metadata={"noetl/uri": uri}, input_manager_key="index_io")})
    def read_index(index: IndexHandle) -> None:
        got["hits"] = index.query([1.0, 1.0, 0.0], limit=1)

    @dg.job
    def reader():
        read_index()

    return reader, got


def test_cross_tenant_read_is_denied_without_a_grant(io_manager, registry_db):
    @dg.asset(io_manager_key="index_io", metadata={"noetl/uri": URI + "@v1"})
    def docs_index():
        return _records(4)

    assert dg.materialize([docs_index], resources={"index_io": io_manager("acme", "lab")}).success

    job, got = _reader_job(URI + "@v1")
    other = {"index_io": io_manager("globex", "lab")}
    result = job.execute_in_process(resources=other, raise_on_error=False)
    assert not result.success
    cause = result.failure_data_for_node("read_index").error.cause
    assert cause.cls_name == "Forbidden" and "globex/lab may not read " + URI + "@v1" in cause.message
    assert "hits" not in got
    with pytest.raises(Forbidden):
        open_index(open_registry(registry_db, tenant="globex", project="lab"), URI + "@v1")

    open_registry(registry_db, tenant="acme", project="lab").grant(URI, "tenant:globex")
    result = job.execute_in_process(resources=other)
    assert result.success and got["hits"][0]["id"] == 1


def test_outputs_must_be_index_resources(io_manager):
    @dg.asset(io_manager_key="index_io", metadata={"noetl/uri": "noetl://acme/lab/search/dataset/docs@v1"})
    def docs_index():
        return _records(2)

    result = dg.materialize([docs_index], resources={"index_io": io_manager()}, raise_on_error=False)
    assert not result.success
    error = result.failure_data_for_node("docs_index").error
    assert "type 'index'" in error.message + (error.cause.message if error.cause else "")


def test_location_uris_round_trip():
    assert parse_location("qdrant+file:///data/q?collection=c1") == ({"path": "/data/q"}, "c1")
    assert parse_location("qdrant+https://q.example:6333?collection=c2") == (
        {"url": "https://q.example:6333"},
        "c2",
    )
    with pytest.raises(RuntimeError, match="names no collection"):
        parse_location("qdrant+file:///data/q")
