"""The tool kinds inside real executions of the engine (run_playbook), against real services."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest
from werkzeug.wrappers import Response

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.runners.local import run_playbook


def playbook(workflow, **extra):
    return load_playbook_dict(
        {
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": {"name": "t", "path": "tests/t"},
            "workflow": workflow,
            **extra,
        }
    )


def events(res, tmp_path):
    from noetl_dagster.storage.event_stores import open_event_store

    store = open_event_store(None, data_dir=tmp_path)
    try:
        return store.read(res.execution_id)
    finally:
        store.close()


def test_429_is_retried_by_a_policy_and_then_succeeds(httpserver, tmp_path):
    httpserver.expect_ordered_request("/busy").respond_with_data(
        "slow down", status=429, headers={"Retry-After": "0"}
    )
    httpserver.expect_ordered_request("/busy").respond_with_data("still busy", status=503)
    httpserver.expect_ordered_request("/busy").respond_with_json({"ok": True})
    pb = playbook(
        [
            {
                "step": "start",
                "tool": {
                    "kind": "http",
                    "url": httpserver.url_for("/busy"),
                    "spec": {
                        "policy": {
                            "rules": [
                                {
                                    "when": "{{ output.status == 'error' and output.error.retryable }}",
                                    "then": {"do": "retry", "attempts": 3, "delay": 0.05},
                                },
                                {"else": {"then": {"do": "continue"}}},
                            ]
                        }
                    },
                },
            }
        ]
    )
    res = run_playbook(pb, data_dir=tmp_path)
    assert res.status == "completed" and res.results["start"]["data"] == {"ok": True}
    done = [e for e in events(res, tmp_path) if e.name == "task.done"]
    assert [e.data["outcome"]["status"] for e in done] == ["error", "error", "ok"]
    assert [e.data["outcome"]["error"]["kind"] for e in done[:2]] == ["rate_limit", "server_error"]
    assert done[0].data["outcome"]["http"]["status"] == 429


def test_non_2xx_without_a_policy_fails_the_execution(httpserver, tmp_path):
    httpserver.expect_request("/nf").respond_with_json({"detail": "missing"}, status=404)
    res = run_playbook(
        playbook([{"step": "start", "tool": {"kind": "http", "url": httpserver.url_for("/nf")}}]),
        data_dir=tmp_path,
    )
    assert res.status == "failed"
    failed = next(e for e in events(res, tmp_path) if e.name == "step.failed")
    assert failed.data["error"]["kind"] == "client_error" and failed.data["error"]["code"] == 404


def test_timeout_then_policy_gives_up(httpserver, tmp_path):
    import time

    def slow(_):
        time.sleep(0.5)
        return Response("late")

    httpserver.expect_request("/slow").respond_with_handler(slow)
    pb = playbook(
        [
            {
                "step": "start",
                "tool": {
                    "kind": "http",
                    "url": httpserver.url_for("/slow"),
                    "timeout": 0.1,
                    "spec": {
                        "policy": {
                            "rules": [
                                {
                                    "when": "{{ output.error.kind == 'timeout' }}",
                                    "then": {"do": "retry", "attempts": 2, "delay": 0},
                                }
                            ]
                        }
                    },
                },
            }
        ]
    )
    res = run_playbook(pb, data_dir=tmp_path)
    assert res.status == "failed"
    assert sum(e.name == "task.done" for e in events(res, tmp_path)) == 2


@pytest.fixture
def pg_table(pg_tools_db):
    name = "pb_" + uuid.uuid4().hex[:10]
    yield name
    with psycopg.connect(pg_tools_db, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}")


def test_http_to_postgres_in_a_parallel_loop_with_params(
    httpserver, tmp_path, pg_keychain, pg_table, monkeypatch
):
    """The e2e pattern: fetch a list, insert each item (bound params), count in SQL, read it in DuckDB."""
    creds_file = tmp_path / "creds.json"
    creds_file.write_text(json.dumps({"credentials": {"pg_test": pg_keychain.credential("pg_test")}}))
    monkeypatch.setenv("NOETL_CREDENTIALS_FILE", str(creds_file))
    items = [{"id": i, "name": f"it's {i}"} for i in range(20)]
    httpserver.expect_request("/items").respond_with_json(items)
    pb = playbook(
        [
            {
                "step": "start",
                "tool": {"kind": "http", "url": httpserver.url_for("/items")},
                "next": {"arcs": [{"step": "create"}]},
            },
            {
                "step": "create",
                "tool": {
                    "kind": "postgres",
                    "auth": "pg_test",
                    "command": f"CREATE TABLE {pg_table} (id int primary key, name text)",
                },
                "next": {"arcs": [{"step": "insert"}]},
            },
            {
                "step": "insert",
                "loop": {
                    "in": "{{ start.data }}",
                    "iterator": "item",
                    "spec": {"mode": "parallel", "max_in_flight": 8},
                },
                "tool": {
                    "kind": "postgres",
                    "auth": "pg_test",
                    "command": f"INSERT INTO {pg_table} VALUES (%(id)s, %(name)s)",
                    "params": {"id": "{{ iter.item.id }}", "name": "{{ iter.item.name }}"},
                },
                "next": {"arcs": [{"step": "count", "when": "{{ event.name == 'loop.done' }}"}]},
            },
            {
                "step": "count",
                "tool": {
                    "kind": "postgres",
                    "auth": "pg_test",
                    "query": f"SELECT count(*) AS n, max(name) AS top FROM {pg_table}",
                },
                "next": {"arcs": [{"step": "analyse"}]},
            },
            {
                "step": "analyse",
                "tool": {"kind": "duckdb", "query": "SELECT {{ count.rows[0].n }} * 2 AS doubled"},
            },
        ]
    )
    res = run_playbook(pb, data_dir=tmp_path / "home")
    assert res.status == "completed", res.results
    assert res.results["insert"]["stats"] == {"total": 20, "ok": 20, "failed": 0}
    assert res.results["count"]["rows"] == [{"n": 20, "top": "it's 9"}]
    assert res.results["analyse"]["rows"] == [{"doubled": 40}]


def test_bad_sql_error_carries_pg_details_into_the_outcome(tmp_path, pg_keychain, monkeypatch):
    creds_file = tmp_path / "creds.json"
    creds_file.write_text(json.dumps({"credentials": {"pg_test": pg_keychain.credential("pg_test")}}))
    monkeypatch.setenv("NOETL_CREDENTIALS_FILE", str(creds_file))
    pb = playbook(
        [
            {
                "step": "start",
                "tool": {
                    "kind": "postgres",
                    "auth": "pg_test",
                    "query": "SELEC 1",
                    "spec": {
                        "policy": {
                            "rules": [
                                {"when": "{{ output.pg.sqlstate == '42601' }}", "then": {"do": "continue"}}
                            ]
                        }
                    },
                },
            }
        ]
    )
    res = run_playbook(pb, data_dir=tmp_path / "home")
    done = next(e for e in events(res, tmp_path / "home") if e.name == "task.done")
    assert done.data["outcome"]["pg"] == {"code": "syntax_error", "sqlstate": "42601"}


@pytest.mark.slow
def test_big_duckdb_result_is_an_arrow_reference_in_the_event_log(tmp_path):
    pb = playbook(
        [
            {
                "step": "start",
                "tool": {
                    "kind": "duckdb",
                    "query": "SELECT range AS i, 'row ' || range AS s FROM range(200000)",
                },
            }
        ]
    )
    res = run_playbook(pb, data_dir=tmp_path)
    assert res.status == "completed"
    ref = res.results["start"]["rows"]["$ref"]
    assert ref["format"] == "arrow" and ref["rows"] == 200000 == res.results["start"]["row_count"]
    done = next(e for e in events(res, tmp_path) if e.name == "task.done")
    assert done.data["outcome"]["result"]["rows"]["$ref"]["uri"] == ref["uri"]
    assert len(json.dumps(done.data)) < 4096  # a reference, not the rows
