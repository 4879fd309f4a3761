"""kind: snowflake against fakesnow's server (Snowflake's REST protocol over DuckDB, on loopback),
reached through the official snowflake-connector-python; and transfer snowflake <-> postgres."""

from __future__ import annotations

import psycopg
import pytest

from noetl_dagster.dsl.kinds import ToolConfigError, get_tool
from noetl_dagster.engine.ports import ToolError
from noetl_dagster.tools.snowflake import snowflake_tool
from noetl_dagster.tools.transfer import transfer_tool

fakesnow = pytest.importorskip("fakesnow")  # a dev dependency; present in CI


@pytest.fixture(scope="module")
def sf_server():
    with fakesnow.server() as kwargs:
        yield kwargs


@pytest.fixture
def sf_auth(sf_server):
    # NoETL's credential field names; host/port/protocol point the connector at the local server
    return {
        "sf_account": sf_server["account"],
        "sf_user": sf_server["user"],
        "sf_password": sf_server["password"],
        "sf_database": "TEST_DB",
        "sf_schema": "PUBLIC",
        "host": sf_server["host"],
        "port": sf_server["port"],
        "protocol": "http",
    }


def test_statements_run_and_the_last_result_is_returned(sf_auth, make_ctx):
    ctx = make_ctx()
    out = snowflake_tool(
        {
            "auth": sf_auth,
            "command": """
        CREATE DATABASE IF NOT EXISTS TEST_DB;
        CREATE OR REPLACE TABLE TEST_DB.PUBLIC.T (id INTEGER, name STRING, value NUMERIC(10,2));
        INSERT INTO TEST_DB.PUBLIC.T VALUES (1, 'a', 1.50), (2, 'b', 2.25);
        SELECT id, name, value FROM TEST_DB.PUBLIC.T ORDER BY id;
    """,
        },
        ctx,
    )
    assert out["columns"] == ["ID", "NAME", "VALUE"]
    assert [(r["ID"], r["NAME"], float(r["VALUE"])) for r in out["rows"]] == [(1, "a", 1.5), (2, "b", 2.25)]
    assert (
        list(out["command_2"]["rows"][0].values()) == [2] and "command_3" in out
    )  # Snowflake: "number of rows inserted"
    assert sf_auth["sf_password"] in ctx.redacted


def test_sql_error_is_an_error_outcome_with_errno(sf_auth, make_ctx):
    with pytest.raises(ToolError) as ei:
        snowflake_tool({"auth": sf_auth, "command": "SELECT * FROM TEST_DB.PUBLIC.NO_SUCH_TABLE"}, make_ctx())
    e = ei.value
    assert e.kind == "snowflake_error" and e.code is not None and "does not exist" in e.message.lower()
    assert "snowflake" in e.details


def test_unreachable_server_is_a_retryable_error(make_ctx):
    auth = {
        "account": "x",
        "user": "u",
        "password": "p",
        "host": "127.0.0.1",
        "port": 1,
        "protocol": "http",
        "login_timeout": 2,
    }
    with pytest.raises(ToolError) as ei:
        snowflake_tool({"auth": auth, "command": "SELECT 1"}, make_ctx())
    assert ei.value.kind == "snowflake_error" and ei.value.retryable


def test_bad_config_is_a_clear_validation_error(make_ctx):
    with pytest.raises(ToolConfigError, match="kind 'snowflake': invalid config: command"):
        get_tool("snowflake").check_config({"command": {"not": "sql"}})
    with pytest.raises(ToolError, match="needs account and user"):
        snowflake_tool({"auth": {"password": "p"}, "command": "SELECT 1"}, make_ctx())
    with pytest.raises(ToolError, match="credential needs password or private_key"):
        snowflake_tool({"auth": {"account": "a", "user": "u"}, "command": "SELECT 1"}, make_ctx())


def test_transfer_postgres_to_snowflake_and_back(sf_auth, pg_tools_db, pg_keychain, make_ctx):
    ctx = make_ctx(pg_keychain)
    snowflake_tool(
        {
            "auth": sf_auth,
            "command": "CREATE DATABASE IF NOT EXISTS TEST_DB;"
            "CREATE OR REPLACE TABLE TEST_DB.PUBLIC.XF (id INTEGER, name STRING)",
        },
        ctx,
    )
    with psycopg.connect(pg_tools_db, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS sf_src, sf_back")
        conn.execute(
            "CREATE TABLE sf_src AS SELECT g AS id, 'n' || g AS name FROM generate_series(1, 1200) g"
        )
        conn.execute("CREATE TABLE sf_back (id int, name text)")
        out = transfer_tool(
            {
                "source": {"type": "postgres", "auth": "pg_test", "query": "SELECT id, name FROM sf_src"},
                "target": {"type": "snowflake", "auth": sf_auth, "table": "TEST_DB.PUBLIC.XF"},
                "chunk_size": 500,
            },
            ctx,
        )
        assert out["rows_transferred"] == 1200 and out["chunks_processed"] == 3
        out = transfer_tool(
            {
                "source": {
                    "type": "snowflake",
                    "auth": sf_auth,
                    "query": "SELECT id, name FROM TEST_DB.PUBLIC.XF",
                },
                "target": {
                    "type": "postgres",
                    "auth": "pg_test",
                    "table": "sf_back",
                    "mapping": {"id": "ID", "name": "NAME"},
                },
            },
            ctx,
        )
        assert out["rows_transferred"] == 1200 and out["direction"] == "snowflake_to_postgres"
        assert conn.execute("SELECT count(*), sum(id) FROM sf_back").fetchone() == (1200, 720600)
        conn.execute("DROP TABLE IF EXISTS sf_src, sf_back")
