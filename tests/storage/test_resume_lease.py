"""Issue 14.7: two ``resume`` commands on one execution must not both run it. The
first takes a lease in the event store; the second is refused (exit 2); a lease
whose holder was killed with SIGKILL is stale and the next resume takes it over.
SQLite and Postgres, real subprocesses."""

from __future__ import annotations

import os
import signal
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
metadata:
  name: lease_probe
  path: tests/lease_probe
workflow:
  - step: start
    tool:
      kind: python
      code: |
        import os, pathlib, time
        pathlib.Path(os.environ["LEASE_MARK"]).open("a").write("x")
        time.sleep(float(os.environ.get("LEASE_SLEEP", "0")))
        result = {"ok": True}
    next:
      arcs:
        - step: end
  - step: end
    tool:
      kind: python
      code: |
        result = {"done": True}
"""

PG = "postgresql://postgres@127.0.0.1:5432/test"


def _cli(*args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "noetl_dagster.commands.main", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_mark(mark: Path, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if mark.exists() and len(mark.read_text()) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"the step did not start {n} times")


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'events.db'}"
        return
    schema = "lease_" + uuid.uuid4().hex[:8]
    yield f"{PG}?schema={schema}"
    with psycopg.connect(PG, autocommit=True) as c:
        c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_second_resume_refused_and_stale_lease_after_sigkill_expires(tmp_path, store_url):
    pb = tmp_path / "pb.yaml"
    pb.write_text(PLAYBOOK)
    mark = tmp_path / "mark"
    env = {**os.environ, "LEASE_MARK": str(mark), "LEASE_SLEEP": "60", "NOETL_DAGSTER_HOME": str(tmp_path)}
    common = ["--event-store", store_url, "--data-dir", str(tmp_path)]

    # an execution whose process died inside its first step
    run = _cli("run", str(pb), "--durable", *common, env=env)  # a process that died with its store's lease
    _wait_mark(mark, 1)
    time.sleep(0.5)
    run.send_signal(signal.SIGKILL)
    run.wait()
    store = open_event_store(store_url, data_dir=tmp_path)
    try:
        (eid,) = [x.execution_id for x in store.executions()]
    finally:
        store.close()

    # the first resume holds the lease while it runs the step again
    first = _cli("resume", eid, *common, env=env)
    _wait_mark(mark, 2)
    second = _cli("resume", eid, *common, env=env)
    out, err = second.communicate(timeout=120)
    assert second.returncode == 2, (out, err)
    assert "leased by another process (a run or resume of it is in progress)" in err
    assert len(mark.read_text()) == 2, "the refused resume ran nothing"

    # kill -9 the holder: its lease is stale, a new resume takes it over and finishes
    first.send_signal(signal.SIGKILL)
    first.wait()
    env["LEASE_SLEEP"] = "0"
    third = _cli("resume", eid, *common, env=env)
    out, err = third.communicate(timeout=120)
    assert third.returncode == 0, (out, err)
    assert len(mark.read_text()) == 3

    store = open_event_store(store_url, data_dir=tmp_path)
    try:
        names = [e.name for e in store.read(eid)]
        assert names[-2:] == ["workflow.finished", "playbook.processed"]
        assert names.count("workflow.finished") == 1
    finally:
        store.close()
