"""kind: postgres against the machine's real PostgreSQL (own database, own tables per test)."""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest

from noetl_dagster.tools.postgres import postgres_tool, split_sql
from noetl_dagster.tools.registry import ToolError, get_tool


@pytest.fixture
def table(pg_tools_db):
    name = "t_" + uuid.uuid4().hex[:10]
    yield name
    with psycopg.connect(pg_tools_db, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}")


def test_registered():
    assert get_tool("postgres").fn is postgres_tool


def test_select_returns_rows_as_objects(make_ctx, pg_keychain):
    out = postgres_tool(
        {"auth": "pg_test", "query": "SELECT 1 AS a, 'x' AS b UNION ALL SELECT 2, 'y' ORDER BY a"},
        make_ctx(pg_keychain),
    )
    expected = {"rows": [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}], "row_count": 2, "columns": ["a", "b"]}
    assert out == {**expected, "command_0": expected}


def test_several_statements_return_the_last_result(make_ctx, pg_keychain, table):
    out = postgres_tool(
        {
            "auth": "pg_test",
            "command": f"""
                -- a comment; with a semicolon
                CREATE TABLE {table} (id int PRIMARY KEY, note text, payload jsonb);
                INSERT INTO {table} VALUES (1, 'semi;colon', '{{"k": [1, 2]}}'), (2, $$dollar; quoted$$, NULL);
                SELECT id, note, payload FROM {table} ORDER BY id;
            """,
        },
        make_ctx(pg_keychain),
    )
    assert out["rows"] == [
        {"id": 1, "note": "semi;colon", "payload": {"k": [1, 2]}},
        {"id": 2, "note": "dollar; quoted", "payload": None},
    ]
    assert out["columns"] == ["id", "note", "payload"]
    assert (
        out["command_1"] == {"rows": [], "row_count": 2, "columns": []}
        and out["command_2"]["rows"] == out["rows"]
    )
    assert "command_3" not in out


def test_last_statement_without_rows_reports_row_count(make_ctx, pg_keychain, table):
    out = postgres_tool(
        {
            "auth": "pg_test",
            "command": f"CREATE TABLE {table} (id int); INSERT INTO {table} SELECT generate_series(1, 5)",
        },
        make_ctx(pg_keychain),
    )
    assert {k: out[k] for k in ("rows", "row_count", "columns")} == {
        "rows": [],
        "row_count": 5,
        "columns": [],
    }


def test_list_of_commands(make_ctx, pg_keychain, table):
    out = postgres_tool(
        {
            "auth": "pg_test",
            "command": [
                f"CREATE TABLE {table} (id int)",
                f"INSERT INTO {table} VALUES (7)",
                f"SELECT * FROM {table}",
            ],
        },
        make_ctx(pg_keychain),
    )
    assert out["rows"] == [{"id": 7}]


def test_params_are_bound_server_side_never_spliced(make_ctx, pg_keychain, table):
    ctx = make_ctx(pg_keychain)
    postgres_tool({"auth": "pg_test", "command": f"CREATE TABLE {table} (id int, name text)"}, ctx)
    evil = "x'); DROP TABLE " + table + "; --"
    postgres_tool(
        {"auth": "pg_test", "command": f"INSERT INTO {table} VALUES (%s, %s)", "params": [1, evil]}, ctx
    )
    out = postgres_tool(
        {"auth": "pg_test", "query": f"SELECT name FROM {table} WHERE id = %(id)s", "params": {"id": 1}}, ctx
    )
    assert out["rows"] == [{"name": evil}]


def test_named_params_across_statements_in_one_transaction(make_ctx, pg_keychain, table):
    ctx = make_ctx(pg_keychain)
    out = postgres_tool(
        {
            "auth": "pg_test",
            "command": f"CREATE TABLE {table} (id int, v text); INSERT INTO {table} VALUES (%(id)s, %(v)s); "
            f"SELECT v FROM {table} WHERE id = %(id)s",
            "params": {"id": 3, "v": "three"},
        },
        ctx,
    )
    assert out["rows"] == [{"v": "three"}] and out["command_1"]["row_count"] == 1


def test_positional_params_ambiguous_across_statements(make_ctx, pg_keychain):
    with pytest.raises(ToolError, match="use named params"):
        postgres_tool(
            {"auth": "pg_test", "command": "SELECT %s; SELECT %s", "params": [1, 2]}, make_ctx(pg_keychain)
        )


def test_failure_rolls_back_the_whole_command(make_ctx, pg_keychain, table):
    ctx = make_ctx(pg_keychain)
    postgres_tool({"auth": "pg_test", "command": f"CREATE TABLE {table} (id int PRIMARY KEY)"}, ctx)
    with pytest.raises(ToolError) as info:
        postgres_tool(
            {"auth": "pg_test", "command": f"INSERT INTO {table} VALUES (1); INSERT INTO {table} VALUES (1)"},
            ctx,
        )
    assert info.value.details["pg"] == {"code": "unique_violation", "sqlstate": "23505"}
    assert not info.value.retryable
    assert postgres_tool({"auth": "pg_test", "query": f"SELECT count(*) AS n FROM {table}"}, ctx)["rows"] == [
        {"n": 0}
    ]
    # the same with params (explicit transaction path)
    with pytest.raises(ToolError):
        postgres_tool(
            {
                "auth": "pg_test",
                "command": f"INSERT INTO {table} VALUES (%(a)s); INSERT INTO {table} VALUES (%(a)s)",
                "params": {"a": 5},
            },
            ctx,
        )
    assert postgres_tool({"auth": "pg_test", "query": f"SELECT count(*) AS n FROM {table}"}, ctx)["rows"] == [
        {"n": 0}
    ]


def test_bad_sql_carries_pg_code_and_sqlstate(make_ctx, pg_keychain):
    with pytest.raises(ToolError) as info:
        postgres_tool({"auth": "pg_test", "query": "SELEC 1"}, make_ctx(pg_keychain))
    e = info.value
    assert e.details["pg"] == {"code": "syntax_error", "sqlstate": "42601"}
    assert (e.kind, e.retryable, e.code) == ("pg_error", False, "syntax_error")
    assert "credential 'pg_test'" in e.message and "syntax error" in e.message


def test_missing_table(make_ctx, pg_keychain):
    with pytest.raises(ToolError) as info:
        postgres_tool({"auth": "pg_test", "query": "SELECT * FROM no_such_table_xyz"}, make_ctx(pg_keychain))
    assert info.value.details["pg"]["sqlstate"] == "42P01"


def test_connection_refused_is_retryable(make_ctx, pg_keychain):
    with pytest.raises(ToolError) as info:
        postgres_tool({"auth": "pg_refused", "query": "SELECT 1"}, make_ctx(pg_keychain))
    e = info.value
    assert e.retryable and e.details["pg"]["sqlstate"] == "08001"
    assert "Connection refused" in e.message


def test_wrong_credentials_are_not_retryable_and_do_not_leak_the_password(make_ctx, pg_keychain):
    ctx = make_ctx(pg_keychain)
    with pytest.raises(ToolError) as info:
        postgres_tool({"auth": "pg_wrong_user", "query": "SELECT 1"}, ctx)
    e = info.value
    assert e.details["pg"] == {"code": "invalid_authorization_specification", "sqlstate": "28000"}
    assert not e.retryable
    assert "pw-xyz" not in e.message and "pw-xyz" in ctx.redacted
    with pytest.raises(ToolError) as info:
        postgres_tool({"auth": "pg_wrong_db", "query": "SELECT 1"}, ctx)
    assert info.value.details["pg"]["sqlstate"] == "3D000"


def test_unknown_credential(make_ctx, pg_keychain):
    with pytest.raises(ToolError, match="postgres: unknown credential 'nope'"):
        postgres_tool({"auth": "nope", "query": "SELECT 1"}, make_ctx(pg_keychain))


def test_connection_string_directly_and_in_a_record(make_ctx, pg_keychain, pg_tools_db):
    ctx = make_ctx(pg_keychain)
    assert (
        postgres_tool({"connection_string": pg_tools_db, "query": "SELECT current_database() AS d"}, ctx)[
            "rows"
        ][0]["d"]
        == (pg_tools_db.rpartition("/")[2])
    )
    assert postgres_tool({"auth": "pg_dsn", "query": "SELECT 1 AS one"}, ctx)["rows"] == [{"one": 1}]


def test_schema_sets_search_path_for_the_call(make_ctx, pg_keychain, pg_tools_db):
    schema = "s_" + uuid.uuid4().hex[:8]
    ctx = make_ctx(pg_keychain)
    try:
        postgres_tool(
            {
                "auth": "pg_test",
                "command": f"CREATE SCHEMA {schema}; CREATE TABLE {schema}.t (v int); INSERT INTO {schema}.t VALUES (9)",
            },
            ctx,
        )
        out = postgres_tool({"auth": "pg_test", "schema": schema, "query": "SELECT v FROM t"}, ctx)
        assert out["rows"] == [{"v": 9}]
        with pytest.raises(ToolError):  # search_path was local to that call
            postgres_tool({"auth": "pg_test", "query": "SELECT v FROM t"}, ctx)
    finally:
        with psycopg.connect(pg_tools_db, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def test_one_pool_per_credential_shared_by_parallel_calls(make_ctx, pg_keychain, table):
    ctx = make_ctx(pg_keychain)
    postgres_tool({"auth": "pg_test", "command": f"CREATE TABLE {table} (id int)"}, ctx)
    errors: list[BaseException] = []

    def insert(start: int):
        try:
            for i in range(start, start + 25):
                postgres_tool(
                    {"auth": "pg_test", "command": f"INSERT INTO {table} VALUES (%s)", "params": [i]}, ctx
                )
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=insert, args=(k * 100,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert postgres_tool({"auth": "pg_test", "query": f"SELECT count(*) AS n FROM {table}"}, ctx)["rows"] == [
        {"n": 200}
    ]
    from noetl_dagster.tools.postgres import connector_for

    assert set(ctx.factory_calls.values()) == {1}  # the credential resolved once per execution
    other = make_ctx(pg_keychain)  # another execution with the same credential shares the pool
    postgres_tool({"auth": "pg_test", "query": "SELECT 1"}, other)
    conninfo = ctx.resources["pg.conninfo:pg_test"][0]
    assert connector_for(conninfo, ctx) is connector_for(conninfo, other)


def test_huge_result(make_ctx, pg_keychain):
    out = postgres_tool(
        {
            "auth": "pg_test",
            "query": "SELECT g AS id, md5(g::text) AS h, now() AS ts, g::numeric / 3 AS q FROM generate_series(1, 50000) g",
        },
        make_ctx(pg_keychain),
    )
    assert out["row_count"] == 50000
    last = out["rows"][-1]
    assert last["id"] == 50000 and isinstance(last["ts"], str) and isinstance(last["q"], float)


def test_missing_sql_and_bad_params(make_ctx, pg_keychain):
    with pytest.raises(ToolError, match="'command' \\(or 'query'\\) is required"):
        postgres_tool({"auth": "pg_test"}, make_ctx(pg_keychain))
    with pytest.raises(ToolError, match="params must be a list or a mapping"):
        postgres_tool({"auth": "pg_test", "query": "SELECT %s", "params": 5}, make_ctx(pg_keychain))


@pytest.mark.parametrize(
    "sql, expected",
    [
        ("SELECT 1; SELECT 2;", ["SELECT 1", "SELECT 2"]),
        ("SELECT ';'; -- x;y\nSELECT 2", ["SELECT ';'", "-- x;y\nSELECT 2"]),
        ("SELECT $f$a;b$f$; /* c;d */ SELECT 'it''s;'", ["SELECT $f$a;b$f$", "/* c;d */ SELECT 'it''s;'"]),
        ('SELECT "we;ird" FROM t', ['SELECT "we;ird" FROM t']),
        ("-- only a comment;\n", []),
    ],
)
def test_split_sql(sql, expected):
    assert split_sql(sql) == expected
