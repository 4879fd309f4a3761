"""Scale-out on Celery (dagster-celery) with a real Redis broker and two live worker
processes: a playbook's parallel loop frames run as Celery tasks on both workers, and
the execution's event log is the same one the local runner writes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml

HERE = Path(__file__).resolve().parent / "celery"
REDIS_DB = 11  # a database of its own, flushed before the test


def _redis_up() -> redis.Redis:
    client = redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB)
    try:
        client.ping()
    except redis.ConnectionError:
        server = shutil.which("redis-server")
        assert server, "redis-server is not installed (make setup installs it)"
        subprocess.run([server, "--daemonize", "yes", "--bind", "127.0.0.1", "--port", "6379", "--save", "",
                        "--appendonly", "no"], check=True)  # fmt: skip
        for _ in range(50):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
    return client


@pytest.fixture
def celery_env(tmp_path, monkeypatch):
    client = _redis_up()
    client.flushdb()
    broker = f"redis://127.0.0.1:6379/{REDIS_DB}"
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {
        "DAGSTER_HOME": str(home),
        "NOETL_DAGSTER_HOME": str(tmp_path / "noetl"),
        "NOETL_DAGSTER_EXECUTOR": "celery",
        "NOETL_CELERY_BROKER": broker,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        # dagster-celery starts `celery` by name: the one beside this interpreter
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.syspath_prepend(str(HERE))
    config = tmp_path / "celery.yaml"
    config.write_text(yaml.safe_dump({"execution": {"config": {"broker": broker, "backend": broker}}}))
    return tmp_path, config, {**os.environ, **env}


def _start_workers(tmp_path: Path, config: Path, env: dict, n: int) -> list[tuple[subprocess.Popen, Path]]:
    cli = Path(sys.executable).with_name("dagster-celery")
    workers = []
    for i in range(n):
        log = tmp_path / f"worker{i}.log"
        proc = subprocess.Popen(
            [str(cli), "worker", "start", "-A", "dagster_celery.app", "-y", str(config), "-n", f"noetl{i}", "-i", "celery_defs",
             "--", "--pool=solo"],
            env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path,
        )  # fmt: skip
        workers.append((proc, log))
    deadline = time.monotonic() + 60
    for proc, log in workers:
        while "ready" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
    return workers


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning")  # dagster-celery's own app
def test_parallel_loop_frames_run_on_two_celery_workers(celery_env):
    import dagster as dg
    from celery_defs import fanout_job

    from noetl_dagster.resources.noetl import close_all_services
    from noetl_dagster.storage.event_stores import open_event_store

    tmp_path, config, env = celery_env
    with dg.DagsterInstance.get():  # create the instance's storage once, before two workers race to
        pass
    workers = _start_workers(tmp_path, config, env, 2)
    try:
        assert fanout_job().executor_def.name == "celery"
        with dg.DagsterInstance.get() as instance:
            result = dg.execute_job(dg.reconstructable(fanout_job), instance=instance)
            assert result.success
            records = instance.all_logs(result.run_id, of_type=dg.DagsterEventType.STEP_START)
            step_pids = {r.dagster_event.pid for r in records}
            worker_logs = [log.read_text() for _, log in workers]
            eid = result.dagster_run.tags["noetl/execution_id"]
    finally:
        for proc, _ in workers:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in workers:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    # steps ran in the workers, not here, and both workers took some
    assert os.getpid() not in step_pids and len(step_pids) >= 2, step_pids
    assert all("succeeded" in text for text in worker_logs), [t[-2000:] for t in worker_logs]
    close_all_services()
    store = open_event_store(data_dir=tmp_path / "noetl")
    events = store.read(eid)
    finished = [e for e in events if e.name == "workflow.finished"]
    assert len(finished) == 1 and finished[0].data.get("status") == "completed"
    done = [e for e in events if e.name == "step.done" and e.step == "total"]
    assert done and done[-1].data["result"] == {"sum": 91}
    pids = {r["pid"] for e in events if e.name == "loop.done" for r in e.data["result"]["results"]}
    assert len(pids) >= 2  # the loop's iterations ran in more than one worker process
    store.close()
