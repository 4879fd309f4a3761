"""Issue 14.7: ``run`` takes the same per-execution lease as ``resume``. Before, a
``resume`` of an execution that a live ``run`` was still running ran it a second
time (its steps twice). Now the resume is refused (exit 2) and the run finishes
alone. SQLite and Postgres, real subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from noetl_dagster.storage.event_stores import open_event_store

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: run_lease_probe, path: tests/run_lease_probe}
workflow:
  - step: start
    tool:
      kind: python
      code: |
        import os, pathlib, time
        pathlib.Path(os.environ["LEASE_MARK"]).open("a").write("x")
        release = os.environ.get("LEASE_RELEASE")
        deadline = time.monotonic() + 120
        while release and not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.02)
        result = {"ok": True}
    next: {arcs: [{step: end}]}
  - step: end
    tool: {kind: noop}
"""

PG = "postgresql://postgres@127.0.0.1:5432/test"


def _cli(*args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "noetl_dagster.commands.main", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'events.db'}"
        return
    schema = "runlease_" + uuid.uuid4().hex[:8]
    yield f"{PG}?schema={schema}"
    with psycopg.connect(PG, autocommit=True) as c:
        c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _execution_id(store_url: str, tmp_path: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        store = open_event_store(store_url, data_dir=tmp_path)
        try:
            found = [x.execution_id for x in store.executions()]
        finally:
            store.close()
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError("the run recorded no execution")


@pytest.mark.slow
def test_resume_of_a_running_execution_is_refused(tmp_path, store_url):
    pb = tmp_path / "pb.yaml"
    pb.write_text(PLAYBOOK)
    mark = tmp_path / "mark"
    release = tmp_path / "release"  # the run's first step holds until the resume has answered
    env = {**os.environ, "LEASE_MARK": str(mark), "NOETL_DAGSTER_HOME": str(tmp_path)}
    common = ["--event-store", store_url, "--data-dir", str(tmp_path)]

    # --durable: the run commits into the store the resume reads (a local run's lease: test_local_mode)
    run = _cli("run", str(pb), "--quiet", "--durable", *common, env={**env, "LEASE_RELEASE": str(release)})
    try:
        eid = _execution_id(store_url, tmp_path)
        deadline = time.monotonic() + 60
        while not mark.exists() and time.monotonic() < deadline:  # the run is inside its first step
            time.sleep(0.05)
        resume = _cli("resume", eid, *common, env=env)  # a resume that ran the step would not wait
        out, err = resume.communicate(timeout=120)
        release.touch()
        assert resume.returncode == 2, (out, err)
        assert "another process" in err and "Traceback" not in err
        out, err = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode == 0, (out, err)
    assert mark.read_text() == "x", "the step ran once: the refused resume ran nothing"

    store = open_event_store(store_url, data_dir=tmp_path)
    try:
        names = [e.name for e in store.read(eid)]
    finally:
        store.close()
    assert names.count("workflow.finished") == 1 and names.count("step.done") == 2
