"""The conformance machinery: stub servers behave as the fixtures expect, hosts are
rewritten, and real e2e fixtures complete against the stubs and the local Postgres."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import httpx
import pytest

from noetl_dagster.conformance.corpus import FixtureSetup
from noetl_dagster.conformance.runner import (
    DEFAULT_PG_URL,
    PostgresTarget,
    check_file,
    discover,
    fixture_workload,
    read_core_list,
    rewrite_workload_hosts,
)
from noetl_dagster.conformance.stubs import StubSet


@pytest.fixture(scope="module")
def stubs():
    with StubSet() as s:
        yield s


def get(stubs, name, path, **kw):
    return httpx.get(stubs[name].url + path, timeout=10, **kw)


def test_paginated_api_page_offset_and_cursor_cover_35_items(stubs):
    pages, page = [], 1
    while True:
        body = get(
            stubs, "paginated-api", "/api/v1/assessments", params={"page": page, "pageSize": 10}
        ).json()
        pages += body["data"]
        if not body["paging"]["hasMore"]:
            break
        page += 1
    assert [i["id"] for i in pages] == list(range(1, 36)) and page == 4
    users = get(stubs, "paginated-api", "/api/v1/users", params={"offset": 30, "limit": 10}).json()
    assert [u["id"] for u in users["users"]] == [31, 32, 33, 34, 35] and users["has_more"] is False
    events, cursor = [], ""
    while True:
        body = get(stubs, "paginated-api", "/api/v1/events", params={"cursor": cursor, "limit": 10}).json()
        events += body["events"]
        cursor = body["next_cursor"]
        if not cursor:
            break
        assert base64.b64decode(cursor)
    assert len(events) == 35


def test_paginated_api_flaky_fails_each_listed_page_once(stubs):
    assert httpx.post(stubs["paginated-api"].url + "/api/v1/flaky/reset").json()["status"] == "reset"
    first = get(stubs, "paginated-api", "/api/v1/flaky", params={"page": 2, "fail_on": "2,3"})
    second = get(stubs, "paginated-api", "/api/v1/flaky", params={"page": 2, "fail_on": "2,3"})
    other = get(stubs, "paginated-api", "/api/v1/flaky", params={"page": 1, "fail_on": "2,3"})
    assert (first.status_code, second.status_code, other.status_code) == (500, 200, 200)


def test_paginated_api_rate_limit_errors_and_heavy(stubs):
    a = get(stubs, "paginated-api", "/api/v1/rate-limited", params={"page": 1, "requests_per_second": 1})
    b = get(stubs, "paginated-api", "/api/v1/rate-limited", params={"page": 2, "requests_per_second": 1})
    assert a.status_code == 200 and b.status_code == 429 and int(b.headers["Retry-After"]) >= 1
    assert get(stubs, "paginated-api", "/api/v1/errors", params={"error_type": "auth"}).status_code == 401
    heavy = get(
        stubs, "paginated-api", "/api/v1/heavy", params={"page": 1, "pageSize": 2, "payload_kb": 3}
    ).json()
    assert [len(i["payload"]) for i in heavy["data"]] == [3072, 3072]


def test_concurrency_probe_counts_overlap(stubs):
    import threading

    httpx.post(stubs["paginated-api"].url + "/api/v1/concurrency/reset")
    threads = [
        threading.Thread(
            target=get,
            args=(stubs, "paginated-api", "/api/v1/concurrency/probe"),
            kwargs={"params": {"delay_seconds": 0.3}},
        )
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = get(stubs, "paginated-api", "/api/v1/concurrency/stats").json()
    assert stats["started"] == stats["completed"] == 3 and stats["active"] == 0 and stats["max_active"] >= 2


def test_httpbin_jsonplaceholder_open_meteo_noetl(stubs):
    echo = httpx.post(stubs["httpbin"].url + "/post", json={"a": 1}, headers={"X-T": "v"}).json()
    assert echo["json"] == {"a": 1} and echo["headers"]["X-T"] == "v"
    assert httpx.get(stubs["httpbin"].url + "/status/503").status_code == 503
    assert get(stubs, "httpbin", "/anything/x", params={"q": "1"}).json()["args"] == {"q": "1"}
    posts = get(stubs, "jsonplaceholder", "/posts").json()
    assert len(posts) == 100 and set(posts[0]) == {"userId", "id", "title", "body"}
    assert get(stubs, "jsonplaceholder", "/users/3").json()["address"]["city"]
    assert len(get(stubs, "jsonplaceholder", "/posts", params={"userId": 2}).json()) == 10
    meteo = get(
        stubs,
        "open-meteo",
        "/v1/forecast",
        params={"latitude": 51.5, "longitude": -0.12, "current": "temperature_2m"},
    ).json()
    assert isinstance(meteo["current"]["temperature_2m"], float)
    assert get(stubs, "open-meteo", "/v1/forecast").status_code == 400
    assert get(stubs, "noetl-api", "/health").json()["status"] == "ok"
    assert get(stubs, "noetl-api", "/nope").status_code == 404


def test_overrides_cover_every_stubbed_host(stubs):
    o = stubs.overrides
    assert o["httpbin.org"] == stubs["httpbin"].url
    assert o["paginated-api.test-server.svc.cluster.local:5555"] == stubs["paginated-api"].url
    assert rewrite_workload_hosts(
        {
            "api_url": "http://paginated-api.test-server.svc.cluster.local:5555",
            "n": 1,
            "l": ["https://httpbin.org/get"],
        },
        o,
    ) == {"api_url": stubs["paginated-api"].url, "n": 1, "l": [stubs["httpbin"].url + "/get"]}


def test_fixture_workload_adds_pg_payload_rewrites_hosts_and_setup(conformance_dir, stubs):
    rel = "pagination/basic/test_pagination_basic.yaml"
    wl = fixture_workload(conformance_dir / rel, FixtureSetup(workload={"x": 1}), stubs.overrides)
    assert wl == {"api_url": stubs["paginated-api"].url, "x": 1}
    wl = fixture_workload(
        conformance_dir / "data_transfer/http_to_postgres_direct/http_to_postgres_direct.yaml",
        FixtureSetup(),
        stubs.overrides,
    )
    assert wl["pg_auth"] == "pg_local"


def test_corpus_discovery_core_list_and_validation(conformance_dir):
    files = discover(conformance_dir)
    assert len(files) >= 160
    core = read_core_list(conformance_dir.parents[1] / "core_fixtures.txt", conformance_dir)
    assert len(core) == 66 and set(core) <= set(files)
    ok = check_file(conformance_dir, "hello_world/hello_world.yaml")
    assert ok.parsed and ok.valid and ok.errors == []
    bad = check_file(
        conformance_dir, "regression_test/master_regression_test.yaml"
    )  # a legacy `retry:` block
    assert bad.parsed and not bad.valid
    assert bad.errors[0].startswith("regression_test/master_regression_test.yaml:31: legacy-construct")


CURSOR_FIXTURES = [  # every step-level loop.cursor of the corpus (issue 17.2); before it, each was `loop-in-iterator`
    "batch_execution/frame_heartbeat_regression/frame_heartbeat_regression.yaml",  # templated frame policy
    "pft_flow_test/test_pft_flow_v2.yaml",
    "pft_flow_test/test_pft_page_continuation.yaml",
]


@pytest.mark.parametrize("rel", CURSOR_FIXTURES)
def test_cursor_loop_fixtures_validate(rel, conformance_dir):
    res = check_file(conformance_dir, rel)
    assert res.parsed and res.valid, res.errors


CORE_SAMPLE = [
    "postgres_test.yaml",  # reads noetl.catalog: seeded with NoETL's DDL and its own catalog row
    "retry_test/http_retry_status_code.yaml",  # httpbin stub
    "http_test.yaml",  # NoETL API stub
    "pagination/cursor/test_pagination_cursor.yaml",  # paginated-api, cursor loop
    "pagination/offset/test_pagination_offset.yaml",  # paginated-api, offset loop
    "retry_test/retry_simple_config.yaml",  # 500 on first attempt, retried by policy
    "retry_test/duckdb_retry_query.yaml",  # duckdb
    "iterator_save_test/iterator_save_test.yaml",  # postgres
]


@pytest.fixture(scope="module")
def pg_creds(tmp_path_factory):
    target = PostgresTarget(DEFAULT_PG_URL)
    target.ensure_database()
    path = tmp_path_factory.mktemp("creds") / "credentials.json"
    path.write_text(json.dumps(target.credentials()))
    return path


@pytest.mark.parametrize("rel", CORE_SAMPLE)
def test_core_fixture_completes_against_stubs(rel, conformance_dir, stubs, pg_creds, tmp_path, monkeypatch):
    from noetl_dagster.conformance.corpus import fixture_setups
    from noetl_dagster.runners.local import run_playbook

    monkeypatch.setenv("NOETL_HTTP_OVERRIDES", json.dumps(stubs.overrides))
    monkeypatch.setenv("NOETL_CREDENTIALS_FILE", str(pg_creds))
    target = PostgresTarget(DEFAULT_PG_URL)
    setup = fixture_setups(target.params).get(rel, FixtureSetup())
    if setup.seeds:
        target.run_sql(setup.seeds)
    workload = fixture_workload(conformance_dir / rel, setup, stubs.overrides)
    res = run_playbook(
        conformance_dir / rel, workload, data_dir=tmp_path / "home", catalog_dirs=[conformance_dir]
    )
    failed = {s: r for s, r in res.results.items() if isinstance(r, dict) and r.get("status") == "error"}
    assert res.status == "completed", failed


def test_cursor_fixture_really_paged_through_the_stub(conformance_dir, stubs, tmp_path, monkeypatch):
    from noetl_dagster.runners.local import run_playbook

    rel = "pagination/cursor/test_pagination_cursor.yaml"
    monkeypatch.setenv("NOETL_HTTP_OVERRIDES", json.dumps(stubs.overrides))
    res = run_playbook(
        conformance_dir / rel,
        fixture_workload(conformance_dir / rel, FixtureSetup(), stubs.overrides),
        data_dir=tmp_path,
    )
    assert res.results["validate_results"] == {
        "status": "success",
        "total_events": 35,
        "first_id": 1,
        "last_id": 35,
    }
    assert res.runs["fetch_page"] == 4


@pytest.mark.slow
def test_cli_validates_everything_and_runs_a_selection(conformance_dir, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "noetl_dagster.commands.main", "conformance", str(conformance_dir), "--json",
         "--only", "hello_world/hello_world.yaml", "--only", "google_id_token_test", "--work-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    by_path = {f["path"]: f for f in report["fixtures"]}
    assert report["totals"]["playbooks"] == len(by_path) >= 160
    assert by_path["hello_world/hello_world.yaml"]["outcome"] == "completed"
    assert by_path["keychain/google_id_token/google_id_token_test.yaml"]["outcome"] == "not runnable here"
    assert "Google" in by_path["keychain/google_id_token/google_id_token_test.yaml"]["reason"]
    assert by_path["duckdb_test.yaml"]["outcome"] == "skipped"


def test_cli_rejects_a_bad_override(conformance_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "noetl_dagster.commands.main", "conformance", str(conformance_dir), "--no-run", "--http-override", "nonsense"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "expected HOST=URL" in proc.stderr


@pytest.mark.slow
def test_cursor_loop_fixture_drains_page_continuation_work(
    conformance_dir, stubs, pg_creds, tmp_path, monkeypatch
):
    """NoETL's PFT page-continuation fixture: a postgres cursor loop whose body enqueues the next page;
    its own verify step checks every (data type, patient) reached its terminal page exactly once."""
    from noetl_dagster.runners.local import run_playbook

    rel = "pft_flow_test/test_pft_page_continuation.yaml"
    monkeypatch.setenv("NOETL_HTTP_OVERRIDES", json.dumps(stubs.overrides))
    monkeypatch.setenv("NOETL_CREDENTIALS_FILE", str(pg_creds))
    workload = fixture_workload(conformance_dir / rel, FixtureSetup(), stubs.overrides)
    res = run_playbook(
        conformance_dir / rel, workload, data_dir=tmp_path / "home", catalog_dirs=[conformance_dir]
    )
    assert res.status == "completed", {
        s: r for s, r in res.results.items() if isinstance(r, dict) and r.get("status") == "error"
    }
    stats = res.results["fetch_pages"]["stats"]
    # 10 patients x 4 data types, 1-3 pages each (the stub's contract): 80 pages, all fetched once
    assert stats == {"total": 80, "ok": 80, "failed": 0}
