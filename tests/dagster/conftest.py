"""Fixtures of the Dagster tests; shared helpers live in dagster_helpers.py."""

from __future__ import annotations

import os

import dagster as dg
import pytest
from dagster_helpers import EXAMPLES

from noetl_dagster.resources.noetl import close_all_services


@pytest.fixture(scope="session")
def ephemeral_instance():
    """One in-memory Dagster instance shared by the tests that only need runs, not a daemon."""
    inst = dg.DagsterInstance.ephemeral()
    yield inst
    inst.dispose()


@pytest.fixture
def dagster_data(tmp_path):
    d = tmp_path / "noetl"
    yield d
    close_all_services()


@pytest.fixture(scope="session")
def recovery_env(tmp_path_factory):
    """Env for tests/dagster/recovery_jobs.py: Dagster caches a reconstructed job per process, so every
    re-execution test shares one data dir and the jobs are built from files named here."""
    import textwrap  # noqa: PLC0415

    from test_loop_frames import LOOP  # noqa: PLC0415

    base = tmp_path_factory.mktemp("recovery")
    frames = base / "frames.yaml"
    frames.write_text(textwrap.dedent(LOOP.format(n=6, mode="parallel", extra=", dagster: {frame_size: 3}",
                                                  task_extra="")).lstrip())  # fmt: skip
    env = {
        "RECOVERY_TEST_DATA_DIR": str(base / "noetl"),
        "RECOVERY_TEST_PLAYBOOK": str(EXAMPLES / "hello_dagster.yaml"),
        "RECOVERY_TEST_FRAMES_PLAYBOOK": str(frames),
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield base / "noetl"
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
