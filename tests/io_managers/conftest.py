"""IO-manager fixtures: a private NOETL_DAGSTER_HOME, a registry database and a Dagster instance."""

from __future__ import annotations

import socket
import threading
import time

import dagster as dg
import pytest

from noetl_dagster.io_managers import ArrowIPCIOManager, IcebergIOManager, ParquetIOManager
from noetl_dagster.resources.registry import NoetlRegistryResource


@pytest.fixture
def home(tmp_path, monkeypatch):
    d = tmp_path / "home"
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(d))
    return d


@pytest.fixture
def registry_db(home):
    return f"sqlite:///{home / 'registry.db'}"


@pytest.fixture
def instance():
    """An in-memory Dagster instance: real event log and asset catalog, no disk setup cost."""
    inst = dg.DagsterInstance.ephemeral()
    yield inst
    inst.dispose()


@pytest.fixture
def sqlite_instance(tmp_path):
    """A Dagster instance on SQLite storage, as `dagster dev` uses."""
    (tmp_path / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster")) as inst:
        yield inst


@pytest.fixture
def io_managers(registry_db):
    """The three IO managers for tenant acme / project lab."""

    def make(tenant: str = "acme", project: str = "lab", **registry_kw):
        reg = NoetlRegistryResource(
            url=registry_kw.pop("url", registry_db), tenant=tenant, project=project, **registry_kw
        )
        return {
            "parquet": ParquetIOManager(registry=reg),
            "arrow": ArrowIPCIOManager(registry=reg),
            "iceberg": IcebergIOManager(registry=reg),
        }

    return make


class ServerThread:
    def __init__(self, app):
        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.01)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def http_registry(registry_db):
    """The registry service over HTTP on a free loopback port, backed by the test database."""
    from noetl_registry.app import create_app
    from noetl_registry.service import Registry

    reg = Registry(registry_db)
    with ServerThread(create_app(reg)) as url:
        yield url, reg
    reg.close()
