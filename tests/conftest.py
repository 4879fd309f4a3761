"""Shared fixtures. Every execution a test runs is replayed from its event log
and compared with the live state (DESIGN.md: replay reproduces state exactly)."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from noetl_dagster.engine.replay import diff_snapshots, replay
from noetl_dagster.runners import local as _runner

# shared/ sits beside the checkout (locally and in CI); NOETL_SHARED points elsewhere
SHARED = Path(os.environ.get("NOETL_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
CONFORMANCE = SHARED / "conformance" / "noetl-e2e" / "fixtures" / "playbooks"

# the example project is not in the wheel (nor in the editable install's finder): this process and
# every subprocess a test starts (dagster dev, code servers) find it on the checkout's root; the
# folders holding noetl_analytics, noetl_lineage and noetl_registry come next, so a worktree's
# subprocesses import its own copies before an editable install of another checkout
_ROOT = str(Path(__file__).resolve().parents[1])
_PATHS = [_ROOT, *(os.path.join(_ROOT, d) for d in ("analytics", "lineage", "registry_service"))]
for _p in reversed(_PATHS):
    if _p not in sys.path:
        sys.path.insert(0, _p)
_have = os.environ.get("PYTHONPATH", "").split(os.pathsep)
if any(p not in _have for p in _PATHS):
    os.environ["PYTHONPATH"] = os.pathsep.join([*(p for p in _PATHS if p not in _have), *filter(None, _have)])

# Hypothesis loads its "ci" profile when it detects CI (the CI variable; .ci/run sets it): the same
# examples every run (derandomize), no example database. Here that profile also halves the default
# number of examples; a property that scales its own count from it (test_builder_roundtrip.py) runs
# half as many in CI and the full count locally.
settings.register_profile("ci", settings.get_profile("ci"), max_examples=50)

_FINISHED: list = []


def pytest_configure(config):
    """Under pytest-xdist each worker gets its own default data dir, so tests that rely on the
    default home (embedded chDB allows one process per path, SQLite logs) never share one."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and "NOETL_DAGSTER_HOME" not in os.environ:
        import tempfile

        os.environ["NOETL_DAGSTER_HOME"] = tempfile.mkdtemp(prefix=f"noetl-{worker}-")
    if "NOETL_DAGSTER_PLAYBOOK_CACHE" not in os.environ:  # `run` and code locations cache parsed playbooks:
        import tempfile  # a session's own directory, not the user's ~/.cache (subprocesses inherit it)

        os.environ["NOETL_DAGSTER_PLAYBOOK_CACHE"] = tempfile.mkdtemp(prefix="noetl-playbook-cache-")
    if hasattr(config.option, "loadscopereorder"):  # xdist's sort by number of tests: see tests/ordering.py
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """The heaviest test files first (tests/ordering.py), so that no worker is left alone with one."""
    from ordering import heavy_first

    items[:] = [items[i] for i in heavy_first([item.nodeid for item in items])]


def pytest_sessionfinish(session):
    """An xdist worker collects its heap here, before it reports itself finished, and freezes what is
    left. After that report the controller tears the worker down, and execnet sends the worker a
    SIGINT if it is still busy 5 s later: pytest's closing gc.collect() over a worker's whole heap
    (1-1.5 GB after a thousand tests) took longer on a loaded machine, and the KeyboardInterrupt
    surfaced in a gc callback (hypothesis', SQLAlchemy's) as an unraisable exception. Frozen objects
    are skipped by that last collection; this one still runs every finalizer."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        gc.collect()
        gc.freeze()


def _record(engine) -> None:
    _FINISHED.append((engine.services, engine.execution_id, engine.state.snapshot()))


_runner.FINISHED_HOOKS.append(_record)


@pytest.fixture(autouse=True)
def _replay_every_execution():
    """After each test, replay every execution it ran and compare with the live state."""
    start = len(_FINISHED)
    yield
    for services, execution_id, expected in _FINISHED[start:]:
        try:
            state = replay(services.event_store, execution_id, services.offloader)
        except Exception as e:  # a closed store in a test that tears its own down
            if "closed" in str(e).lower():
                continue
            raise
        diff = diff_snapshots(expected, state.snapshot())
        assert not diff, f"replay of {execution_id} differs from the live state in {diff}"
    del _FINISHED[start:]


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    d = tmp_path / "noetl"
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(d))
    return d


@pytest.fixture
def conformance_dir() -> Path:
    return CONFORMANCE


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint():
    """moto in server mode (a real HTTP S3 endpoint) on a free loopback port."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(moto_endpoint):
    """A fresh bucket; returns (endpoint, bucket, storage options)."""
    import uuid

    import boto3

    bucket = f"noetl-test-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket=bucket)
    return moto_endpoint, bucket, {"endpoint_url": moto_endpoint, "key": "testing", "secret": "testing"}
