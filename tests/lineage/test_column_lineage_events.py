"""columnLineage on emitted OpenLineage events (issue 18.5): a SQL task's statement is
recorded in its ``task.done`` event (``outcome.meta.sql``, redacted, bounded) and the
converter parses it into input/output datasets with the ``columnLineage`` facet.
Real runs: DuckDB on a file (and a transfer's source query), PostgreSQL on the local
server, Snowflake's protocol on fakesnow; every event validated
against the bundled spec and the semantic rules."""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid

import psycopg
import pytest

from noetl_dagster.engine import events as ev
from noetl_dagster.engine.replay import diff_snapshots, replay
from noetl_dagster.engine.worker import MAX_NOTE_CHARS
from noetl_dagster.runners.local import FINISHED_HOOKS, run_playbook
from noetl_dagster.storage.event_stores import open_event_store
from noetl_lineage.convert import convert_all
from noetl_lineage.validate import semantic_errors
from tests.lineage.lineage_helpers import as_json

SECRET = "sq1-5ecret-literal-9e2f"

DUCK = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: duck_lineage, path: tests/duck_lineage}
keychain:
  - name: probe
    kind: secrets
    provider: env
    map:
      key: NOETL_SQL_PROBE_SECRET
workflow:
  - step: start
    tool:
      - name: setup
        kind: duckdb
        database: lineage.duckdb
        commands:
          - CREATE OR REPLACE TABLE t1 (a INTEGER, b INTEGER)
          - INSERT INTO t1 VALUES (1, 2), (3, 4)
          - CREATE OR REPLACE TABLE t2 (a INTEGER, b INTEGER)
    next:
      arcs: [{step: load}]
  - step: load
    tool:
      - name: copy
        kind: duckdb
        database: lineage.duckdb
        command: INSERT INTO t2 SELECT a, b FROM t1
    next:
      arcs: [{step: move}]
  - step: move
    tool:
      - name: move
        kind: transfer
        source: {type: duckdb, database: lineage.duckdb, query: "SELECT a, b FROM t1 WHERE a > 0"}
        target: {type: duckdb, table: t3}
    next:
      arcs: [{step: probe}]
  - step: probe
    tool:
      - name: with_secret
        kind: duckdb
        database: lineage.duckdb
        command: "SELECT count(*) AS n FROM t1 WHERE '{{ keychain.probe.key }}' <> ''"
    next:
      arcs: [{step: big}]
  - step: big
    tool:
      - name: long_sql
        kind: duckdb
        command: "SELECT 1 AS one -- {{ 'x' * 20000 }}"
"""


def _run(tmp_path, text, monkeypatch):
    monkeypatch.setenv("NOETL_SQL_PROBE_SECRET", SECRET)
    path = tmp_path / "pb.yaml"
    path.write_text(textwrap.dedent(text))
    captured = []
    FINISHED_HOOKS.append(lambda eng: captured.append(eng.state.snapshot()))
    try:
        r = run_playbook(path, data_dir=tmp_path / "data", event_store=str(tmp_path / "events.db"))
    finally:
        FINISHED_HOOKS.pop()
    assert r.status == "completed", r.to_json()
    with open_event_store(r.event_store_url) as store:
        events = store.read(r.execution_id)
        assert diff_snapshots(captured[-1], replay(store, r.execution_id).snapshot()) == []  # replay == live
    return events


def _task_meta(events, task):
    done = [e for e in events if e.name == ev.TASK_DONE and e.data.get("task") == task]
    assert len(done) == 1
    return done[0].data["outcome"]["meta"]


def _step_complete(lineage, job_suffix):
    found = [e for e in lineage if e["eventType"] == "COMPLETE" and e["job"]["name"].endswith(job_suffix)]
    assert len(found) == 1, [e["job"]["name"] for e in lineage]
    return found[0]


def _check(lineage, validator):
    for doc in lineage:
        assert validator.errors(doc) == [], doc
    assert semantic_errors(lineage) == []


def test_duckdb_statement_recorded_redacted_bounded_and_column_lineage_emitted(
    tmp_path, monkeypatch, validator
):
    events = _run(tmp_path, DUCK, monkeypatch)
    db = (tmp_path / "data" / "lineage.duckdb").resolve()
    namespace = f"duckdb://{db}"

    meta = _task_meta(events, "copy")
    assert meta["sql"] == "INSERT INTO t2 SELECT a, b FROM t1"
    assert meta["sql_namespace"] == namespace and "sql_truncated" not in meta
    # the keychain secret rendered into the statement is redacted in the event, and nowhere in the log
    probe = _task_meta(events, "with_secret")["sql"]
    assert SECRET not in probe and probe.startswith("SELECT count(*) AS n FROM t1 WHERE '")
    assert all(SECRET not in str(e.data) for e in events)
    big = _task_meta(events, "long_sql")
    assert big["sql_truncated"] is True and len(big["sql"]) == MAX_NOTE_CHARS
    assert big["sql_namespace"] == "duckdb://memory"

    moved = _task_meta(events, "move")  # a transfer's source query
    assert (moved["sql"], moved["sql_dialect"], moved["sql_namespace"]) == (
        "SELECT a, b FROM t1 WHERE a > 0",
        "duckdb",
        namespace,
    )

    lineage = [as_json(r) for r in convert_all(events)]
    _check(lineage, validator)
    move = _step_complete(lineage, ".move")
    assert [(d["namespace"], d["name"]) for d in move["inputs"]] == [(namespace, "main.t1")]
    load = _step_complete(lineage, ".load")
    assert [(d["namespace"], d["name"]) for d in load["inputs"]] == [(namespace, "main.t1")]
    [out] = load["outputs"]
    assert (out["namespace"], out["name"]) == (namespace, "main.t2")
    assert out["facets"]["dataSource"]["name"] == namespace
    fields = out["facets"]["columnLineage"]["fields"]
    assert set(fields) == {"a", "b"}
    for col in ("a", "b"):
        [src] = fields[col]["inputFields"]
        assert (src["namespace"], src["name"], src["field"]) == (namespace, "main.t1", col)
        assert src["transformations"] == [{"type": "DIRECT", "subtype": "IDENTITY"}]
    # the playbook run reports the table too; the truncated statement gives no datasets
    end = [e for e in lineage if e["eventType"] == "COMPLETE" and e["job"]["name"] == "tests/duck_lineage"][0]
    assert "columnLineage" in {n: o for o, n in ((o["facets"], o["name"]) for o in end["outputs"])}["main.t2"]
    assert _step_complete(lineage, ".big")["outputs"] == []


PG = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: pg_lineage, path: tests/pg_lineage}
workflow:
  - step: start
    tool:
      - name: setup
        kind: postgres
        connection_string: "host=127.0.0.1 port=5432 dbname=test user=postgres"
        command: |
          CREATE TABLE SCHEMA_NAME.src (id int, amount numeric, qty int);
          CREATE TABLE SCHEMA_NAME.dst (id int, total numeric);
          INSERT INTO SCHEMA_NAME.src VALUES (1, 2.5, 4);
    next:
      arcs: [{step: load}]
  - step: load
    tool:
      - name: aggregate
        kind: postgres
        connection_string: "host=127.0.0.1 port=5432 dbname=test user=postgres"
        command: INSERT INTO SCHEMA_NAME.dst SELECT id, amount * qty AS total FROM SCHEMA_NAME.src
"""


@pytest.fixture
def pg_schema():
    name = f"lin_{uuid.uuid4().hex[:8]}"
    with psycopg.connect("host=127.0.0.1 port=5432 dbname=test user=postgres", autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
        yield name
        conn.execute(f"DROP SCHEMA {name} CASCADE")


def test_postgres_insert_select_gets_column_lineage(tmp_path, monkeypatch, validator, pg_schema):
    events = _run(tmp_path, PG.replace("SCHEMA_NAME", pg_schema), monkeypatch)
    namespace = "postgres://127.0.0.1:5432"
    meta = _task_meta(events, "aggregate")
    assert meta["sql_namespace"] == namespace and meta["sql_database"] == "test"

    lineage = [as_json(r) for r in convert_all(events)]
    _check(lineage, validator)
    load = _step_complete(lineage, ".load")
    assert [(d["namespace"], d["name"]) for d in load["inputs"]] == [(namespace, f"test.{pg_schema}.src")]
    [out] = load["outputs"]
    assert out["name"] == f"test.{pg_schema}.dst"
    fields = out["facets"]["columnLineage"]["fields"]
    assert [s["field"] for s in fields["id"]["inputFields"]] == ["id"]
    total = fields["total"]["inputFields"]
    assert {(s["name"], s["field"]) for s in total} == {
        (f"test.{pg_schema}.src", "amount"),
        (f"test.{pg_schema}.src", "qty"),
    }
    assert {s["transformations"][0]["subtype"] for s in total} == {"TRANSFORMATION"}


SNOW = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: sf_lineage, path: tests/sf_lineage}
workflow:
  - step: start
    tool:
      - name: setup
        kind: snowflake
        auth: AUTH
        command: |
          CREATE DATABASE IF NOT EXISTS TEST_DB;
          CREATE OR REPLACE TABLE TEST_DB.PUBLIC.SRC (ID INTEGER, NAME STRING);
          CREATE OR REPLACE TABLE TEST_DB.PUBLIC.DST (ID INTEGER, NAME STRING);
    next:
      arcs: [{step: load}]
  - step: load
    tool:
      - name: copy
        kind: snowflake
        auth: AUTH
        command: INSERT INTO DST SELECT ID, NAME FROM SRC
"""


def test_snowflake_statement_gets_column_lineage(tmp_path, monkeypatch, validator):
    import json

    fakesnow = pytest.importorskip("fakesnow")  # a dev dependency; present in CI
    # fakesnow.server() imports its submodule fakesnow.server, which rebinds the package attribute to the
    # module, and then looks up fakesnow.server.app: keep the function bound, carrying the module's app
    if not callable(fakesnow.server):
        importlib.reload(fakesnow)
    start = fakesnow.server

    def bind() -> None:
        module = sys.modules.get("fakesnow.server")
        if module is not None:
            start.app = module.app
        fakesnow.server = start

    bind()
    try:
        with start() as kw:
            auth = {"sf_account": kw["account"], "sf_user": kw["user"], "sf_password": "sf-5ecret-pw-77a1",
                    "sf_database": "TEST_DB", "sf_schema": "PUBLIC", "host": kw["host"], "port": kw["port"],
                    "protocol": "http"}  # fmt: skip
            events = _run(tmp_path, SNOW.replace("AUTH", json.dumps(auth)), monkeypatch)
    finally:
        bind()  # callable again for the next user (tests/tools/test_snowflake.py)
    namespace = f"snowflake://{kw['account'].lower()}"
    meta = _task_meta(events, "copy")
    assert (meta["sql_namespace"], meta["sql_database"], meta["sql_default_schema"]) == (
        namespace,
        "TEST_DB",
        "PUBLIC",
    )
    assert "sf-5ecret-pw-77a1" not in json.dumps([e.data for e in events])  # fakesnow takes any password
    lineage = [as_json(r) for r in convert_all(events)]
    _check(lineage, validator)
    load = _step_complete(lineage, ".load")
    assert [d["name"] for d in load["inputs"]] == ["TEST_DB.PUBLIC.SRC"]
    [out] = load["outputs"]
    assert out["name"] == "TEST_DB.PUBLIC.DST"
    assert {
        c: [f["field"] for f in v["inputFields"]] for c, v in out["facets"]["columnLineage"]["fields"].items()
    } == {"ID": ["ID"], "NAME": ["NAME"]}
