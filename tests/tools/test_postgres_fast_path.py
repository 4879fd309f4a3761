"""kind: postgres — the lean per-call path and the bulk inputs (issue 19.2), on the real Postgres.

The per-call path must not parse the connection string or make sockets per call (a parallel loop
calls it thousands of times), and the network bytes it measures must stay exact per call now that
one TCP_INFO read serves as the next call's "before". ``batch`` runs executemany in one
transaction; ``copy`` streams rows with COPY.
"""

from __future__ import annotations

import os
import uuid

import psycopg
import pytest

import noetl_dagster.tools.postgres as pg
from noetl_dagster.engine.usage import Meter
from noetl_dagster.tools.postgres import postgres_tool
from noetl_dagster.tools.registry import ToolError


@pytest.fixture
def table(pg_tools_db):
    name = "t_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_tools_db, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, note text, doc jsonb)")
    yield name
    with psycopg.connect(pg_tools_db, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}")


def _fresh_dsn(pg_tools_db: str) -> str:
    """A connection string no earlier test used: cold caches, a pool of its own."""
    return f"{pg_tools_db}?application_name=fast_{uuid.uuid4().hex[:8]}"


def test_hot_path_parses_the_conninfo_once_and_makes_one_socket_per_connection(
    make_ctx, pg_tools_db, table, monkeypatch
):
    dsn = _fresh_dsn(pg_tools_db)
    ctx = make_ctx()
    ctx.spec = {"pool_size": 1}
    notes: list[dict] = []
    ctx.note = lambda **kw: notes.append(kw)
    parses, dups = [], []
    real_parse, real_dup = pg.conninfo_to_dict, os.dup
    monkeypatch.setattr(pg, "conninfo_to_dict", lambda s: parses.append(s) or real_parse(s))
    monkeypatch.setattr(os, "dup", lambda fd: dups.append(fd) or real_dup(fd))
    for i in range(30):
        postgres_tool(
            {"connection_string": dsn, "command": f"INSERT INTO {table} VALUES (%s, %s)", "params": [i, "n"]},
            ctx,
        )
    # before: every call parsed the conninfo for lineage (libpq's parser) and dup'ed the socket twice
    assert (
        len(notes) == 30
        and notes[-1]["sql_namespace"].startswith("postgres://")
        and notes[-1]["sql_database"]
    )
    assert len(parses) <= 2  # the auth checked for a password once per execution, the server once per process
    assert len(dups) == 1  # one pooled connection, one kept socket for its TCP_INFO
    with psycopg.connect(pg_tools_db) as c:
        assert c.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 30


def test_lineage_server_is_parsed_once_per_connection_string(make_ctx, pg_tools_db, monkeypatch):
    dsn = _fresh_dsn(pg_tools_db)
    parses = []
    real_parse = pg.conninfo_to_dict
    monkeypatch.setattr(pg, "conninfo_to_dict", lambda s: parses.append(s) or real_parse(s))
    ctx = make_ctx()
    ctx.note = lambda **kw: None
    for _ in range(20):
        pg.note_sql("SELECT 1", dsn, None, ctx)
    assert len(parses) == 1


def _metered(inputs, ctx):
    m = Meter()
    try:
        postgres_tool(inputs, ctx)
    finally:
        usage = m.stop()
    return usage


def test_wire_bytes_stay_per_call_when_one_read_serves_as_the_next_before(make_ctx, pg_tools_db):
    dsn = _fresh_dsn(pg_tools_db)
    ctx = make_ctx()
    ctx.spec = {"pool_size": 1}  # every call on the same connection
    big_in = _metered({"connection_string": dsn, "query": "SELECT repeat('x', 200000) AS big"}, ctx)
    small = _metered({"connection_string": dsn, "query": "SELECT 1 AS one"}, ctx)
    postgres_tool(
        {"connection_string": dsn, "query": "SELECT repeat('y', 100000) AS unmetered"}, ctx
    )  # no meter
    after_unmetered = _metered({"connection_string": dsn, "query": "SELECT 2 AS two"}, ctx)
    big_out = _metered(
        {"connection_string": dsn, "query": "SELECT length(%s) AS n", "params": ["p" * 50000]}, ctx
    )
    assert 200_000 <= big_in["net_in_bytes"] < 210_000 and big_in["net_out_bytes"] < 1_000
    assert small["net_in_bytes"] < 1_000 and small["net_out_bytes"] < 1_000
    assert after_unmetered["net_in_bytes"] < 1_000  # the unmetered 100 kB is not billed to the next call
    assert 50_000 <= big_out["net_out_bytes"] < 52_000 and big_out["net_in_bytes"] < 1_000
    assert "egress_bytes" not in big_in  # loopback is inside the cluster


def test_batch_runs_executemany_in_one_transaction(make_ctx, pg_keychain, pg_tools_db, table):
    ctx = make_ctx(pg_keychain)
    rows = [{"id": i, "note": f"row {i}"} for i in range(500)]
    out = postgres_tool(
        {
            "auth": "pg_test",
            "command": f"INSERT INTO {table} (id, note) VALUES (%(id)s, %(note)s)",
            "batch": rows,
        },
        ctx,
    )
    assert out["row_count"] == 500 and out["rows"] == [] and out["command_0"]["row_count"] == 500
    ret = postgres_tool(
        {
            "auth": "pg_test",
            "command": f"UPDATE {table} SET note = %s WHERE id = %s RETURNING id, note",
            "batch": [["a", 3], ["b", 1], ["c", 999]],
        },
        ctx,
    )
    assert ret["rows"] == [{"id": 3, "note": "a"}, {"id": 1, "note": "b"}] and ret["row_count"] == 2
    assert ret["columns"] == ["id", "note"]
    with pytest.raises(ToolError) as e:  # row 2 collides with an existing id: nothing of the batch stays
        postgres_tool(
            {
                "auth": "pg_test",
                "command": f"INSERT INTO {table} (id) VALUES (%s)",
                "batch": [[1000], [0], [1001]],
            },
            ctx,
        )
    assert e.value.details["pg"]["code"] == "unique_violation" and not e.value.retryable
    with psycopg.connect(pg_tools_db) as c:
        assert c.execute(f"SELECT count(*), count(*) FILTER (WHERE id >= 1000) FROM {table}").fetchone() == (
            500,
            0,
        )
    with pytest.raises(ToolError, match="exactly one statement"):
        postgres_tool({"auth": "pg_test", "command": "SELECT 1; SELECT 2", "batch": [[1]]}, ctx)
    with pytest.raises(ToolError, match=r"batch\[1\] must be a list or a mapping"):
        postgres_tool(
            {"auth": "pg_test", "command": f"INSERT INTO {table} (id) VALUES (%s)", "batch": [[1], 5]}, ctx
        )
    empty = postgres_tool(
        {"auth": "pg_test", "command": f"INSERT INTO {table} (id) VALUES (%s)", "batch": []}, ctx
    )
    assert empty["row_count"] == 0


def test_copy_streams_lists_and_mappings_with_json_values(make_ctx, pg_keychain, pg_tools_db, table):
    ctx = make_ctx(pg_keychain)
    notes: list[dict] = []
    ctx.note = lambda **kw: notes.append(kw)
    out = postgres_tool({"auth": "pg_test", "copy": {"table": f"public.{table}", "columns": ["id", "note", "doc"],
                                                    "rows": [[1, "tab\there", {"k": [1, 2]}], [2, None, None]]}}, ctx)  # fmt: skip
    assert out["row_count"] == 2 and out["command_0"]["row_count"] == 2
    assert notes[-1]["sql"] == f"COPY public.{table} (id, note, doc) FROM STDIN"
    out = postgres_tool(
        {
            "auth": "pg_test",
            "copy": {"table": table, "rows": [{"id": i, "note": f"n{i}"} for i in range(3, 2003)]},
        },
        ctx,
    )
    assert out["row_count"] == 2000
    with psycopg.connect(pg_tools_db) as c:
        assert c.execute(f"SELECT note, doc FROM {table} WHERE id = 1").fetchone() == (
            "tab\there",
            {"k": [1, 2]},
        )
        assert c.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 2002
    with pytest.raises(ToolError) as e:  # a duplicate key anywhere: the COPY is one transaction
        postgres_tool(
            {"auth": "pg_test", "copy": {"table": table, "columns": ["id"], "rows": [[5000], [1]]}}, ctx
        )
    assert e.value.details["pg"]["code"] == "unique_violation"
    with pytest.raises(ToolError, match="must be a list or a mapping"):
        postgres_tool(
            {"auth": "pg_test", "copy": {"table": table, "columns": ["id"], "rows": [[6000], "x"]}}, ctx
        )
    with psycopg.connect(pg_tools_db) as c:
        assert c.execute(f"SELECT count(*) FROM {table} WHERE id >= 5000").fetchone()[0] == 0
    with pytest.raises(ToolError, match="'copy.table' is required"):
        postgres_tool({"auth": "pg_test", "copy": {"rows": [[1]]}}, ctx)


def test_batch_and_copy_through_the_engine(tmp_path, pg_tools_db, table):
    from noetl_dagster.dsl import load_playbook_dict
    from noetl_dagster.runners.local import run_playbook

    pb = load_playbook_dict(
        {
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": {"name": "pg_bulk", "path": "tests/pg_bulk"},
            "workload": {"dsn": pg_tools_db, "items": [[i, f"b{i}"] for i in range(100)]},
            "workflow": [
                {
                    "step": "start",
                    "tool": [
                        {"batch_in": {"kind": "postgres", "connection_string": "{{ workload.dsn }}",
                                      "command": f"INSERT INTO {table} (id, note) VALUES (%s, %s)", "batch": "{{ workload.items }}"}},
                        {"copy_in": {"kind": "postgres", "connection_string": "{{ workload.dsn }}",
                                     "copy": {"table": table, "columns": ["id", "note"], "rows": [[1000, "c"], [1001, "d"]]}}},
                        {"count": {"kind": "postgres", "connection_string": "{{ workload.dsn }}", "query": f"SELECT count(*) AS n FROM {table}"}},
                    ],
                }
            ],
        }
    )  # fmt: skip
    res = run_playbook(pb, data_dir=tmp_path / "data")
    assert res.status == "completed", res
    assert res.results["start"]["rows"] == [{"n": 102}]


def test_a_repeated_statement_is_prepared_server_side_from_its_second_call(make_ctx, pg_tools_db, table):
    dsn = _fresh_dsn(pg_tools_db)
    ctx = make_ctx()
    ctx.spec = {"pool_size": 1}  # one connection: the prepared statements are that session's
    insert = f"INSERT INTO {table} (id, note) VALUES (%s, %s)"

    def prepared() -> list[str]:
        out = postgres_tool(
            {"connection_string": dsn, "query": "SELECT statement FROM pg_prepared_statements"}, ctx
        )
        return [r["statement"] for r in out["rows"] if table in r["statement"]]

    postgres_tool({"connection_string": dsn, "command": insert, "params": [1, "a"]}, ctx)
    assert prepared() == []  # a one-off statement is not prepared
    postgres_tool({"connection_string": dsn, "command": insert, "params": [2, "b"]}, ctx)
    assert len(prepared()) == 1  # psycopg's default threshold (5) would still parse and plan it each call
    for i in range(3, 10):
        postgres_tool({"connection_string": dsn, "command": insert, "params": [i, "c"]}, ctx)
    assert len(prepared()) == 1
