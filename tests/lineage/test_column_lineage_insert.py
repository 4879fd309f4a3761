"""Column lineage of ``INSERT INTO t (cols) SELECT …`` and of transformations (issue 18.5):
openlineage-sql names output columns after the select items and ignores the INSERT column
list; lineage/sql_shape maps them by position and gives each its subtype per the
column-lineage facet spec (DIRECT IDENTITY / TRANSFORMATION / AGGREGATION, masking).
Real runs on DuckDB and PostgreSQL; every emitted event validated against the bundled spec
and the semantic rules; the statements really ran, so the mapped columns are the real ones."""

from __future__ import annotations

import textwrap
import uuid

import duckdb
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from noetl_dagster.engine import events as ev
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store
from noetl_lineage.convert import convert_all
from noetl_lineage.sql import column_lineage
from noetl_lineage.sql_shape import shape, split_statements
from noetl_lineage.validate import semantic_errors
from tests.lineage.lineage_helpers import as_json

PG_DSN = "host=127.0.0.1 port=5432 dbname=test user=postgres"


def _run(tmp_path, text):
    path = tmp_path / "pb.yaml"
    path.write_text(textwrap.dedent(text))
    r = run_playbook(path, data_dir=tmp_path / "data", event_store=str(tmp_path / "events.db"))
    assert r.status == "completed", r.to_json()
    with open_event_store(r.event_store_url) as store:
        events = store.read(r.execution_id)
    lineage = [as_json(e) for e in convert_all(events)]
    return events, lineage


def _output(lineage, job_suffix, name):
    found = [e for e in lineage if e["eventType"] == "COMPLETE" and e["job"]["name"].endswith(job_suffix)]
    assert len(found) == 1, [e["job"]["name"] for e in lineage]
    return {o["name"]: o for o in found[0]["outputs"]}[name]


def _map(fields):
    """{output column: {(input table, input column, subtype, masking)}}"""
    return {
        col: {
            (f["name"], f["field"], t["subtype"], t.get("masking", False))
            for f in spec["inputFields"]
            for t in f["transformations"]
        }
        for col, spec in fields.items()
    }


def _indirect(facet):
    """{(input table, input column, INDIRECT subtype)} of the facet's dataset-level list."""
    return {
        (f["name"], f["field"], t["subtype"])
        for f in facet.get("dataset", [])
        for t in f["transformations"]
        if t["type"] == "INDIRECT"
    }


def _check(lineage, validator):
    for doc in lineage:
        assert validator.errors(doc) == [], doc
    assert semantic_errors(lineage) == []


DUCK = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: duck_insert_cols, path: tests/duck_insert_cols}
workflow:
  - step: start
    tool:
      - name: setup
        kind: duckdb
        database: cols.duckdb
        commands:
          - CREATE OR REPLACE TABLE s (x INTEGER, y INTEGER, email VARCHAR, g VARCHAR)
          - INSERT INTO s VALUES (1, 2, 'a@b', 'k'), (3, 4, 'c@d', 'k')
          - CREATE OR REPLACE TABLE t (a INTEGER, b INTEGER, c BIGINT, d VARCHAR, e BIGINT)
    next:
      arcs: [{step: load}]
  - step: load
    tool:
      - name: insert_cols
        kind: duckdb
        database: cols.duckdb
        command: >-
          INSERT INTO t (b, a, c, d, e)
          SELECT s.x, y AS renamed, x + y, md5(email), count(*) FROM s GROUP BY s.x, y, email
    next:
      arcs: [{step: union}]
  - step: union
    tool:
      - name: insert_union
        kind: duckdb
        database: cols.duckdb
        command: >-
          INSERT INTO t (a, b) SELECT x, y * 2 FROM s UNION ALL SELECT y, sum(x) FROM s GROUP BY y
"""


def test_duckdb_insert_column_list_maps_by_position_with_subtypes(tmp_path, validator):
    events, lineage = _run(tmp_path, DUCK)
    db = (tmp_path / "data" / "cols.duckdb").resolve()
    with duckdb.connect(str(db), read_only=True) as con:  # the statement ran: b holds s.x, a holds s.y
        assert con.execute("SELECT b, a, c FROM t WHERE d IS NOT NULL ORDER BY b").fetchall() == [
            (1, 2, 3),
            (3, 4, 7),
        ]
    _check(lineage, validator)
    out = _output(lineage, ".load", "main.t")
    assert _map(out["facets"]["columnLineage"]["fields"]) == {
        "b": {("main.s", "x", "IDENTITY", False)},
        "a": {("main.s", "y", "IDENTITY", False)},  # renamed in the select list, still the exact value
        "c": {("main.s", "x", "TRANSFORMATION", False), ("main.s", "y", "TRANSFORMATION", False)},
        "d": {("main.s", "email", "TRANSFORMATION", True)},  # a hash masks the value
        # e = count(*) reads no column: no entry
    }
    assert _indirect(out["facets"]["columnLineage"]) == {  # GROUP BY: dataset-level INDIRECT lineage
        ("main.s", "x", "GROUP_BY"),
        ("main.s", "y", "GROUP_BY"),
        ("main.s", "email", "GROUP_BY"),
    }
    union = _output(lineage, ".union", "main.t")
    assert _map(union["facets"]["columnLineage"]["fields"]) == {
        "a": {("main.s", "x", "IDENTITY", False), ("main.s", "y", "IDENTITY", False)},
        "b": {("main.s", "y", "TRANSFORMATION", False), ("main.s", "x", "AGGREGATION", False)},
    }
    assert all(e.data["outcome"]["status"] == "ok" for e in events if e.name == ev.TASK_DONE)


PG = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: pg_insert_cols, path: tests/pg_insert_cols}
workflow:
  - step: start
    tool:
      - name: setup
        kind: postgres
        connection_string: "host=127.0.0.1 port=5432 dbname=test user=postgres"
        command: |
          CREATE TABLE SCHEMA_NAME.orders (id int, customer text, amount numeric, qty int);
          CREATE TABLE SCHEMA_NAME.totals (who text, spent numeric, n_orders bigint, big_qty int);
          CREATE TABLE SCHEMA_NAME.audit (what text, id_copy int);
          INSERT INTO SCHEMA_NAME.orders VALUES (1, 'ann', 2.5, 4), (2, 'ann', 1, 1), (3, 'bob', 10, 2);
    next:
      arcs: [{step: load}]
  - step: load
    tool:
      - name: two_inserts
        kind: postgres
        connection_string: "host=127.0.0.1 port=5432 dbname=test user=postgres"
        command: |
          INSERT INTO SCHEMA_NAME.totals (who, spent, n_orders, big_qty)
            SELECT o.customer, round(sum(o.amount * o.qty), 2), count(o.id), max(o.qty)
            FROM SCHEMA_NAME.orders o WHERE o.qty > 0 GROUP BY o.customer;
          INSERT INTO SCHEMA_NAME.audit (id_copy, what) SELECT id, 'order ' || customer FROM SCHEMA_NAME.orders
"""


@pytest.fixture
def pg_schema():
    name = f"linc_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
        yield name
        conn.execute(f"DROP SCHEMA {name} CASCADE")


def test_postgres_two_inserts_with_column_lists_each_map_their_own_table(tmp_path, validator, pg_schema):
    _, lineage = _run(tmp_path, PG.replace("SCHEMA_NAME", pg_schema))
    with psycopg.connect(PG_DSN) as conn:
        assert conn.execute(
            f"SELECT who, spent, n_orders, big_qty FROM {pg_schema}.totals ORDER BY who"
        ).fetchall() == [("ann", 11, 2, 4), ("bob", 20, 1, 2)]
        assert conn.execute(f"SELECT id_copy, what FROM {pg_schema}.audit ORDER BY 1").fetchone() == (
            1,
            "order ann",
        )
    _check(lineage, validator)
    orders = f"test.{pg_schema}.orders"
    totals = _output(lineage, ".load", f"test.{pg_schema}.totals")
    assert _map(totals["facets"]["columnLineage"]["fields"]) == {
        "who": {(orders, "customer", "IDENTITY", False)},
        "spent": {(orders, "amount", "AGGREGATION", False), (orders, "qty", "AGGREGATION", False)},
        "n_orders": {(orders, "id", "AGGREGATION", False)},
        "big_qty": {(orders, "qty", "AGGREGATION", False)},
    }
    assert _indirect(totals["facets"]["columnLineage"]) == {
        (orders, "qty", "FILTER"),
        (orders, "customer", "GROUP_BY"),
    }
    audit = _output(
        lineage, ".load", f"test.{pg_schema}.audit"
    )  # the second statement's table, not the first's
    assert _map(audit["facets"]["columnLineage"]["fields"]) == {
        "id_copy": {(orders, "id", "IDENTITY", False)},
        "what": {(orders, "customer", "TRANSFORMATION", False)},
    }
    assert "dataset" not in audit["facets"]["columnLineage"]  # no filter, join, grouping or sort


def test_shapes_it_does_not_know_keep_openlineage_sqls_names():
    # SELECT *: positions unknown; VALUES: no inputs; BY NAME (DuckDB) maps by name, not position
    assert shape("INSERT INTO t (a, b) SELECT * FROM s") is None
    assert shape("INSERT INTO t (a, b) VALUES (1, 2)") is None
    assert shape("INSERT INTO t BY NAME SELECT x AS b FROM s") is None
    assert shape("INSERT INTO t (a, b) SELECT x FROM s") is None  # the counts differ
    assert (
        shape("INSERT INTO t (a) SELECT x FROM s UNION ALL (SELECT y FROM v)") is None
    )  # a parenthesized branch
    f = column_lineage(
        "INSERT INTO t SELECT x AS a, y FROM s", "duckdb://m", kind="duckdb", default_schema="main"
    )
    assert set(f["main.t"].fields) == {"a", "y"}
    # through a CTE or a derived table the value may have been computed there: not claimed IDENTITY
    cte = column_lineage(
        "INSERT INTO t (a) WITH c AS (SELECT x + 1 AS x FROM s) SELECT x FROM c",
        "duckdb://m",
        kind="duckdb",
        default_schema="main",
    )
    assert [t.subtype for t in cte["main.t"].fields["a"].inputFields[0].transformations] == ["TRANSFORMATION"]
    assert split_statements("INSERT INTO a SELECT ';' FROM b; -- x;\nSELECT $$;$$") == [
        "INSERT INTO a SELECT ';' FROM b",
        "-- x;\nSELECT $$;$$",
    ]


def test_indirect_reads_join_filter_group_sort_only_when_unambiguous():
    joined = shape(
        "INSERT INTO t (a) SELECT o.customer FROM public.orders o JOIN customers AS c ON c.id = o.cid "
        "WHERE o.qty > 0 AND c.active GROUP BY o.customer ORDER BY o.customer LIMIT 5"
    )
    assert set(joined.indirect) == {
        ("customers", "id", "JOIN"),
        ("public.orders", "cid", "JOIN"),
        ("public.orders", "qty", "FILTER"),
        ("customers", "active", "FILTER"),
        ("public.orders", "customer", "GROUP_BY"),
        ("public.orders", "customer", "SORT"),
    }
    assert shape("INSERT INTO t (a) SELECT x FROM s, u WHERE k = 1").indirect == ()  # k: s or u?
    # GROUP BY / ORDER BY by position: the input columns of that select item
    by_pos = column_lineage(
        "INSERT INTO t (d, n) SELECT o.created_at::date, sum(o.qty) FROM o GROUP BY 1 ORDER BY 2 DESC",
        "duckdb://m",
        kind="duckdb",
        default_schema="main",
    )["main.t"]
    assert {(f.name, f.field, t.subtype) for f in by_pos.dataset for t in f.transformations} == {
        ("main.o", "created_at", "GROUP_BY"),
        ("main.o", "qty", "SORT"),
    }
    assert (
        shape("INSERT INTO t (a) SELECT x FROM s WHERE k IN (SELECT k FROM v)").indirect == ()
    )  # a subquery
    assert shape("INSERT INTO t (a) SELECT x FROM s WHERE y > 0 ON CONFLICT (a) DO NOTHING").indirect == (
        ("s", "y", "FILTER"),
    )
    assert shape("INSERT INTO t (a) SELECT x FROM s WHERE d > current_date - interval '1 day'").indirect == (
        ("s", "d", "FILTER"),
    )


_FRAGMENTS = [
    "INSERT",
    "INTO",
    "t",
    "(",
    ")",
    ",",
    "a",
    "SELECT",
    "FROM",
    "s",
    "AS",
    "x",
    "UNION",
    "ALL",
    "WITH",
    "'q;'",
    ";",
    "*",
    ".",
    "sum",
    "over",
    "DISTINCT",
    "ON",
    "create",
    "--c\n",
    "/*x*/",
    "$$",
    '"Q"',
    "::",
    "VALUES",
    "1",
    "BY",
    "CASE",
    "END",
    "E'\\''",
    "+",
]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(_FRAGMENTS), max_size=20))
def test_any_token_soup_gives_a_shape_or_none_never_an_error(parts):
    sql = " ".join(parts)
    for text in (sql, "INSERT INTO t " + sql, "INSERT INTO t (a, b) SELECT " + sql):
        form = shape(text)
        assert form is None or all(len(b) == len(form.targets()) for b in form.branches)
    assert all(split_statements(sql))
