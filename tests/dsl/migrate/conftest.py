"""Helpers for the migration tests: migrate + validate in memory, a real Postgres
database of our own, and a local HTTP server standing in for Open-Meteo and
postman-echo."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import psycopg
import pytest
import yaml

from noetl_dagster.dsl import load_yaml_text, parse_playbook
from noetl_dagster.dsl.migrate import MigrationResult, migrate_text

LEGACY_DIR = (
    Path(os.environ.get("NOETL_SHARED", Path(__file__).resolve().parents[3].parent / "shared"))
    / "conformance"
    / "legacy"
)
WEATHER_V1 = LEGACY_DIR / "LEGACY_noetl@74dd0a9a__examples__weather__weather_loop_example.yaml"
LABELMAP_V2 = LEGACY_DIR / "LEGACY_noetl@7a288f1e__tests__fixtures__playbooks__iterator_save_test.yaml"
EARLY_V2 = LEGACY_DIR / (
    "LEGACY_noetl@c4dec269__tests__fixtures__playbooks__data_transfer__"
    "http_iterator_save_postgres__http_iterator_save_postgres.yaml"
)
PG_ADMIN_URL = os.environ.get("NOETL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
MIGRATE_DB = "noetl_dagster_migrate_test" + os.environ.get("PYTEST_XDIST_WORKER", "")  # one per xdist worker


def migrate(text: str) -> tuple[MigrationResult, dict[str, Any]]:
    """Migrate YAML text; return the result and the migrated document as plain data."""
    r = migrate_text(text, "case.yaml")
    return r, yaml.safe_load(r.text)


def issues_of(text: str) -> list[str]:
    raw, sm = load_yaml_text(text, "migrated.yaml")
    _, issues = parse_playbook(raw, source_map=sm, source_file="migrated.yaml")
    return [str(i) for i in issues]


def assert_valid(text: str) -> None:
    issues = issues_of(text)
    assert not issues, "\n".join(issues)


def step(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in doc["workflow"] if s["step"] == name)


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """A database of this test area's own, so tables named by the legacy playbooks never collide."""
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (MIGRATE_DB,)).fetchone()
        if not exists:
            try:
                conn.execute(f'CREATE DATABASE "{MIGRATE_DB}"')
            except psycopg.errors.DuplicateDatabase:  # another session made it first
                pass
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + MIGRATE_DB


@pytest.fixture
def pg_local(pg_dsn, monkeypatch) -> str:
    """The `pg_local` credential the legacy playbooks name, pointing at our database."""
    info = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    record = {"type": "postgres", "db_host": info.get("host", "127.0.0.1"), "db_port": int(info.get("port", 5432)),
              "db_user": info.get("user", "postgres"), "db_name": info["dbname"]}  # fmt: skip
    if info.get("password"):
        record["db_password"] = info["password"]
    monkeypatch.setenv("NOETL_CREDENTIAL_PG_LOCAL", json.dumps(record))
    return pg_dsn


@dataclass
class Stub:
    url: str
    gets: list[dict[str, Any]] = field(default_factory=list)
    posts: list[Any] = field(default_factory=list)

    @staticmethod
    def temperature(lat: float) -> float:
        return round(lat / 4, 2)


@pytest.fixture
def http_stub() -> Iterator[Stub]:
    """Open-Meteo's /v1/forecast (temperature = latitude / 4) and an echo for POSTs."""
    stub = Stub("")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            q = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
            stub.gets.append({"path": urlparse(self.path).path, **q})
            lat = float(q.get("latitude", 0))
            t = Stub.temperature(lat)
            self._send(
                {"latitude": lat, "current": {"temperature_2m": t}, "hourly": {"temperature_2m": [t - 1, t]}}
            )

        def do_POST(self) -> None:  # noqa: N802
            n = int(self.headers.get("Content-Length") or 0)
            payload = json.loads(self.rfile.read(n) or b"null")
            stub.posts.append(payload)
            self._send({"json": payload})

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    stub.url = f"http://127.0.0.1:{srv.server_port}"
    yield stub
    srv.shutdown()
    srv.server_close()
