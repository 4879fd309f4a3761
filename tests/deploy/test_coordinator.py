"""The run coordinator of example_project/dagster.yaml shortens the sensor daemon's loop (issue 19 §3)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import dagster._daemon.controller as daemon_controller
import dagster._daemon.sensor as sensor_daemon
import pytest
import yaml

from noetl_dagster.sensors.coordinator import NoetlRunCoordinator

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def restore_loop_time():
    before = sensor_daemon.MIN_INTERVAL_LOOP_TIME, daemon_controller.DEFAULT_DAEMON_INTERVAL_SECONDS
    yield
    sensor_daemon.MIN_INTERVAL_LOOP_TIME, daemon_controller.DEFAULT_DAEMON_INTERVAL_SECONDS = before


def test_example_dagster_yaml_sets_a_short_sensor_loop(restore_loop_time):
    sensor_daemon.MIN_INTERVAL_LOOP_TIME = 5  # Dagster's own value
    settings = yaml.safe_load((REPO / "example_project" / "dagster.yaml").read_text())
    with dg.instance_for_test(overrides={"run_coordinator": settings["run_coordinator"]}) as instance:
        coordinator = instance.run_coordinator
        assert isinstance(coordinator, NoetlRunCoordinator) and coordinator.launch_when_free
        # under the router's 1 s interval: the sensor ticks every 1.0-1.2 s, not every 1 or 2 s
        assert coordinator.sensor_loop_seconds == 0.2 and sensor_daemon.MIN_INTERVAL_LOOP_TIME == 0.2
        # the queue's own settings still apply
        assert (
            coordinator.dequeue_interval_seconds == 1
            and coordinator.get_run_queue_config().max_concurrent_runs == 8
        )


def test_the_backfill_daemon_looks_for_backfills_every_two_seconds(restore_loop_time):
    """issue 42: a backfill waited up to 30 s (Dagster's loop) before its one run started."""
    daemon_controller.DEFAULT_DAEMON_INTERVAL_SECONDS = 30  # Dagster's own value
    for f in ("example_project/dagster.yaml", "deploy/dagster.postgres.yaml"):
        settings = yaml.safe_load((REPO / f).read_text())
        with dg.instance_for_test(overrides={"run_coordinator": settings["run_coordinator"]}) as instance:
            assert instance.run_coordinator.backfill_loop_seconds == 2
            assert daemon_controller.DEFAULT_DAEMON_INTERVAL_SECONDS == 2  # what the backfill loop reads
        daemon_controller.DEFAULT_DAEMON_INTERVAL_SECONDS = 30


def test_sensor_loop_seconds_is_configurable(restore_loop_time):
    config = {"module": "noetl_dagster.sensors.coordinator", "class": "NoetlRunCoordinator",
              "config": {"sensor_loop_seconds": 3}}  # fmt: skip
    with dg.instance_for_test(overrides={"run_coordinator": config}) as instance:
        assert instance.run_coordinator.sensor_loop_seconds == 3
        assert sensor_daemon.MIN_INTERVAL_LOOP_TIME == 3


def test_the_postgres_profile_and_the_helm_values_use_the_noetl_coordinator(restore_loop_time):
    profile = yaml.safe_load((REPO / "deploy" / "dagster.postgres.yaml").read_text())["run_coordinator"]
    helm = yaml.safe_load((REPO / "deploy" / "helm" / "values.yaml").read_text())["dagsterDaemon"]
    assert helm["runCoordinator"]["type"] == "CustomRunCoordinator"
    custom = helm["runCoordinator"]["config"]["customRunCoordinator"]
    assert helm["image"]["repository"] == (
        yaml.safe_load((REPO / "deploy" / "helm" / "values.yaml").read_text())["dagster-user-deployments"]["deployments"][0][
            "image"]["repository"]
    )  # the daemon builds the coordinator: it runs the image that has noetl-dagster  # fmt: skip
    for settings in (profile, custom):
        sensor_daemon.MIN_INTERVAL_LOOP_TIME = 5
        with dg.instance_for_test(overrides={"run_coordinator": settings}) as instance:
            coordinator = instance.run_coordinator
            assert (
                isinstance(coordinator, NoetlRunCoordinator) and sensor_daemon.MIN_INTERVAL_LOOP_TIME == 0.2
            )
            assert coordinator.dequeue_interval_seconds == 1
            limits = coordinator.get_run_queue_config().tag_concurrency_limits
            assert [(t["key"], t["limit"]) for t in limits] == [("noetl/execution_id", 1)]


LIMITS = [{"key": "noetl/execution_id", "value": {"applyLimitPerUniqueValue": True}, "limit": 1}]


def _instance(**config):
    coordinator = {
        "module": "noetl_dagster.sensors.coordinator",
        "class": "NoetlRunCoordinator",
        "config": {"max_concurrent_runs": 2, "tag_concurrency_limits": LIMITS, **config},
    }
    # Dagster's own test launcher: it records what the coordinator hands it (the decision under test)
    launcher = {"module": "dagster._core.test_utils", "class": "MockedRunLauncher"}
    return dg.instance_for_test(overrides={"run_coordinator": coordinator, "run_launcher": launcher})


def _submit(instance, execution_id):
    from dagster._core.remote_origin import (
        RegisteredCodeLocationOrigin,
        RemoteJobOrigin,
        RemoteRepositoryOrigin,
    )
    from dagster._core.run_coordinator import SubmitRunContext
    from dagster._core.test_utils import create_run_for_test

    origin = RemoteJobOrigin(
        RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("noetl"), "__repository__"), "noetl_job"
    )
    run = create_run_for_test(instance, job_name="noetl_job", tags={"noetl/execution_id": execution_id},
                              remote_job_origin=origin)  # fmt: skip
    # what instance.submit_run does once it has checked the run's code origins (a test run has none)
    return instance.run_coordinator.submit_run(SubmitRunContext(run, workspace=None))


def _events(instance, run_id):
    return [r.dagster_event.event_type_value for r in instance.all_logs(run_id) if r.dagster_event]


def test_a_run_the_queue_would_start_now_is_launched_at_once(restore_loop_time):
    """Issue 35: no wait for the queue daemon (dequeue_interval_seconds) when nothing stands before
    the run; the queue's limits still hold: a second run of the same execution, a run over
    max_concurrent_runs and a run behind a queued one are enqueued."""
    with _instance() as instance:
        launched = instance.run_launcher
        first = _submit(instance, "exec-a")
        assert first.status == dg.DagsterRunStatus.STARTING and launched.did_run_launch(first.run_id)
        assert "PIPELINE_ENQUEUED" not in _events(instance, first.run_id)  # the queue daemon never sees it
        same = _submit(instance, "exec-a")  # the tag limit: one run per execution
        assert same.status == dg.DagsterRunStatus.QUEUED and not launched.did_run_launch(same.run_id)
        other = _submit(instance, "exec-b")  # a run is queued before it: the queue's order
        assert other.status == dg.DagsterRunStatus.QUEUED
        assert instance.run_coordinator.launched_at_once == 1 and instance.run_coordinator.enqueued == 2


def test_max_concurrent_runs_holds_for_runs_launched_at_once(restore_loop_time):
    with _instance() as instance:
        runs = [_submit(instance, f"exec-{i}") for i in range(3)]
        assert [r.status for r in runs] == [dg.DagsterRunStatus.STARTING] * 2 + [dg.DagsterRunStatus.QUEUED]


def test_launch_when_free_off_is_the_queue_as_before(restore_loop_time):
    with _instance(launch_when_free=False) as instance:
        run = _submit(instance, "exec-a")
        assert run.status == dg.DagsterRunStatus.QUEUED and not instance.run_launcher.did_run_launch(
            run.run_id
        )


def test_the_coordinator_caches_the_daemon_instance_checks(monkeypatch, restore_loop_time):
    """Issue 35: the run storage's schema checks (a catalog reflection each) are asked once in the
    daemon, not on every read and status event of each launch (tests/dagster/test_schema_checks.py)."""
    from tests.dagster.test_schema_checks import counting_checks

    asked = counting_checks(monkeypatch)
    with _instance() as instance:
        _submit(instance, "exec-a")  # the first submission asks (and remembers)
        asked.clear()
        for i in range(3):  # each: the queue's checks, the launch, STARTING
            _submit(instance, f"exec-{i}")
        assert asked == []
