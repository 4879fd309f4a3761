"""Transports from the standard openlineage-python configuration, driven by real
playbook runs: the runner picks the listener up by itself. HTTP posts to a local
receiver (START before COMPLETE per run), a file transport from OPENLINEAGE_CONFIG,
and a dead endpoint that neither blocks nor fails a playbook."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import noetl_lineage as lineage
from noetl_dagster.runners.local import run_playbook

EXAMPLES = Path(__file__).resolve().parents[2] / "example_project" / "playbooks"
FIXTURES = Path(__file__).resolve().parents[1] / "analytics" / "playbooks"


@pytest.fixture(autouse=True)
def _clean_openlineage_env(monkeypatch, tmp_path):
    for key in list(__import__("os").environ):
        if key.startswith("OPENLINEAGE"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)  # no openlineage.yml from the working directory
    monkeypatch.setenv("HOME", str(tmp_path))  # nor from ~/.openlineage
    yield
    lineage.close_all()


@pytest.fixture
def receiver():
    """A local OpenLineage HTTP endpoint that records what it receives, in order."""
    received: list[tuple[str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server API
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.append((self.path, json.loads(body)))
            self.send_response(201)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()


def test_not_configured_or_disabled_means_no_listener(monkeypatch):
    assert lineage.listener_from_env() is None
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "console")
    listener = lineage.listener_from_env()
    assert listener is not None and lineage.listener_from_env() is listener  # one per process and config
    monkeypatch.setenv("OPENLINEAGE_DISABLED", "true")
    assert lineage.listener_from_env() is None


def test_http_transport_posts_every_run_start_before_complete(monkeypatch, receiver, validator, tmp_path):
    url, received = receiver
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "http")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__URL", url)
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__ENDPOINT", "api/v1/lineage")
    ok = run_playbook(
        EXAMPLES / "customer_portfolio.yaml", data_dir=tmp_path / "d", tenant="acme", project="lab"
    )
    failed = run_playbook(FIXTURES / "facts_fail.yaml", data_dir=tmp_path / "d", tenant="acme", project="lab")
    assert (ok.status, failed.status) == ("completed", "failed")
    assert lineage.flush_all(30)
    assert received and {path for path, _ in received} == {"/api/v1/lineage"}
    order = defaultdict(list)
    for _, body in received:
        assert validator.errors(body) == []
        order[body["run"]["runId"]].append(body["eventType"])
    for run_id, types in order.items():
        assert types[0] == "START" and types[-1] in ("COMPLETE", "FAIL"), (run_id, types)
        assert types.index("START") < types.index(types[-1])
    by_job = {body["job"]["name"]: body["eventType"] for _, body in received}  # last event per job
    assert by_job["examples/customer_portfolio"] == "COMPLETE"
    assert by_job["examples/score_customer"] == "COMPLETE"
    assert by_job["tests/facts_fail"] == "FAIL"
    playbook_runs = {
        body["run"]["runId"] for _, body in received if body["job"]["name"] == "examples/score_customer"
    }
    assert len(playbook_runs) == 3  # one run per sub-playbook execution


def test_file_transport_from_openlineage_config(monkeypatch, validator, tmp_path):
    out = tmp_path / "ol" / "events.jsonl"
    out.parent.mkdir()
    config = tmp_path / "ol.yml"
    config.write_text(f"transport:\n  type: file\n  log_file_path: {out}\n  append: true\n")
    monkeypatch.setenv("OPENLINEAGE_CONFIG", str(config))
    result = run_playbook(EXAMPLES / "hello_dagster.yaml", data_dir=tmp_path / "d")
    assert result.status == "completed"
    assert lineage.flush_all(30)
    lines = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert [ev["eventType"] for ev in lines if ev["job"]["name"] == "examples/hello_dagster"] == [
        "START",
        "RUNNING",
        "COMPLETE",
    ]
    assert all(validator.errors(ev) == [] for ev in lines)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dead_endpoint_neither_blocks_nor_fails_a_playbook(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "http")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__URL", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TIMEOUT", "0.5")
    for kind in ("TOTAL", "CONNECT", "READ"):  # no retries: the test waits for every failure
        monkeypatch.setenv(f"OPENLINEAGE__TRANSPORT__RETRY__{kind}", "0")
    run_playbook(EXAMPLES / "hello_dagster.yaml", data_dir=tmp_path / "warm")  # imports out of the timing
    listener = lineage.listener_from_env()
    listener.flush(60)
    listener.emitted = listener.failed = 0
    t0 = time.perf_counter()
    result = run_playbook(EXAMPLES / "hello_dagster.yaml", data_dir=tmp_path / "d")
    elapsed = time.perf_counter() - t0
    assert result.status == "completed"
    assert elapsed < 5, elapsed  # emission happens off the playbook's thread
    assert listener.flush(60)
    assert listener.failed > 0 and listener.emitted == 0


def test_the_listener_never_raises(monkeypatch):
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "console")
    listener = lineage.listener_from_env()
    listener(object())  # not an event: logged and counted, the caller never sees it
    assert listener.flush(10)
    assert listener.failed == 1
