"""Tables by reference: Parquet / Arrow IPC / Iceberg written, registered, resolved and verified."""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

from noetl_dagster.storage.object_stores import S3PayloadStore
from noetl_dagster.storage.payload import ChecksumMismatch
from noetl_dagster.storage.tables import (
    IcebergTables,
    TableDataError,
    TableStorage,
    convert,
    schema_fingerprint,
    table_checksum,
    to_arrow,
)
from noetl_registry.client import open_registry
from noetl_registry.errors import Forbidden
from noetl_registry.service import Registry

TABLE = pa.table({"id": [1, 2, 3], "amount": [10.5, 3.25, 7.0], "region": ["eu", "us", "eu"]})


@pytest.fixture
def registry(tmp_path):
    reg = Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    yield reg
    reg.close()


@pytest.fixture
def storage(tmp_path, registry):
    return TableStorage(open_registry(registry, tenant="acme", project="lab"), data_dir=tmp_path / "home")


def test_conversions_in_and_out():
    records = TABLE.to_pylist()
    for data in (
        TABLE,
        TABLE.to_batches()[0],
        pl.from_arrow(TABLE),
        TABLE.to_pandas(),
        records,
        TABLE.to_pydict(),
        pa.RecordBatchReader.from_batches(TABLE.schema, TABLE.to_batches()),
    ):
        assert to_arrow(data).to_pylist() == records
    assert isinstance(convert(TABLE, "polars"), pl.DataFrame)
    assert isinstance(convert(TABLE, "pandas"), pd.DataFrame)
    assert convert(TABLE, "records") == records and convert(TABLE, "pydict") == TABLE.to_pydict()
    for bad in ([], [1, 2], {"a": 1}, 42, "rows"):
        with pytest.raises(TableDataError):
            to_arrow(bad)
    with pytest.raises(TableDataError):
        convert(TABLE, "xml")
    assert schema_fingerprint(TABLE.schema) == schema_fingerprint(to_arrow(records).schema)
    assert schema_fingerprint(TABLE.schema) != schema_fingerprint(TABLE.select(["id"]).schema)


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "iceberg"])
def test_publish_registers_and_fetch_reads_back_identical(storage, fmt):
    pub = storage.publish(TABLE, "noetl://acme/lab/sales/dataset/orders", format=fmt)
    ref = pub.ref()
    assert ref["uri"] == "noetl://acme/lab/sales/dataset/orders@v1" and ref["rows"] == 3
    assert ref["checksum"].startswith("sha256:") and ref["format"] == fmt
    plan = storage.registry.resolve(ref["uri"])
    assert plan.expected_checksum == ref["checksum"] and plan.location.uri == ref["location"]
    assert plan.metadata["columns"][0] == {"name": "id", "type": "int64", "nullable": True}
    back, plan2 = storage.fetch("noetl://acme/lab/sales/dataset/orders")
    assert plan2.version == "v1" and table_checksum(back) == table_checksum(TABLE)
    assert storage.fetch(ref["urn"], as_type="records")[0] == TABLE.to_pylist()
    assert storage.fetch(ref["uri"], columns=["region"])[0].column_names == ["region"]


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_files_live_under_the_shard_prefix(storage, fmt):
    ref = storage.publish(TABLE, "noetl://acme/lab/sales/dataset/o", format=fmt).ref()
    path = unquote(urlsplit(ref["location"]).path)
    assert (
        "/noetl/env=dev/region=local/cell=local-a/shard=s0108/tenant=acme/project=lab/sales/dataset/o/"
        in path
    )
    assert os.path.getsize(path) == ref["size"]


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_tampered_file_fails_closed(storage, fmt):
    ref = storage.publish(TABLE, "noetl://acme/lab/sales/dataset/t", format=fmt).ref()
    other = storage.publish(TABLE.slice(0, 1), "noetl://acme/lab/sales/dataset/decoy", format=fmt).ref()
    path = unquote(urlsplit(ref["location"]).path)
    with open(unquote(urlsplit(other["location"]).path), "rb") as f:
        decoy = f.read()
    with open(path, "wb") as f:  # a valid file of the same format, but not the registered bytes
        f.write(decoy)
    with pytest.raises(ChecksumMismatch):
        storage.fetch(ref["uri"])


def test_iceberg_versions_are_snapshots_append_and_overwrite(storage):
    uri = "noetl://acme/lab/sales/dataset/ledger"
    v1 = storage.publish(TABLE, uri, format="iceberg").ref()
    v2 = storage.publish(TABLE.slice(0, 1), uri, format="iceberg").ref()  # append
    v3 = storage.publish(TABLE.slice(2, 1), uri, format="iceberg", mode="overwrite").ref()
    assert [v["version"] for v in (v1, v2, v3)] == ["v1", "v2", "v3"]
    assert len({v1["snapshot_id"], v2["snapshot_id"], v3["snapshot_id"]}) == 3
    assert storage.fetch(f"{uri}@v1")[0].num_rows == 3  # time travel through the registry
    assert storage.fetch(f"{uri}@v2")[0].num_rows == 4
    latest, plan = storage.fetch(uri)
    assert latest.to_pylist() == TABLE.slice(2, 1).to_pylist() and plan.rows == 1
    with pytest.raises(TableDataError):
        storage.publish(TABLE, uri, format="iceberg", mode="merge")


def test_iceberg_partitioning_and_schema_evolution(storage):
    uri = "noetl://acme/lab/sales/dataset/parted"
    storage.publish(
        TABLE, uri, format="iceberg", partition_by=["region", {"source": "id", "transform": "bucket[4]"}]
    )
    wider = TABLE.append_column("note", pa.array(["a", "b", "c"]))
    pub = storage.publish(wider, uri, format="iceberg")
    spec = pub.write.metadata["partition_spec"]
    assert [(p["source"], p["transform"]) for p in spec] == [("region", "identity"), ("id", "bucket[4]")]
    back = storage.fetch(uri)[0]
    assert back.num_rows == 6 and "note" in back.column_names
    with pytest.raises(TableDataError):
        storage.publish(TABLE, uri, format="iceberg", partition_by=[{"transform": "day"}])


def test_iceberg_tampering_is_detected(storage):
    pub = storage.publish(TABLE, "noetl://acme/lab/sales/dataset/ice_t", format="iceberg")
    ident = tuple(pub.write.metadata["identifier"])
    tbl = storage.iceberg.catalog.load_table(ident)
    data_file = next(iter(tbl.scan().plan_files())).file.file_path
    with open(unquote(urlsplit(data_file).path), "ab") as f:
        f.write(b"garbage")  # a data file changed on storage behind the catalog
    with pytest.raises(ChecksumMismatch):
        storage.fetch(pub.resource.uri)


def test_iceberg_refuses_names_that_would_alias(storage):
    with pytest.raises(TableDataError, match="cannot have '.'"):
        storage.publish(TABLE, "noetl://acme/lab/sales/dataset/a.b", format="iceberg")
    assert IcebergTables.identifier(
        __import__("noetl_dagster.dsl.locator", fromlist=["x"]).parse_locator(
            "noetl://acme/lab/ns/dataset/x/y@v1"
        )
    ) == ("acme", "lab", "ns", "x__y")


def test_reads_go_through_tenancy(tmp_path, registry, storage):
    ref = storage.publish(TABLE, "noetl://acme/lab/sales/dataset/private", format="parquet").ref()
    stranger = TableStorage(open_registry(registry, tenant="beta", project="x"), data_dir=tmp_path / "home")
    with pytest.raises(Forbidden):
        stranger.fetch(ref["uri"])
    storage.registry.grant(ref["uri"], "tenant:beta")
    assert table_checksum(stranger.fetch(ref["uri"])[0]) == table_checksum(TABLE)


def test_lineage_from_inputs(storage):
    raw = storage.publish(TABLE, "noetl://acme/lab/raw/dataset/r", format="arrow").ref()
    out = storage.publish(
        TABLE.slice(0, 2),
        "noetl://acme/lab/clean/dataset/c",
        format="parquet",
        inputs=[raw["uri"]],
        execution_id="exec_9",
        step="clean",
    ).ref()
    edges = storage.registry.lineage(out["resource_id"], "up").edges
    assert [(e.resource.uri, e.execution_id, e.step) for e in edges] == [(raw["uri"], "exec_9", "clean")]


def test_s3_store_round_trip(tmp_path, registry, s3_bucket):
    _, bucket, opts = s3_bucket
    storage = TableStorage(
        open_registry(registry, tenant="acme", project="lab"),
        S3PayloadStore(bucket, "tables", **opts),
        data_dir=tmp_path / "home",
    )
    for fmt in ("parquet", "arrow"):
        ref = storage.publish(TABLE, f"noetl://acme/lab/s3/dataset/t_{fmt}", format=fmt).ref()
        assert ref["location"].startswith(f"s3://{bucket}/tables/noetl/env=dev/") and ref["store"] == "s3"
        # a second reader with its own store configuration resolves and reads the same bytes
        reader = TableStorage(
            open_registry(registry, tenant="acme", project="lab"),
            f"s3://{bucket}/elsewhere?endpoint_url={opts['endpoint_url']}&key=testing&secret=testing",
            data_dir=tmp_path / "home",
        )
        assert table_checksum(reader.fetch(ref["uri"])[0]) == table_checksum(TABLE)
