"""The run coordinator of example_project/dagster.yaml shortens the sensor daemon's loop (issue 19 §3)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import dagster._daemon.sensor as sensor_daemon
import pytest
import yaml

from noetl_dagster.sensors.coordinator import NoetlRunCoordinator

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def restore_loop_time():
    before = sensor_daemon.MIN_INTERVAL_LOOP_TIME
    yield
    sensor_daemon.MIN_INTERVAL_LOOP_TIME = before


def test_example_dagster_yaml_sets_a_one_second_sensor_loop(restore_loop_time):
    sensor_daemon.MIN_INTERVAL_LOOP_TIME = 5  # Dagster's own value
    settings = yaml.safe_load((REPO / "example_project" / "dagster.yaml").read_text())
    with dg.instance_for_test(overrides={"run_coordinator": settings["run_coordinator"]}) as instance:
        coordinator = instance.run_coordinator
        assert isinstance(coordinator, NoetlRunCoordinator)
        assert coordinator.sensor_loop_seconds == 1 and sensor_daemon.MIN_INTERVAL_LOOP_TIME == 1
        # the queue's own settings still apply
        assert coordinator.dequeue_interval_seconds == 1 and coordinator.get_run_queue_config().max_concurrent_runs == 8


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
            assert isinstance(coordinator, NoetlRunCoordinator) and sensor_daemon.MIN_INTERVAL_LOOP_TIME == 1
            assert coordinator.dequeue_interval_seconds == 1
            limits = coordinator.get_run_queue_config().tag_concurrency_limits
            assert [(t["key"], t["limit"]) for t in limits] == [("noetl/execution_id", 1)]
