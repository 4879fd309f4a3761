"""`noetl-registry` (keys create, migrate, serve) and the OpenAPI surface."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from click.testing import CliRunner

from noetl_registry.cli import cli
from noetl_registry.client import HttpRegistryClient
from noetl_registry.store import MIGRATIONS, open_store

STABLE_PATHS = {
    ("post", "/v1/resources"),
    ("get", "/v1/resources/resolve"),
    ("post", "/v1/resources/{resource_id}/locations"),
    ("post", "/v1/grants"),
    ("delete", "/v1/grants/{grant_id}"),
    ("get", "/v1/resources/{resource_id}/lineage"),
    ("get", "/v1/resources"),
    ("get", "/v1/events"),
}


def test_openapi_documents_the_stable_surface(tmp_path):
    from fastapi.testclient import TestClient

    from noetl_registry.app import create_app

    spec = TestClient(create_app(str(tmp_path / "r.db"))).get("/openapi.json").json()
    have = {(m, p) for p, ops in spec["paths"].items() for m in ops}
    assert STABLE_PATHS <= have
    assert "HTTPBearer" in spec["components"]["securitySchemes"]


def test_keys_create_prints_a_working_key_and_migrate_is_idempotent(tmp_path, pg_registry_url):
    runner = CliRunner()
    for db in (f"sqlite:///{tmp_path / 'reg.db'}", pg_registry_url):
        out = runner.invoke(cli, ["keys", "create", "--db", db, "--tenant", "acme", "--project", "lab"])
        assert out.exit_code == 0, out.output
        key = out.output.strip()
        assert key.startswith("nrk_")
        m = runner.invoke(cli, ["migrate", "--db", db])
        assert m.exit_code == 0 and f"schema version {len(MIGRATIONS)}" in m.output
        store = open_store(db)
        assert store.schema_version() == len(MIGRATIONS)
        store.close()
        listed = runner.invoke(cli, ["keys", "list", "--db", db, "--tenant", "acme"])
        _, key_id, secret = key.split("_", 2)
        assert key_id in listed.output and secret not in listed.output  # never the secret
    bad = runner.invoke(
        cli, ["keys", "create", "--db", f"sqlite:///{tmp_path / 'x.db'}", "--tenant", "bad tenant!"]
    )
    assert bad.exit_code != 0 and "invalid tenant" in bad.output
    bad_db = runner.invoke(cli, ["keys", "create", "--db", "mysql://x", "--tenant", "a"])
    assert bad_db.exit_code != 0 and "cannot open registry database" in bad_db.output


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_runs_the_http_service(tmp_path):
    db = f"sqlite:///{tmp_path / 'served.db'}"
    key = CliRunner().invoke(cli, ["keys", "create", "--db", db, "--tenant", "acme"]).output.strip()
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "noetl_registry.cli",
            "serve",
            "--db",
            db,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.1)
        with HttpRegistryClient(f"http://127.0.0.1:{port}", key) as client:
            r = client.register("noetl://acme/lab/ns/dataset/served", locations=[{"uri": "file:///s"}])
            assert client.resolve(r.series).resource_id == r.resource_id
        assert httpx.get(f"http://127.0.0.1:{port}/docs").status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
