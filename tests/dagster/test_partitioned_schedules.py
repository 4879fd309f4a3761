"""Issue 42 part 3: a schedule on a partitioned playbook runs a partition, as Dagster's
``build_schedule_from_partitioned_job`` does: a time-partitioned playbook the last complete
partition at the tick (a daily schedule fills yesterday), a static one every key. The key reaches
the workload exactly as a launchpad partition run's does, and the registry records that day."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from noetl_dagster.resources.noetl import NoetlResource, close_all_services
from noetl_dagster.sensors.router import RouterCursor, instance_run_lookup, router_tick
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.translator import compile_playbooks
from noetl_dagster.translator.runner import run_playbook_dagster

SERIES = "noetl://demo/examples/t/dataset/scheduled_events"
PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: scheduled_events, path: tests/scheduled_events}}
executor:
  spec:
    schedule: {schedule}
    dagster:
      partitions: {partitions}
workload: {{day: "2026-01-01"}}
workflow:
  - step: start
    tool:
      - make:
          kind: python
          input: {{day: "{{{{ workload.day }}}}"}}
          code: |
            def main(day):
                return [{{"day": day, "i": i}} for i in range(int(day[-2:]))]
      - save:
          kind: parquet
          uri: {series}
          data: "{{{{ make }}}}"
"""
DAILY = "{daily: 2026-11-20, workload_key: day}"


def _playbook(tmp_path: Path, schedule: str = "{cron: '0 2 * * *'}", partitions: str = DAILY) -> Path:
    f = tmp_path / "scheduled_events.yaml"
    f.write_text(PLAYBOOK.format(schedule=schedule, partitions=partitions, series=SERIES))
    return f


def _res(data_dir: Path) -> NoetlResource:
    return NoetlResource(data_dir=str(data_dir), tenant="demo", project="examples")


def _schedule(f: Path, data_dir: Path) -> tuple[dg.Definitions, dg.ScheduleDefinition]:
    defs = compile_playbooks([f], include_sensor=False, resource=_res(data_dir)).definitions
    (sched,) = defs.schedules
    return defs, sched


def _evaluate(defs: dg.Definitions, sched: dg.ScheduleDefinition, at: datetime) -> dg.ScheduleExecutionData:
    """The tick as the daemon evaluates it (a partitioned run request resolves against the repository)."""
    ctx = dg.build_schedule_context(scheduled_execution_time=at, repository_def=defs.get_repository_def())
    return sched.evaluate_tick(ctx)


def _tick(defs: dg.Definitions, sched: dg.ScheduleDefinition, when: str) -> list[dg.RunRequest]:
    return list(_evaluate(defs, sched, datetime.fromisoformat(when)).run_requests or [])


def _records(data_dir: Path) -> list[tuple[str | None, int]]:
    """(partition_key, rows) of every registry version of the series."""
    reg = _res(data_dir).registry("demo", "examples")
    newest = int(reg.resolve(SERIES).version[1:])
    return [
        (plan.metadata.get("partition_key"), plan.rows)
        for plan in (reg.resolve(f"{SERIES}@v{i}") for i in range(1, newest + 1))
    ]


def test_a_daily_schedule_fills_the_previous_day(dagster_data, tmp_path):
    defs, sched = _schedule(_playbook(tmp_path), dagster_data)
    (req,) = _tick(defs, sched, "2026-11-23T02:00:00+00:00")
    assert req.partition_key == "2026-11-22" and req.run_key == "2026-11-22"
    job = defs.resolve_job_def(sched.job_name)
    with dg.instance_for_test() as instance:
        res = job.execute_in_process(run_config=req.run_config, partition_key=req.partition_key,
                                     tags=req.tags, instance=instance)  # fmt: skip
    assert res.success
    assert res.dagster_run.tags["dagster/partition"] == "2026-11-22"
    assert _records(dagster_data) == [("2026-11-22", 22)]  # the workload's day, not its default 2026-01-01


@pytest.mark.parametrize(
    ("partitions", "when", "key"),
    [
        ("{hourly: '2026-11-20-00:00', workload_key: day}", "2026-11-23T05:10:00+00:00", "2026-11-23-04:00"),
        ("{weekly: 2026-11-01, workload_key: day}", "2026-11-25T00:00:00+00:00", "2026-11-15"),
        ("{monthly: 2026-01-01, workload_key: day}", "2026-11-03T00:00:00+00:00", "2026-10-01"),
        ("{daily: 2026-11-20, workload_key: day, end_offset: 1}", "2026-11-23T02:00:00+00:00", "2026-11-23"),
    ],
)
def test_time_partitions_run_the_last_complete_partition(dagster_data, tmp_path, partitions, when, key):
    defs, sched = _schedule(_playbook(tmp_path, partitions=partitions), dagster_data)
    assert [r.partition_key for r in _tick(defs, sched, when)] == [key]


def test_a_tick_before_the_first_partition_is_skipped(dagster_data, tmp_path):
    defs, sched = _schedule(_playbook(tmp_path), dagster_data)
    at = datetime(2026, 11, 20, 2, tzinfo=UTC)  # the first day is not complete yet
    data = _evaluate(defs, sched, at)
    assert not data.run_requests and "no complete partition" in data.skip_message


def test_a_static_schedule_runs_every_key_each_tick(dagster_data, tmp_path):
    f = _playbook(tmp_path, partitions="{static: ['2026-11-21', '2026-11-24'], workload_key: day}")
    defs, sched = _schedule(f, dagster_data)
    reqs = _tick(defs, sched, "2026-11-25T02:00:00+00:00")
    assert [(r.partition_key, r.run_key) for r in reqs] == [("2026-11-21",) * 2, ("2026-11-24",) * 2]
    job = defs.resolve_job_def(sched.job_name)
    with dg.instance_for_test() as instance:
        for r in reqs:
            assert job.execute_in_process(run_config=r.run_config, partition_key=r.partition_key,
                                          instance=instance).success  # fmt: skip
    assert sorted(_records(dagster_data)) == [("2026-11-21", 21), ("2026-11-24", 24)]


def test_without_cron_a_time_partitioned_schedule_follows_the_partitions(dagster_data, tmp_path):
    defs, sched = _schedule(_playbook(tmp_path, schedule="{workload: {}}"), dagster_data)
    assert sched.cron_schedule == "0 0 * * *" and sched.execution_timezone == "UTC"
    assert [r.partition_key for r in _tick(defs, sched, "2026-11-23T00:00:00+00:00")] == ["2026-11-22"]


def test_schedule_workload_and_tags_still_reach_the_run(dagster_data, tmp_path):
    f = _playbook(tmp_path, schedule="{cron: '0 2 * * *', workload: {extra: 1}, tags: {team: data}}")
    defs, sched = _schedule(f, dagster_data)
    (req,) = _tick(defs, sched, "2026-11-23T02:00:00+00:00")
    assert req.run_config["ops"]["noetl_start"]["config"]["workload_json"] == '{"extra": 1}'
    assert req.tags["team"] == "data"


DEFS = """\
import os
from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.translator import compile_playbooks
defs = compile_playbooks([os.environ["T42_PLAYBOOK"]], include_sensor=False,
                         resource=NoetlResource(data_dir=os.environ["T42_DATA"], tenant="demo", project="examples")).definitions
"""


@pytest.mark.slow
def test_the_real_daemon_tick_runs_yesterdays_partition(dagster_data, tmp_path):
    """``dagster-daemon run`` on a temp DAGSTER_HOME; the schedule fires every minute (enabled: RUNNING
    by default) and its run writes yesterday's partition (of the tick's date)."""
    f = _playbook(tmp_path, schedule="{cron: '* * * * *', enabled: true}")
    (tmp_path / "t42_defs.py").write_text(DEFS)
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry: {enabled: false}\n")
    env = {**os.environ, "DAGSTER_HOME": str(home), "T42_PLAYBOOK": str(f), "T42_DATA": str(dagster_data),
           "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)}  # fmt: skip
    log_path = tmp_path / "daemon.log"
    # the storage is made before the daemon starts (two processes creating one sqlite schema race)
    with dg.DagsterInstance.from_config(str(home)) as instance, open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-m", "t42_defs"],
            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            run = _wait_for_scheduled_run(instance, proc, log_path)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            close_all_services()
    nominal = run.tags[".dagster/scheduled_execution_time"]  # the tick's time, as the scheduler tags it
    day = (datetime.fromisoformat(nominal).astimezone(UTC) - timedelta(days=1)).date().isoformat()
    assert run.tags["dagster/partition"] == day, run.tags
    assert _records(dagster_data) == [(day, int(day[-2:]))]
    store = open_event_store(None, data_dir=dagster_data)  # lineage reads the nominal time off the request
    req = next(
        e for e in store.read(run.tags["noetl/execution_id"]) if e.name == "playbook.execution.requested"
    )
    assert req.data["nominal_time"] == nominal


def _wait_for_scheduled_run(
    instance: dg.DagsterInstance, proc: subprocess.Popen, log_path: Path
) -> dg.DagsterRun:
    deadline = time.time() + 420  # the next minute's tick, then a run launched in a subprocess
    while time.time() < deadline:
        assert proc.poll() is None, log_path.read_text()[-3000:]
        runs = instance.get_runs(
            filters=dg.RunsFilter(tags={"dagster/schedule_name": "scheduled_events__schedule"})
        )
        done = [r for r in runs if r.is_finished]
        if done:
            assert done[-1].status == dg.DagsterRunStatus.SUCCESS, log_path.read_text()[-3000:]
            return done[-1]
        time.sleep(2)
    raise AssertionError("no scheduled run finished in 420 s\n" + log_path.read_text()[-3000:])


def test_the_router_launches_a_partitioned_playbook_with_its_partition(
    dagster_data, tmp_path, ephemeral_instance
):
    """A detached execution of a partitioned playbook: the router's run of the playbook job carries the
    partition the workload names, so its materializations land on that partition."""
    f = _playbook(tmp_path)
    loc = compile_playbooks([f], resource=_res(dagster_data))
    eid = run_playbook_dagster(f, {"day": "2026-11-22"}, data_dir=dagster_data, detach=True, tenant="demo",
                               project="examples").execution_id  # fmt: skip
    svc = loc.index.resource.services()
    (launch,) = router_tick(loc.index, svc, instance_run_lookup(ephemeral_instance), RouterCursor()).launches
    assert launch.execution_id == eid and launch.partition_key == "2026-11-22"
    assert launch.run_request().partition_key == "2026-11-22"
    other = run_playbook_dagster(f, {"day": "not-a-day"}, data_dir=dagster_data, detach=True, tenant="demo",
                                 project="examples").execution_id  # fmt: skip
    launches = router_tick(loc.index, svc, instance_run_lookup(ephemeral_instance), RouterCursor()).launches
    assert {la.execution_id: la.partition_key for la in launches}[other] is None  # no such partition: none


FLAKY = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: flaky_day, path: tests/flaky_day}
executor:
  spec:
    schedule: {cron: '0 2 * * *', retries: 2}
    dagster:
      partitions: {daily: 2026-11-20, workload_key: day}
workload: {day: "2026-01-01", marker: MARKER}
workflow:
  - step: start
    tool:
      - fetch:
          kind: python
          input: {day: "{{ workload.day }}", marker: "{{ workload.marker }}"}
          code: |
            import os
            def main(day, marker):
                if not os.path.exists(marker):  # the first attempt: the upstream is not there yet
                    open(marker, "w").close()
                    raise RuntimeError("upstream not ready")
                return {"day": day}
"""


def test_a_failed_scheduled_day_is_retried_as_a_new_execution_of_that_day(dagster_data, tmp_path):
    """Issue 42 leftover: run key = partition key, so a later tick never runs a failed day again. The
    Dagster answer is a run retry: ``retries: 2`` puts ``dagster/max_retries`` (strategy ALL_STEPS) on the
    scheduled runs; the daemon's retry copies the failed run's tags (``noetl/execution_id`` included) and
    adds ``dagster/retry_number``, and noetl_start then starts a new execution of the same day, since the
    failed one never runs its failed step again."""
    f = tmp_path / "flaky_day.yaml"
    f.write_text(FLAKY.replace("MARKER", str(tmp_path / "upstream_ready")))
    defs, sched = _schedule(f, dagster_data)
    (req,) = _tick(defs, sched, "2026-11-23T02:00:00+00:00")
    assert req.partition_key == "2026-11-22"
    assert req.tags["dagster/max_retries"] == "2" and req.tags["dagster/retry_strategy"] == "ALL_STEPS"
    job = defs.resolve_job_def(sched.job_name)
    with dg.instance_for_test() as instance:
        first = job.execute_in_process(run_config=req.run_config, partition_key=req.partition_key,
                                       tags=req.tags, instance=instance, raise_on_error=False)  # fmt: skip
        assert not first.success
        failed = instance.get_run_by_id(first.run_id)
        failed_eid = failed.tags["noetl/execution_id"]
        retry_tags = {**failed.tags, "dagster/retry_number": "1"}  # what the daemon's retry run carries
        retry = job.execute_in_process(run_config=req.run_config, partition_key=req.partition_key,
                                       tags=retry_tags, instance=instance)  # fmt: skip
        assert retry.success
        eid = instance.get_run_by_id(retry.run_id).tags["noetl/execution_id"]
    assert eid != failed_eid
    store = open_event_store(None, data_dir=dagster_data)
    names = [e.name for e in store.read(eid) if e.execution_id == eid]
    assert names[-1] == "playbook.processed" and "workflow.finished" in names, names
    request = next(e for e in store.read(eid) if e.name == "playbook.execution.requested")
    assert next(e for e in store.read(eid) if e.name == "workflow.finished").data["status"] == "completed"
    assert request.data["workload"]["day"] == "2026-11-22"  # the same day


def test_schedule_retries_must_be_a_whole_number(dagster_data, tmp_path):
    f = tmp_path / "flaky_day.yaml"
    f.write_text(FLAKY.replace("retries: 2", "retries: -1"))
    with pytest.raises(ValueError, match=r"executor.spec.schedule.retries must be a whole number >= 0"):
        _schedule(f, dagster_data)


PARITY_DEFS = """\
import os
import dagster as dg
from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.translator import compile_playbooks

_loc = compile_playbooks([os.environ["T42_PLAYBOOK"]], include_sensor=False,
                         resource=NoetlResource(data_dir=os.environ["T42_DATA"], tenant="demo", project="examples"))
_job = _loc.definitions.resolve_job_def("scheduled_events")
defs = dg.Definitions.merge(_loc.definitions, dg.Definitions(schedules=[
    dg.build_schedule_from_partitioned_job(_job, name="dagster_builder_schedule")]))
"""
SCHEDULE_QUERY = """
query ($sel: ScheduleSelector!) {
  scheduleOrError(scheduleSelector: $sel) {
    __typename
    ... on Schedule { name pipelineName cronSchedule executionTimezone partitionSet { name } }
  }
}"""
PARTITION_SETS_QUERY = """
query ($repo: RepositorySelector!, $job: String!) {
  partitionSetsOrError(repositorySelector: $repo, pipelineName: $job) {
    ... on PartitionSets { results { name pipelineName } }
  }
}"""


def test_the_ui_sees_the_schedule_as_dagster_sees_its_own_partitioned_schedule(
    dagster_data, tmp_path, monkeypatch
):
    """Issue 42 leftover 1, through the GraphQL API the UI reads (a real code server process): the
    schedule page's "Partition set" row is ``Schedule.partitionSet``, resolved from the remote schedule's
    ``partition_set_name``. Dagster 1.13 sets that to None for every schedule (``ScheduleSnap.from_def``),
    its own ``build_schedule_from_partitioned_job`` included, so the row reads "None" for both; the
    partitions live on the job's partition set (``<job>_partition_set``), which the schedule targets.
    This test pins the parity: if Dagster starts naming a partition set for its own builder's schedule,
    ours must follow (it fails then)."""
    from dagster_graphql.test.utils import (  # noqa: PLC0415 - the webserver's schema and workspace
        define_out_of_process_context,
        execute_dagster_graphql,
        infer_repository_selector,
        infer_schedule_selector,
    )

    f = _playbook(tmp_path, schedule="{workload: {}}")  # cron from the partitions, as the builder does
    (tmp_path / "parity_defs.py").write_text(PARITY_DEFS)
    monkeypatch.setenv("T42_PLAYBOOK", str(f))
    monkeypatch.setenv("T42_DATA", str(dagster_data))
    with (
        dg.instance_for_test() as instance,
        define_out_of_process_context(str(tmp_path / "parity_defs.py"), "defs", instance) as ctx,
    ):
        got = {}
        for name in ("scheduled_events__schedule", "dagster_builder_schedule"):
            res = execute_dagster_graphql(ctx, SCHEDULE_QUERY, {"sel": infer_schedule_selector(ctx, name)})
            assert res.errors is None, res.errors
            got[name] = res.data["scheduleOrError"]
        sets = execute_dagster_graphql(
            ctx, PARTITION_SETS_QUERY, {"repo": infer_repository_selector(ctx), "job": "scheduled_events"}
        ).data["partitionSetsOrError"]["results"]
    ours, dagsters = got["scheduled_events__schedule"], got["dagster_builder_schedule"]
    assert ours["__typename"] == dagsters["__typename"] == "Schedule"
    assert ours["partitionSet"] == dagsters["partitionSet"]  # both None in Dagster 1.13
    assert (ours["pipelineName"], ours["cronSchedule"], ours["executionTimezone"]) == (
        dagsters["pipelineName"], dagsters["cronSchedule"], dagsters["executionTimezone"]
    )  # fmt: skip
    assert sets == [{"name": "scheduled_events_partition_set", "pipelineName": "scheduled_events"}]


@pytest.mark.slow
def test_the_real_daemon_retries_a_failed_scheduled_day_as_a_new_execution(dagster_data, tmp_path):
    """``dagster-daemon run`` with ``run_retries`` enabled: the minute's tick fails (the upstream is not
    ready), the daemon launches the retry (``dagster/retry_number: 1``), which runs the same day in a new
    execution and succeeds."""
    f = tmp_path / "flaky_day.yaml"
    f.write_text(
        FLAKY.replace("MARKER", str(tmp_path / "upstream_ready")).replace(
            "{cron: '0 2 * * *', retries: 2}", "{cron: '* * * * *', retries: 1, enabled: true}"
        )
    )
    (tmp_path / "t42_defs.py").write_text(DEFS)
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry: {enabled: false}\nrun_retries: {enabled: true}\n")
    env = {**os.environ, "DAGSTER_HOME": str(home), "T42_PLAYBOOK": str(f), "T42_DATA": str(dagster_data),
           "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)}  # fmt: skip
    log_path = tmp_path / "daemon.log"
    with dg.DagsterInstance.from_config(str(home)) as instance, open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-m", "t42_defs"],
            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            deadline, runs = time.time() + 420, []
            while time.time() < deadline:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                runs = instance.get_runs(
                    filters=dg.RunsFilter(tags={"dagster/schedule_name": "flaky_day__schedule"})
                )
                retried = [r for r in runs if r.tags.get("dagster/retry_number") == "1" and r.is_finished]
                if retried:
                    break
                time.sleep(2)
            else:
                raise AssertionError(f"no finished retry in 420 s: {runs}\n" + log_path.read_text()[-3000:])
            (retry,) = retried
            failed = instance.get_run_by_id(retry.parent_run_id)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            close_all_services()
    assert failed.status == dg.DagsterRunStatus.FAILURE
    assert retry.status == dg.DagsterRunStatus.SUCCESS, log_path.read_text()[-3000:]
    assert retry.tags["dagster/partition"] == failed.tags["dagster/partition"]
    assert retry.tags["noetl/execution_id"] != failed.tags["noetl/execution_id"]
