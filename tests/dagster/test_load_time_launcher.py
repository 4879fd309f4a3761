"""Run workers forked from a warm process do not load the code location again (issue 19 §3).

A real zygote (``python -m noetl_dagster.sensors.zygote``) loads a one-job code location, then
forks the run worker of a real run on a SQLite instance; the run succeeds, it ran in the forked
process, and the code location's definitions function ran once (in the zygote), not once more
per run as with ``dagster api execute_run``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import yaml
from dagster._core.code_pointer import CodePointer
from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import serialize_value

from noetl_dagster.sensors.launcher import NoetlRunLauncher

REPO = Path(__file__).resolve().parents[2]

CODE = """
import os
from pathlib import Path

import dagster as dg

HERE = Path(__file__).parent


@dg.op
def where():
    (HERE / "ran_in").write_text(str(os.getpid()))


@dg.job(executor_def=dg.in_process_executor)  # the op runs in the run worker itself
def warm_job():
    where()


@dg.definitions
def defs():
    with open(HERE / "loads", "a") as fh:  # one line per load of the code location
        fh.write(f"{os.getpid()}\\n")
    return dg.Definitions(jobs=[warm_job])
"""


def test_a_forked_run_worker_runs_the_job_without_loading_the_code_again(tmp_path):
    code = tmp_path / "warm_defs.py"
    code.write_text(CODE)
    origin = RepositoryPythonOrigin(
        sys.executable, CodePointer.from_python_file(str(code), "defs", str(tmp_path))
    )
    job_origin = JobPythonOrigin("warm_job", origin)
    zygote = subprocess.Popen(
        [sys.executable, "-m", "noetl_dagster.sensors.zygote"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, cwd=REPO,
    )  # fmt: skip
    try:
        (tmp_path / "home").mkdir()
        with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
            assert zygote.stdin and zygote.stdout
            request = {
                "origin": serialize_value(origin),
                "load_data": None,
                "instance_ref": serialize_value(instance.get_ref()),
            }
            zygote.stdin.write(json.dumps(request) + "\n")
            zygote.stdin.flush()
            assert zygote.stdout.readline().startswith("ready ")
            assert (tmp_path / "loads").read_text().split() == [str(zygote.pid)]

            import importlib.util  # the job's definition, for the run record only

            spec = importlib.util.spec_from_file_location("warm_defs_here", code)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)  # type: ignore[union-attr]
            run = instance.create_run_for_job(module.warm_job, job_code_origin=job_origin)
            (tmp_path / "loads").write_text(f"{zygote.pid}\n")  # the test's own load above does not count

            args = ExecuteRunArgs(job_origin=job_origin, run_id=run.run_id, instance_ref=instance.get_ref())
            zygote.stdin.write(serialize_value(args) + "\n")
            zygote.stdin.flush()
            answer = zygote.stdout.readline().split()
            assert answer[0] == "ok", answer
            worker = int(answer[1])

            deadline = time.time() + 120
            while time.time() < deadline:
                status = instance.get_run_by_id(run.run_id).status
                if status in (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE):
                    break
                time.sleep(0.2)
            assert status == dg.DagsterRunStatus.SUCCESS
            assert (tmp_path / "ran_in").read_text() == str(worker) != str(zygote.pid)
            assert (tmp_path / "loads").read_text().split() == [str(zygote.pid)]  # not loaded again
    finally:
        zygote.stdin.close()  # type: ignore[union-attr]
        zygote.wait(timeout=30)


def test_the_example_instance_uses_the_warm_launcher():
    settings = yaml.safe_load((REPO / "example_project" / "dagster.yaml").read_text())
    with dg.instance_for_test(overrides={"run_launcher": settings["run_launcher"]}) as instance:
        assert isinstance(instance.run_launcher, NoetlRunLauncher) and instance.run_launcher.warm
    off = {"module": "noetl_dagster.sensors.launcher", "class": "NoetlRunLauncher", "config": {"warm": False}}
    with dg.instance_for_test(overrides={"run_launcher": off}) as instance:
        assert not instance.run_launcher.warm


def test_run_monitoring_sees_a_dead_forked_worker():
    """A forked worker killed with -9 fails its run (the daemon's run monitoring), as a code server's would."""
    from dagster._core.launcher import WorkerStatus
    from dagster._core.storage.dagster_run import DagsterRun

    from noetl_dagster.sensors.launcher import TAG_HOST, TAG_PID

    launcher = NoetlRunLauncher()
    assert launcher.supports_check_run_worker_health
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run = DagsterRun(
            job_name="j",
            run_id="r1",
            tags={TAG_PID: str(worker.pid), TAG_HOST: __import__("socket").gethostname()},
        )
        assert launcher.check_run_worker_health(run).status == WorkerStatus.RUNNING
        worker.kill()
        worker.wait()
        assert launcher.check_run_worker_health(run).status == WorkerStatus.FAILED
    finally:
        worker.kill()
    other = DagsterRun(job_name="j", run_id="r2")  # launched through the code server: its business
    assert launcher.check_run_worker_health(other).status == WorkerStatus.RUNNING


def test_dagster_migration_scripts_are_read_once_per_process(tmp_path):
    """Issue 35: each run's event log of a SQLite instance checks its schema revision; alembic read
    Dagster's ~180 migration scripts for every check (twice per run on the way to RUN_START). With
    ``cache_dagster_migrations`` (the zygote, whose forks inherit it, and the daemon's coordinator)
    they are read once per process."""
    from alembic.script.base import ScriptDirectory
    from dagster._core.test_utils import create_run_for_test

    from noetl_dagster.sensors.zygote import cache_dagster_migrations

    reads: list[str] = []
    saved_load, saved_from_config = ScriptDirectory._load_revisions, ScriptDirectory.__dict__["from_config"]

    def counting(self):  # type: ignore[no-untyped-def]
        reads.append(self.dir)
        return saved_load(self)

    def three_runs(home: Path) -> int:
        reads.clear()
        home.mkdir()
        with dg.instance_for_test(temp_dir=str(home)) as instance:
            for _ in range(3):  # a run's first event opens (creates, stamps, checks) its own event log file
                instance.report_engine_event("started", create_run_for_test(instance, job_name="j"))
        return len(reads)

    if getattr(ScriptDirectory.from_config, "noetl_cached", False):  # another test of this process cached it
        ScriptDirectory.from_config = classmethod(ScriptDirectory.from_config.noetl_original.__func__)  # type: ignore[attr-defined,method-assign,assignment]
    ScriptDirectory._load_revisions = counting  # type: ignore[method-assign]
    try:
        assert three_runs(tmp_path / "a") >= 3  # Dagster as it is: per run at least once
        cache_dagster_migrations()
        cache_dagster_migrations()  # idempotent
        assert three_runs(tmp_path / "b") <= 1  # once for the process (0 when it was read already)
        assert three_runs(tmp_path / "c") == 0
    finally:
        ScriptDirectory._load_revisions = saved_load  # type: ignore[method-assign]
        ScriptDirectory.from_config = saved_from_config  # type: ignore[method-assign]


def test_the_launcher_reads_an_execution_plan_snapshot_once(tmp_path, monkeypatch):
    """Issue 35: a warm launch needs the repository load data the code server recorded with the run's
    execution plan snapshot; the snapshot id is its content's hash, so the launcher reads it once,
    not once per launch (a database read and the plan's deserialization in the daemon)."""
    reads: list[str] = []
    original = dg.DagsterInstance.get_execution_plan_snapshot

    def counting(self, snapshot_id):  # type: ignore[no-untyped-def]
        reads.append(snapshot_id)
        return original(self, snapshot_id)

    monkeypatch.setattr(dg.DagsterInstance, "get_execution_plan_snapshot", counting)
    launcher = {"module": "noetl_dagster.sensors.launcher", "class": "NoetlRunLauncher"}
    with dg.instance_for_test(temp_dir=str(tmp_path), overrides={"run_launcher": launcher}) as instance:

        @dg.op
        def one():
            return 1

        @dg.job
        def job():
            one()

        runs = [instance.create_run_for_job(job) for _ in range(3)]
        assert len({r.execution_plan_snapshot_id for r in runs}) == 1  # the same plan, one snapshot
        expected = original(instance, runs[0].execution_plan_snapshot_id).repository_load_data
        got = [instance.run_launcher._load_data(r.execution_plan_snapshot_id) for r in runs]
        assert got == [serialize_value(expected) if expected else None] * 3
        assert reads == [runs[0].execution_plan_snapshot_id]  # read for the first launch only
        instance.run_launcher.dispose()
