"""kind: ducklake against DuckDB's real ducklake extension (the PyPI package, LOADed from its file):
catalogs on a DuckDB file and on the real Postgres at 127.0.0.1:5432, data files local and on S3
(moto in server mode), time travel, and the registry record of a table."""

from __future__ import annotations

import json
import os
import shutil
import uuid

import duckdb
import psycopg
import pytest

from noetl_dagster.engine.keychain import FileProvider, Keychain
from noetl_dagster.tools.ducklake import ducklake_tool, extension_file
from noetl_dagster.tools.registry import ToolError, get_tool

PG_ADMIN_URL = os.environ.get("NOETL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

USERS = "CREATE TABLE IF NOT EXISTS users (id INTEGER, name VARCHAR)"


def test_registered_and_the_extension_comes_from_its_package():
    assert get_tool("ducklake").fn is ducklake_tool
    path = extension_file("ducklake")
    assert (
        path.endswith(f"/v{duckdb.__version__}/ducklake.duckdb_extension")
        and "duckdb_extension_ducklake" in path
    )


def _lake(ctx, catalog, data, sql, **kw):
    return ducklake_tool({"catalog_connection": catalog, "data_path": data, "command": sql, **kw}, ctx)


def test_file_catalog_create_insert_time_travel_and_local_data_files(make_ctx, tmp_path):
    ctx = make_ctx()
    cat, data = str(tmp_path / "meta.ducklake"), str(tmp_path / "files")
    created = _lake(ctx, cat, data, USERS, data_inlining_row_limit=0)
    first = _lake(
        ctx, cat, data, "INSERT INTO users VALUES (1, 'ada'), (2, 'bob')", data_inlining_row_limit=0
    )
    assert first["row_count"] == 2 and first["snapshot_id"] == created["snapshot_id"] + 1
    _lake(ctx, cat, data, "DELETE FROM users WHERE id = 1", data_inlining_row_limit=0)
    now = _lake(ctx, cat, data, "SELECT id, name FROM users ORDER BY id", data_inlining_row_limit=0)
    assert now["rows"] == [{"id": 2, "name": "bob"}]
    then = _lake(ctx, cat, data, f"SELECT id FROM users AT (VERSION => {first['snapshot_id']}) ORDER BY id",
                 data_inlining_row_limit=0)  # fmt: skip
    assert then["rows"] == [{"id": 1}, {"id": 2}]
    # the rows are Parquet files under data_path, the catalog a DuckDB file
    assert [p for p in (tmp_path / "files").rglob("*.parquet")] and (tmp_path / "meta.ducklake").is_file()
    ctx.close()
    # a new execution (a new connection) reads the same lake; a relative catalog resolves in the data dir
    again = make_ctx()
    assert _lake(again, cat, data, "SELECT count(*) AS n FROM users")["rows"] == [{"n": 1}]
    _lake(again, "rel/meta.ducklake", "rel/files", USERS)
    assert (again.data_dir / "rel" / "meta.ducklake").is_file()


def test_parallel_calls_of_one_execution_share_the_attached_lake(make_ctx, tmp_path):
    import threading

    ctx = make_ctx()
    cat, data = str(tmp_path / "p.ducklake"), str(tmp_path / "pf")
    _lake(ctx, cat, data, "CREATE TABLE ev (u INTEGER)")
    errors: list[BaseException] = []

    def insert(i: int) -> None:
        try:
            _lake(ctx, cat, data, f"INSERT INTO ev VALUES ({i})")
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=insert, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert _lake(ctx, cat, data, "SELECT count(*) AS n FROM ev")["rows"] == [{"n": 5}]
    assert sum(1 for k in ctx.resources if k.startswith("ducklake:")) == 1


@pytest.fixture
def pg_catalog_db():
    """A fresh database on the real Postgres for one DuckLake catalog; returns its URL."""
    name = "noetl_dagster_ducklake_" + uuid.uuid4().hex[:10]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_postgres_catalog_by_url_and_by_credential(make_ctx, tmp_path, pg_catalog_db):
    data = str(tmp_path / "pgfiles")
    ctx = make_ctx()
    _lake(ctx, pg_catalog_db, data, USERS, catalog_name="test_catalog")
    _lake(ctx, pg_catalog_db, data, "INSERT INTO users VALUES (1, 'ada')", catalog_name="test_catalog")
    ctx.close()
    # the catalog is Postgres tables (DuckLake's ducklake_* schema), read back through a credential
    with psycopg.connect(pg_catalog_db) as conn:
        assert conn.execute("SELECT count(*) FROM ducklake_table WHERE table_name = 'users'").fetchone() == (
            1,
        )
    db = pg_catalog_db.rsplit("/", 1)[1]
    (tmp_path / "c.json").write_text(json.dumps({"credentials": {"lake_pg": {"type": "postgres", "data": {
        "db_host": "127.0.0.1", "db_port": "5432", "db_user": "postgres", "db_name": db, "db_password": "pw-lake"}}}}))  # fmt: skip
    kc = Keychain([], providers=[FileProvider(tmp_path / "c.json")])
    other = make_ctx(keychain=kc)
    out = ducklake_tool({"auth": "lake_pg", "catalog_name": "test_catalog", "data_path": data,
                         "command": "SELECT name FROM users"}, other)  # fmt: skip
    assert out["rows"] == [{"name": "ada"}] and "pw-lake" in other.redacted
    # upstream's spelling of the snapshot and table functions works on it
    info = ducklake_tool({"auth": "lake_pg", "catalog_name": "test_catalog", "data_path": data,
                          "commands": ["SELECT * FROM ducklake_table_info('test_catalog')"]}, other)  # fmt: skip
    assert [r["table_name"] for r in info["rows"]] == ["users"]


def test_s3_data_files_on_moto(make_ctx, tmp_path, s3_bucket):
    import boto3

    endpoint, bucket, _ = s3_bucket
    ctx = make_ctx()
    s3 = {"endpoint_url": endpoint, "key": "testing", "secret": "testing-secret", "region": "us-east-1"}
    cat, data = str(tmp_path / "s3.ducklake"), f"s3://{bucket}/lake/"
    _lake(ctx, cat, data, USERS, s3=s3)
    ins = _lake(ctx, cat, data, "INSERT INTO users SELECT i, 'u' || i FROM range(100) t(i)", s3=s3)
    _lake(ctx, cat, data, "DELETE FROM users WHERE id < 50", s3=s3)
    assert _lake(ctx, cat, data, "SELECT count(*) AS n FROM users", s3=s3)["rows"] == [{"n": 50}]
    then = _lake(
        ctx, cat, data, f"SELECT count(*) AS n FROM users AT (VERSION => {ins['snapshot_id']})", s3=s3
    )
    assert then["rows"] == [{"n": 100}]
    keys = [o["Key"] for o in boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                                           aws_secret_access_key="testing", region_name="us-east-1")
            .list_objects_v2(Bucket=bucket, Prefix="lake/").get("Contents", [])]  # fmt: skip
    assert any(k.endswith(".parquet") for k in keys), keys
    assert "testing-secret" in ctx.redacted
    assert not [p for p in tmp_path.rglob("*.parquet")]  # nothing landed locally
    ctx.close()
    # the same lake through an S3 credential record (AWS's field names), as a generated playbook must
    (tmp_path / "s3.json").write_text(json.dumps({"credentials": {"lake_s3": {"type": "s3", "data": {
        "aws_access_key_id": "testing", "aws_secret_access_key": "testing-secret", "endpoint_url": endpoint,
        "region": "us-east-1"}}}}))  # fmt: skip
    other = make_ctx(keychain=Keychain([], providers=[FileProvider(tmp_path / "s3.json")]))
    out = _lake(other, cat, data, "SELECT count(*) AS n FROM users", s3={"credential": "lake_s3"})
    assert out["rows"] == [{"n": 50}] and "testing-secret" in other.redacted


def test_register_records_the_table_at_its_snapshot(make_ctx, tmp_path):
    from noetl_registry.client import open_registry

    ctx = make_ctx()
    cat, data = str(tmp_path / "r.ducklake"), str(tmp_path / "rf")
    _lake(ctx, cat, data, USERS, data_inlining_row_limit=0)
    reg = {"table": "users", "resource": "users", "namespace": "lake"}
    one = _lake(
        ctx, cat, data, "INSERT INTO users VALUES (1, 'ada')", register=reg, data_inlining_row_limit=0
    )
    two = _lake(
        ctx, cat, data, "INSERT INTO users VALUES (2, 'bob')", register=reg, data_inlining_row_limit=0
    )
    r1, r2 = one["registered"], two["registered"]
    assert (r1["version"], r2["version"]) == ("v1", "v2") and r1[
        "uri"
    ] == "noetl://default/default/lake/dataset/users@v1"
    assert (r1["rows"], r2["rows"]) == (1, 2) and r2["snapshot_id"] == two["snapshot_id"] == r1[
        "snapshot_id"
    ] + 1
    assert r1["checksum"] != r2["checksum"] and r1["checksum"].startswith("sha256:")
    plan = open_registry(str(ctx.data_dir / "registry.db")).resolve(
        "noetl://default/default/lake/dataset/users@v1"
    )
    loc = plan.location
    assert loc.format == "ducklake" and loc.storage_type == "ducklake" and loc.rows == 1
    assert loc.metadata["snapshot_id"] == r1["snapshot_id"] and loc.metadata["table"] == "users"
    assert loc.metadata["catalog"] == cat and loc.size_bytes > 0
    # the recorded snapshot is what time travel reads
    back = _lake(
        ctx,
        cat,
        data,
        f"SELECT name FROM users AT (VERSION => {loc.metadata['snapshot_id']})",
        data_inlining_row_limit=0,
    )
    # one execution attaches a catalog once: other settings on it are a one-line error, not a second attach
    with pytest.raises(ToolError, match="attached in this execution with other settings"):
        _lake(ctx, cat, data, "SELECT 1")
    # another execution of this process while it is attached: a retryable one-line error
    with pytest.raises(ToolError, match="attached by another execution or process") as e:
        _lake(make_ctx(), cat, data, "SELECT 1", data_inlining_row_limit=0)
    assert e.value.retryable
    assert back["rows"] == [{"name": "ada"}]


def test_one_line_errors(make_ctx, tmp_path, monkeypatch):
    ctx = make_ctx()
    with pytest.raises(ToolError, match="'catalog_connection' .* or 'auth' .* is required"):
        ducklake_tool({"command": "SELECT 1"}, ctx)
    with pytest.raises(ToolError, match=r"^ducklake: 'command' \(or 'commands' / 'query'\) is required"):
        ducklake_tool({"catalog_connection": "x.ducklake"}, ctx)
    with pytest.raises(ToolError, match="catalog_name 'a-b' must be a plain identifier"):
        _lake(ctx, str(tmp_path / "c.ducklake"), None, "SELECT 1", catalog_name="a-b")
    with pytest.raises(ToolError, match="^ducklake: query failed: .*Table with name nope does not exist"):
        _lake(ctx, str(tmp_path / "c.ducklake"), None, "SELECT * FROM nope")
    with pytest.raises(ToolError, match=r"register needs \{table, uri \| resource\}|'register' needs"):
        _lake(ctx, str(tmp_path / "c.ducklake"), None, "SELECT 1", register={"resource": "x"})
    with pytest.raises(ToolError, match=r"duckdb-extension-nope|nope extension is not installed: pip install "
                                        r"'noetl-dagster\[ducklake\]'"):  # fmt: skip
        extension_file("nope")
    # an extension package built for another DuckDB is named, never downloaded instead
    monkeypatch.setattr(duckdb, "__version__", "9.9.9")
    with pytest.raises(ToolError, match=r"ships the ducklake extension for DuckDB \['v1\.\d+\.\d+'\], not this "
                                        r"DuckDB v9\.9\.9"):  # fmt: skip
        extension_file("ducklake")


def test_nothing_is_downloaded_at_run_time(make_ctx, tmp_path, monkeypatch):
    """Extensions load from the packages' files: DuckDB's own extension directory stays empty."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    ctx = make_ctx()
    _lake(ctx, str(tmp_path / "n.ducklake"), str(tmp_path / "nf"), USERS)
    assert not (home / ".duckdb").exists()
    assert not os.path.exists(str(home / ".duckdb" / "extensions"))


def test_a_registered_version_is_read_back_with_op_read(make_ctx, tmp_path):
    """``op: read`` resolves a ducklake version like a Parquet or Iceberg one: the table at the recorded
    snapshot, verified against the registry's checksum, in the writing execution (its attached catalog)
    and in another one; a lake whose snapshot no longer matches the record is a checksum mismatch."""
    from noetl_dagster.tools.storage import parquet_tool

    ctx = make_ctx()
    cat, data = str(tmp_path / "v.ducklake"), str(tmp_path / "vf")
    _lake(ctx, cat, data, USERS, data_inlining_row_limit=0)
    reg = {"table": "users", "resource": "users", "namespace": "lake"}
    one = _lake(
        ctx, cat, data, "INSERT INTO users VALUES (1, 'ada')", register=reg, data_inlining_row_limit=0
    )
    _lake(ctx, cat, data, "INSERT INTO users VALUES (2, 'bob')", register=reg, data_inlining_row_limit=0)
    uri = "noetl://default/default/lake/dataset/users"
    # the writing execution: the catalog as it attached it (other settings than a reader's)
    v1 = parquet_tool({"op": "read", "uri": f"{uri}@v1"}, ctx)
    assert v1["rows"] == [{"id": 1, "name": "ada"}] and v1["ref"]["version"] == "v1"
    assert v1["ref"]["format"] == "ducklake" and v1["ref"]["checksum"] == one["registered"]["checksum"]
    ctx.close()
    # another execution: attached from the record
    other = make_ctx()
    latest = parquet_tool({"op": "read", "uri": uri, "columns": ["name"]}, other)
    assert latest["rows"] == [{"name": "ada"}, {"name": "bob"}] and latest["ref"]["version"] == "v2"
    assert parquet_tool({"op": "read", "uri": f"{uri}@v1", "as": "pydict"}, other)["columns_data"] == {
        "id": [1],
        "name": ["ada"],
    }
    other.close()
    # a data file of the snapshot rewritten behind the catalog's back: an error, never other rows
    victim = sorted((tmp_path / "vf").rglob("*.parquet"))[0]
    saved = victim.read_bytes()
    duckdb.sql(f"COPY (SELECT 9 AS id, 'mallory-was-here' AS name) TO '{victim}' (FORMAT parquet)")
    reader = make_ctx()
    with pytest.raises(ToolError, match="reading main.users at snapshot"):
        parquet_tool({"op": "read", "uri": f"{uri}@v1"}, reader)
    reader.close()
    victim.write_bytes(saved)
    # the lake rebuilt at the same path, same snapshot ids and row counts, other rows: not the record
    shutil.rmtree(tmp_path / "vf")
    os.remove(cat)
    again = make_ctx()
    _lake(again, cat, data, USERS, data_inlining_row_limit=0)
    _lake(again, cat, data, "INSERT INTO users VALUES (1, 'eve')", data_inlining_row_limit=0)
    again.close()
    with pytest.raises(ToolError) as e:
        parquet_tool({"op": "read", "uri": f"{uri}@v1"}, make_ctx())
    assert e.value.kind == "checksum_mismatch" and "not the registered one" in e.value.message
