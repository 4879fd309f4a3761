"""kind: transfer against real systems: a local HTTP server, the machine's Postgres, DuckDB, parquet
through the registry-backed table storage — and the core fixture http_to_postgres_transfer."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from noetl_dagster.dsl import load_playbook
from noetl_dagster.dsl.kinds import ToolConfigError, get_tool
from noetl_dagster.engine.ports import ToolError
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.tools.transfer import transfer_tool

FIXTURE = Path(
    "/work/shared/conformance/noetl-e2e/fixtures/playbooks/data_transfer/http_to_postgres_transfer/"
    "http_to_postgres_transfer.yaml"
)
POSTS = [
    {"userId": i % 7, "id": i, "title": f"t{i}", "body": "b" * (i % 50), "meta": {"tag": f"x{i}"}}
    for i in range(1, 2501)
]


@pytest.fixture
def pg(pg_tools_db):
    with psycopg.connect(pg_tools_db, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")  # a leaked reader fails the test instead of hanging it
        conn.execute("DROP TABLE IF EXISTS xfer_src, xfer_dst")
        conn.execute(
            "CREATE TABLE xfer_src (id int primary key, name text, amount numeric(10,2), at timestamptz)"
        )
        conn.execute(
            "INSERT INTO xfer_src SELECT g, 'n' || g, g / 4.0, '2024-01-01'::timestamptz + g * interval '1 hour'"
            " FROM generate_series(1, 5000) g"
        )
        conn.execute("CREATE TABLE xfer_dst (post_id int primary key, user_id int, title text, tag text)")
        yield conn
        conn.execute("DROP TABLE IF EXISTS xfer_src, xfer_dst")


def test_http_to_postgres_with_mapping_in_chunks(httpserver, pg, pg_keychain, make_ctx):
    httpserver.expect_request("/posts").respond_with_json({"data": {"items": POSTS}})
    ctx = make_ctx(pg_keychain)
    out = transfer_tool(
        {
            "source": {"type": "http", "url": httpserver.url_for("/posts"), "data_path": "data.items"},
            "target": {
                "type": "postgres",
                "auth": "pg_test",
                "table": "public.xfer_dst",
                "mapping": {"post_id": "id", "user_id": "userId", "title": "title", "tag": "meta.tag"},
            },
            "chunk_size": 1000,
        },
        ctx,
    )
    assert out["rows_transferred"] == 2500 and out["chunks_processed"] == 3 and out["bytes"] > 0
    assert out["direction"] == "http_to_postgres" and out["columns"] == ["post_id", "user_id", "title", "tag"]
    assert pg.execute(
        "SELECT count(*), sum(post_id), max(tag) FROM xfer_dst WHERE tag LIKE 'x%'"
    ).fetchone() == (2500, sum(range(1, 2501)), "x999")
    # upsert: the same rows again change nothing in count, update titles
    httpserver.clear()
    httpserver.expect_request("/posts").respond_with_json([{**p, "title": "new"} for p in POSTS[:10]])
    transfer_tool(
        {
            "source": {"type": "http", "url": httpserver.url_for("/posts")},
            "target": {
                "type": "postgres",
                "auth": "pg_test",
                "table": "xfer_dst",
                "key": "post_id",
                "mapping": {"post_id": "id", "title": "title"},
            },
            "mode": "upsert",
        },
        ctx,
    )
    assert pg.execute("SELECT count(*), count(*) FILTER (WHERE title = 'new') FROM xfer_dst").fetchone() == (
        2500,
        10,
    )


def test_postgres_to_duckdb_and_back_to_parquet(pg, pg_keychain, make_ctx):
    ctx = make_ctx(pg_keychain)
    out = transfer_tool(
        {
            "source": {"type": "postgres", "auth": "pg_test", "query": "SELECT * FROM xfer_src ORDER BY id"},
            "target": {"type": "duckdb", "table": "copied"},
            "chunk_size": 2000,
        },
        ctx,
    )
    assert out["rows_transferred"] == 5000 and out["chunks_processed"] == 3
    conn = ctx.resources["duckdb::memory:"]
    assert conn.execute("SELECT count(*), sum(id), max(name), sum(amount) FROM copied").fetchone() == (
        5000,
        12502500,
        "n999",
        pytest.approx(sum(range(1, 5001)) / 4),
    )
    # replace mode drops and refills; duckdb -> postgres through a custom query
    transfer_tool(
        {
            "source": {
                "type": "postgres",
                "auth": "pg_test",
                "query": "SELECT id FROM xfer_src WHERE id <= 10",
            },
            "target": {"type": "duckdb", "table": "copied"},
            "mode": "replace",
        },
        ctx,
    )
    assert conn.execute("SELECT count(*) FROM copied").fetchone() == (10,)
    out = transfer_tool(
        {
            "source": {"type": "duckdb", "query": "SELECT id AS post_id, 'dd' AS title FROM copied"},
            "target": {
                "type": "postgres",
                "auth": "pg_test",
                "query": "INSERT INTO xfer_dst (post_id, title) VALUES (%s, %s)",
            },
        },
        ctx,
    )
    assert out["mode"] == "custom" and pg.execute(
        "SELECT count(*) FROM xfer_dst WHERE title = 'dd'"
    ).fetchone() == (10,)
    # postgres -> parquet: a registered version read back through the storage tools
    out = transfer_tool(
        {
            "source": {"type": "postgres", "auth": "pg_test", "query": "SELECT id, name FROM xfer_src"},
            "target": {"type": "parquet", "uri": "noetl://default/default/lab/dataset/xfer"},
        },
        ctx,
    )
    assert (
        out["rows_transferred"] == 5000 and out["ref"]["rows"] == 5000 and out["ref"]["format"] == "parquet"
    )
    from noetl_dagster.tools.storage import parquet_tool

    back = parquet_tool({"op": "read", "uri": "noetl://default/default/lab/dataset/xfer"}, ctx)
    assert back["row_count"] == 5000 and sorted(back["columns"]) == ["id", "name"]


def test_failures_are_error_outcomes_and_roll_back(httpserver, pg, pg_keychain, make_ctx):
    ctx = make_ctx(pg_keychain)
    httpserver.expect_request("/down").respond_with_data("no", status=503)
    with pytest.raises(ToolError) as ei:
        transfer_tool(
            {
                "source": {"type": "http", "url": httpserver.url_for("/down")},
                "target": {"type": "postgres", "auth": "pg_test", "table": "xfer_dst"},
            },
            ctx,
        )
    assert ei.value.kind == "server_error"
    # a duplicate key in the second chunk rolls the first chunk back too
    httpserver.expect_request("/dup").respond_with_json([{"post_id": i % 1500} for i in range(2000)])
    with pytest.raises(ToolError) as ei:
        transfer_tool(
            {
                "source": {"type": "http", "url": httpserver.url_for("/dup")},
                "target": {"type": "postgres", "auth": "pg_test", "table": "xfer_dst"},
                "chunk_size": 1000,
            },
            ctx,
        )
    assert (
        ei.value.kind == "pg_error" and ei.value.code == "unique_violation" and "target" in ei.value.message
    )
    assert pg.execute("SELECT count(*) FROM xfer_dst").fetchone() == (0,)
    with pytest.raises(ToolError) as ei:
        transfer_tool(
            {
                "source": {"type": "postgres", "auth": "pg_test", "query": "SELECT * FROM no_such_table"},
                "target": {"type": "duckdb", "table": "t"},
            },
            ctx,
        )
    assert ei.value.details["pg"]["code"] == "undefined_table"
    with pytest.raises(ToolError, match="source.query is required"):
        transfer_tool(
            {"source": {"type": "postgres", "auth": "pg_test"}, "target": {"type": "duckdb", "table": "t"}},
            ctx,
        )


def test_bad_config_is_a_clear_validation_error():
    tk = get_tool("transfer")
    with pytest.raises(ToolConfigError, match=r"kind 'transfer': invalid config: target: Field required"):
        tk.check_config({"source": {"type": "http", "url": "http://x"}})
    with pytest.raises(ToolConfigError, match="chunk_size"):
        tk.check_config({"source": {"type": "http"}, "target": {"type": "postgres"}, "chunk_size": 0})
    with pytest.raises(ToolError, match="source.type 'ftp' is not supported"):
        transfer_tool({"source": {"type": "ftp"}, "target": {"type": "postgres"}}, None)


def test_core_fixture_http_to_postgres_transfer_runs(pg_tools_db, tmp_path, monkeypatch):
    """The e2e fixture, unchanged: a local HTTP server stands in for jsonplaceholder, pg_local is real Postgres."""
    import json

    from psycopg.conninfo import conninfo_to_dict

    from noetl_dagster.conformance.stubs import JsonPlaceholder, StubSet

    info = conninfo_to_dict(pg_tools_db)
    record = {
        "db_host": info.get("host", "127.0.0.1"),
        "db_port": str(info.get("port", 5432)),
        "db_user": info.get("user", "postgres"),
        "db_name": info["dbname"],
    }
    monkeypatch.setenv("NOETL_CREDENTIAL_PG_LOCAL", json.dumps(record))
    with StubSet((JsonPlaceholder,)) as stubs:
        monkeypatch.setenv("NOETL_HTTP_OVERRIDES", json.dumps(stubs.overrides))
        res = run_playbook(load_playbook(str(FIXTURE)), data_dir=tmp_path)
    assert res.status == "completed", res
    assert res.results["show_count"]["rows"] == [{"records": 100}]
    assert res.results["transfer_http_to_pg"]["rows_transferred"] == 100
