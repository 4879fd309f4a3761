"""The reference-first IO managers in real Dagster runs (materialize, a real instance)."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

import dagster as dg
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

from noetl_dagster.dsl.locator import asset_key_for_uri
from noetl_dagster.io_managers import ArrowIPCIOManager, ParquetIOManager
from noetl_dagster.resources.registry import NoetlRegistryResource
from noetl_dagster.storage.payload import ChecksumMismatch
from noetl_dagster.storage.tables import table_checksum
from noetl_registry.client import open_registry
from noetl_registry.errors import Forbidden

ORDERS = pa.table(
    {"id": [1, 2, 3, 4], "amount": [10.5, 3.25, 7.0, 99.0], "region": ["eu", "us", "eu", "apac"]}
)
FORMATS = ["parquet", "arrow", "iceberg"]


def _meta(instance, key):
    return instance.get_latest_materialization_event(dg.AssetKey(key)).asset_materialization.metadata


@pytest.mark.parametrize("fmt", FORMATS)
def test_roundtrip_types_metadata_and_registry(fmt, io_managers, instance, registry_db):
    @dg.asset(key=["acme", "lab", "sales", "orders"], io_manager_key=fmt)
    def orders() -> pa.Table:
        return ORDERS

    @dg.asset(key=["acme", "lab", "sales", "big"], io_manager_key=fmt)
    def big(orders: pl.DataFrame) -> pl.DataFrame:
        assert isinstance(orders, pl.DataFrame)
        return orders.filter(pl.col("amount") > 5).sort("id")

    @dg.asset(io_manager_key=fmt)
    def counts(big: pd.DataFrame) -> pd.DataFrame:
        assert isinstance(big, pd.DataFrame)
        return big.groupby("region", as_index=False).size()

    @dg.asset(io_manager_key=fmt)
    def as_records(big: list) -> dict:
        assert big[0] == {"id": 1, "amount": 10.5, "region": "eu"}
        return {"n": [len(big)]}

    result = dg.materialize([orders, big, counts, as_records], resources=io_managers(), instance=instance)
    assert result.success

    md = _meta(instance, ["acme", "lab", "sales", "orders"])
    assert md["dagster/row_count"].value == 4
    assert [c.name for c in md["dagster/column_schema"].schema.columns] == ["id", "amount", "region"]
    assert md["noetl/uri"].value == "noetl://acme/lab/sales/dataset/orders@v1"
    assert md["noetl/checksum"].value.startswith("sha256:")
    if fmt == "iceberg":
        assert (
            md["noetl/iceberg_snapshot_id"].value > 0
            and md["dagster/table_name"].value == "acme.lab.sales.orders"
        )
    big_md = _meta(instance, ["acme", "lab", "sales", "big"])
    assert big_md["noetl/inputs"].value == ["noetl://acme/lab/sales/dataset/orders@v1"]
    assert _meta(instance, ["counts"])["noetl/uri"].value == "noetl://acme/lab/assets/dataset/counts@v1"
    assert asset_key_for_uri(md["noetl/uri"].value) == ["acme", "lab", "sales", "orders"]

    client = open_registry(registry_db, tenant="acme", project="lab")
    plan = client.resolve("noetl://acme/lab/assets/dataset/counts")
    assert plan.expected_checksum == _meta(instance, ["counts"])["noetl/checksum"].value
    up = client.lineage(plan.resource_id, "up", depth=3)
    assert [e.resource.uri for e in up.edges] == [
        "noetl://acme/lab/sales/dataset/big@v1",
        "noetl://acme/lab/sales/dataset/orders@v1",
    ]
    assert up.edges[0].execution_id == result.run_id

    # a second materialization is a new version; the first stays readable
    assert dg.materialize([orders], resources=io_managers(), instance=instance).success
    assert client.resolve("noetl://acme/lab/sales/dataset/orders").version == "v2"
    assert client.resolve("noetl://acme/lab/sales/dataset/orders@v1").allowed


def test_end_to_end_writer_and_reader_definitions_with_lineage(io_managers, sqlite_instance, registry_db):
    """'Playbook' 1 writes one table through each IO manager; 'playbook' 2, a separate set of
    definitions, resolves each by noetl:// URI, reads it back identical and derives a new asset."""
    writers = []
    for fmt in FORMATS:

        @dg.asset(key=["acme", "lab", "shared", f"orders_{fmt}"], io_manager_key=fmt)
        def writer() -> pa.Table:
            return ORDERS

        writers.append(writer)
    assert dg.materialize(writers, resources=io_managers(), instance=sqlite_instance).success

    reader_defs = []
    for fmt in FORMATS:
        upstream = dg.AssetSpec(
            ["acme", "lab", "imports", f"src_{fmt}"],
            metadata={"noetl/uri": f"noetl://acme/lab/shared/dataset/orders_{fmt}"},
        ).with_io_manager_key(fmt)

        @dg.asset(
            key=["acme", "lab", "reports", f"copy_{fmt}"],
            io_manager_key="parquet",
            ins={"src": dg.AssetIn(upstream.key)},
        )
        def copy(src: pa.Table) -> pa.Table:
            return src

        reader_defs += [upstream, copy]
    defs = dg.Definitions(assets=reader_defs, resources=io_managers())
    job = defs.resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(
        instance=sqlite_instance,
        asset_selection=[dg.AssetKey(["acme", "lab", "reports", f"copy_{f}"]) for f in FORMATS],
    )
    assert result.success

    client = open_registry(registry_db, tenant="acme", project="lab")
    for fmt in FORMATS:
        written = client.resolve(f"noetl://acme/lab/shared/dataset/orders_{fmt}")
        copy_md = _meta(sqlite_instance, ["acme", "lab", "reports", f"copy_{fmt}"])
        assert copy_md["noetl/inputs"].value == [written.uri]
        copied = client.resolve(copy_md["noetl/uri"].value)
        lineage = client.lineage(copied.resource_id, "up")
        assert [e.resource.uri for e in lineage.edges] == [written.uri]
        # identical content: read the copy back through the registry and compare digests
        from noetl_dagster.storage.tables import TableStorage

        back, _ = TableStorage(client).fetch(copied.uri)
        assert table_checksum(back) == table_checksum(ORDERS)
    # the Dagster catalog knows the assets and their dependency edges
    graph = defs.resolve_asset_graph()
    for fmt in FORMATS:
        key = dg.AssetKey(["acme", "lab", "reports", f"copy_{fmt}"])
        assert graph.get(key).parent_keys == {dg.AssetKey(["acme", "lab", "imports", f"src_{fmt}"])}
        assert sqlite_instance.get_latest_materialization_event(key) is not None


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_a_tampered_file_fails_the_reading_run(fmt, io_managers, instance):
    @dg.asset(key=["acme", "lab", "t", "src"], io_manager_key=fmt)
    def src() -> pa.Table:
        return ORDERS

    @dg.asset(io_manager_key=fmt)
    def sink(src: pa.Table) -> pa.Table:
        return src

    assert dg.materialize([src], resources=io_managers(), instance=instance).success
    location = _meta(instance, ["acme", "lab", "t", "src"])["noetl/location"].value
    path = unquote(urlsplit(location).path)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(ChecksumMismatch):
        dg.materialize(
            [src.to_source_asset(), sink], resources=io_managers(), instance=instance, selection=[sink]
        )


def test_cross_tenant_reads_are_refused_without_a_grant(io_managers, instance, registry_db):
    @dg.asset(key=["acme", "lab", "private", "secrets"], io_manager_key="parquet")
    def secret_table() -> pa.Table:
        return ORDERS

    assert dg.materialize([secret_table], resources=io_managers(), instance=instance).success
    spy = dg.AssetSpec(
        ["beta", "x", "loot", "stolen"], metadata={"noetl/uri": "noetl://acme/lab/private/dataset/secrets"}
    ).with_io_manager_key("parquet")

    @dg.asset(ins={"stolen": dg.AssetIn(spy.key)}, io_manager_key="parquet")
    def exfiltrate(stolen: pa.Table) -> pa.Table:
        return stolen

    with pytest.raises(Forbidden):
        dg.materialize(
            [spy, exfiltrate], resources=io_managers("beta", "x"), instance=instance, selection=[exfiltrate]
        )
    open_registry(registry_db, tenant="acme", project="lab").grant(
        "noetl://acme/lab/private/dataset/secrets", "tenant:beta"
    )
    assert dg.materialize(
        [spy, exfiltrate], resources=io_managers("beta", "x"), instance=instance, selection=[exfiltrate]
    ).success


def test_iceberg_mode_and_partitioning_from_metadata(io_managers, instance, registry_db):
    @dg.asset(
        key=["acme", "lab", "ice", "daily"],
        io_manager_key="iceberg",
        metadata={"noetl/mode": "overwrite", "noetl/partition_by": ["region"]},
    )
    def daily() -> pa.Table:
        return ORDERS

    for _ in range(2):
        assert dg.materialize([daily], resources=io_managers(), instance=instance).success
    client = open_registry(registry_db, tenant="acme", project="lab")
    plan = client.resolve("noetl://acme/lab/ice/dataset/daily")
    assert plan.version == "v2" and plan.rows == 4  # overwritten, not appended
    assert plan.location.metadata["partition_spec"] == [
        {"source": "region", "transform": "identity", "name": "region"}
    ]


def test_plain_op_outputs_get_run_scoped_resources(io_managers, instance, registry_db):
    @dg.op(out=dg.Out(io_manager_key="arrow"))
    def produce() -> pa.Table:
        return ORDERS

    @dg.op(out=dg.Out(io_manager_key="arrow"))
    def consume(t: pa.Table) -> pa.Table:
        assert t.equals(ORDERS)
        return t.slice(0, 1)

    @dg.job(resource_defs=io_managers())
    def pipeline():
        consume(produce())

    result = pipeline.execute_in_process(instance=instance)
    assert result.success
    client = open_registry(registry_db, tenant="acme", project="lab")
    names = {r.name for r in client.list(q=result.run_id)}
    assert names == {f"runs/{result.run_id}/produce/result", f"runs/{result.run_id}/consume/result"}


def test_io_manager_over_the_http_registry(http_registry, io_managers, instance):
    url, reg = http_registry
    key_id, key = reg.create_api_key("acme", "lab")

    @dg.asset(key=["acme", "lab", "http", "orders"], io_manager_key="parquet")
    def remote_orders() -> pa.Table:
        return ORDERS

    @dg.asset(io_manager_key="arrow", ins={"remote_orders": dg.AssetIn(["acme", "lab", "http", "orders"])})
    def remote_copy(remote_orders: pa.Table) -> pa.Table:
        return remote_orders

    assert dg.materialize(
        [remote_orders, remote_copy], resources=io_managers(url=url, api_key=key), instance=instance
    ).success
    client = open_registry(reg, key)
    written = client.resolve("noetl://acme/lab/http/dataset/orders")
    assert client.get(written.resource_id).created_by == key_id  # registered over HTTP as the key
    copy = client.resolve("noetl://acme/lab/assets/dataset/remote_copy")
    assert [e.resource.uri for e in client.lineage(copy.resource_id).edges] == [written.uri]


def test_registry_resource_scope_and_helpers(registry_db):
    res = NoetlRegistryResource(url=registry_db, tenant="acme", project="lab")
    assert res.scope() == ("acme", "lab")
    r = res.register("noetl://acme/lab/ns/dataset/x", locations=[{"uri": "file:///x"}])
    assert res.resolve(r.series).resource_id == r.resource_id
    assert res.lineage(r.resource_id).edges == []


def test_bad_asset_names_give_a_clear_error(io_managers, instance):
    @dg.asset(key=["_hidden"], io_manager_key="parquet")  # fine for Dagster, not a noetl:// name segment
    def weird() -> pa.Table:
        return ORDERS

    with pytest.raises(dg.DagsterInvariantViolationError, match="noetl/uri"):
        dg.materialize([weird], resources=io_managers(), instance=instance)
    assert ParquetIOManager  # exported


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_blake3_checksums_round_trip_through_the_registry_and_catch_tampering(fmt, registry_db, instance):
    """checksum_algorithm="blake3" (issue 19.2): registered, resolved and verified like sha256."""
    reg = NoetlRegistryResource(url=registry_db, tenant="acme", project="lab")
    cls = ParquetIOManager if fmt == "parquet" else ArrowIPCIOManager
    resources = {fmt: cls(registry=reg, checksum_algorithm="blake3")}

    @dg.asset(key=["acme", "lab", "b3", "src"], io_manager_key=fmt)
    def src() -> pa.Table:
        return ORDERS

    @dg.asset(io_manager_key=fmt)
    def sink(src: pa.Table) -> pa.Table:
        assert src.equals(ORDERS)
        return src

    assert dg.materialize([src, sink], resources=resources, instance=instance).success
    meta = _meta(instance, ["acme", "lab", "b3", "src"])
    plan = reg.get_client().resolve("noetl://acme/lab/b3/dataset/src", purpose="read")
    assert plan.expected_checksum.startswith("blake3:")
    path = unquote(urlsplit(meta["noetl/location"].value).path)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(ChecksumMismatch):
        dg.materialize(
            [src.to_source_asset(), sink], resources=resources, instance=instance, selection=[sink]
        )


def test_an_unknown_checksum_algorithm_is_a_config_error(registry_db):
    reg = NoetlRegistryResource(url=registry_db, tenant="acme", project="lab")
    with pytest.raises(Exception, match="checksum_algorithm 'md5' is not one of"):
        ArrowIPCIOManager(registry=reg, checksum_algorithm="md5")
