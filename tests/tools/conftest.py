"""A small stand-in for the engine's ToolContext, and the real Postgres database the tool tests use."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from noetl_dagster.engine.keychain import FileProvider, Keychain
from noetl_dagster.storage.payload import FilePayloadStore

PG_ADMIN_URL = os.environ.get("NOETL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
TOOLS_DB = "noetl_dagster_tools_test" + os.environ.get("PYTEST_XDIST_WORKER", "")  # one per xdist worker


class StubToolContext:
    """What a tool sees of an execution: credentials, per-execution resources, redaction."""

    def __init__(
        self,
        keychain: Keychain | None = None,
        *,
        data_dir: Path | None = None,
        inline_limit: int | None = None,
    ):
        self.execution_id = "exec-test"
        self.step = "step"
        self.task = "task"
        self.attempt = 1
        self.spec: dict[str, Any] = {}
        self.base_dir = None
        self.render_context: dict[str, Any] = {}
        self.keychain = keychain or Keychain([], providers=[])
        self.data_dir = data_dir
        self.payload_store = FilePayloadStore(data_dir / "payloads") if data_dir else None
        if inline_limit is not None:
            self.inline_limit = inline_limit
        self.resources: dict[str, Any] = {}
        self.factory_calls: dict[str, int] = {}
        self.redacted: set[str] = set()
        self.logs: list[str] = []
        self._lock = threading.Lock()

    def credential(self, name: str) -> dict[str, Any]:
        return self.keychain.credential(name)

    def resource(self, key: str, factory: Callable[[], Any]) -> Any:
        with self._lock:
            if key not in self.resources:
                self.resources[key] = factory()
                self.factory_calls[key] = self.factory_calls.get(key, 0) + 1
            return self.resources[key]

    def run_playbook(self, path: str, workload: Any, **kw: Any) -> dict[str, Any]:
        raise NotImplementedError

    def log(self, message: str) -> None:
        self.logs.append(message)

    def redact(self, value: str) -> None:
        self.redacted.add(value)
        self.keychain.add_secret(value)

    def close(self) -> None:
        for r in self.resources.values():
            close = getattr(r, "close", None)
            if close:
                close()
        self.resources.clear()


@pytest.fixture
def make_ctx(tmp_path):
    made: list[StubToolContext] = []

    def make(keychain: Keychain | None = None, **kw: Any) -> StubToolContext:
        kw.setdefault("data_dir", tmp_path / "data")
        ctx = StubToolContext(keychain, **kw)
        made.append(ctx)
        return ctx

    yield make
    for ctx in made:
        ctx.close()


def write_credentials(path: Path, records: dict[str, Any]) -> Keychain:
    import json

    path.write_text(json.dumps({"credentials": records}))
    return Keychain([], providers=[FileProvider(path)])


@pytest.fixture(scope="session")
def pg_tools_db() -> str:
    """A database of our own on the machine's real Postgres; returns its URL."""
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (TOOLS_DB,)).fetchone()
        if not exists:
            try:
                conn.execute(f'CREATE DATABASE "{TOOLS_DB}"')
            except psycopg.errors.DuplicateDatabase:  # another worker made it first
                pass
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + TOOLS_DB


@pytest.fixture
def pg_keychain(tmp_path, pg_tools_db) -> Keychain:
    """A keychain whose pg_test credential (e2e pg_local shape) points at the tools database."""
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(pg_tools_db)
    return write_credentials(
        tmp_path / "creds.json",
        {
            "pg_test": {
                "type": "postgres",
                "data": {
                    "db_host": info.get("host", "127.0.0.1"),
                    "db_port": str(info.get("port", 5432)),
                    "db_user": info.get("user", "postgres"),
                    "db_password": "not-checked-by-trust-auth",
                    "db_name": TOOLS_DB,
                },
            },
            "pg_refused": {
                "type": "postgres",
                "data": {"db_host": "127.0.0.1", "db_port": "1", "db_user": "postgres", "db_name": "x"},
            },
            "pg_wrong_user": {
                "type": "postgres",
                "data": {
                    "db_host": "127.0.0.1",
                    "db_port": "5432",
                    "db_user": "no_such_role_noetl",
                    "db_password": "pw-xyz",
                    "db_name": TOOLS_DB,
                },
            },
            "pg_wrong_db": {
                "type": "postgres",
                "data": {
                    "db_host": "127.0.0.1",
                    "db_port": "5432",
                    "db_user": "postgres",
                    "db_name": "no_such_db_noetl",
                },
            },
            "pg_dsn": {"type": "postgres", "connection_string": pg_tools_db},
        },
    )
