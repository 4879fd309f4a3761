"""Registry fixtures: the same tests on SQLite and on the real Postgres server,
in-process and over HTTP (uvicorn on a free loopback port)."""

from __future__ import annotations

import os
import uuid

import psycopg
import pytest
from registry_helpers import ServerThread, free_port  # noqa: F401 - free_port: re-exported

from noetl_registry.client import HttpRegistryClient, InProcessRegistryClient, RegistryClient
from noetl_registry.service import Registry

PG_ADMIN_URL = os.environ.get("NOETL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(scope="session")
def pg_registry_url():
    """A database of our own on the real server, dropped at the end of the session."""
    name = f"noetl_registry_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = PG_ADMIN_URL.rpartition("/")
    yield f"{base}/{name}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def db_url(request, tmp_path_factory):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('registry') / 'registry.db'}"
    return request.getfixturevalue("pg_registry_url")


@pytest.fixture(scope="module")
def registry(db_url):
    reg = Registry(db_url)
    yield reg
    reg.close()


@pytest.fixture(scope="module")
def http_url(registry):
    from noetl_registry.app import create_app

    with ServerThread(create_app(registry)) as srv:
        yield srv.url


@pytest.fixture(params=["inproc", "http"])
def transport(request):
    return request.param


@pytest.fixture
def connect(registry, transport, request):
    """connect(tenant, project=None) -> a client authenticated by a fresh API key."""
    clients: list[RegistryClient] = []

    def make(tenant: str, project: str | None = None) -> RegistryClient:
        _, key = registry.create_api_key(tenant, project)
        if transport == "http":
            client: RegistryClient = HttpRegistryClient(request.getfixturevalue("http_url"), key)
        else:
            client = InProcessRegistryClient(registry, registry.authenticate(key))
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.close()


@pytest.fixture
def tenants():
    """Unique tenant names, so tests sharing one database never see each other."""
    suffix = uuid.uuid4().hex[:8]
    return f"ta{suffix}", f"tb{suffix}"


def checksum(ch: str = "a") -> str:
    return "sha256:" + ch * 64
