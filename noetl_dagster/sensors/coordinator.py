"""A QueuedRunCoordinator whose instance also shortens the sensor daemon's loop (issue 19 §3).

Dagster's sensor daemon evaluates sensors at most every ``MIN_INTERVAL_LOOP_TIME`` seconds
(5, a module constant in ``dagster._daemon.sensor``), whatever a sensor's
``minimum_interval_seconds``: a detached request waited 0-5 s for the router sensor to see
it. The daemon process loads no user code, but it does build the instance's run coordinator
from ``dagster.yaml``; this one sets the loop time there (``sensor_loop_seconds``, default 1).
It relies on a private constant: tests/deploy/test_coordinator.py fails if Dagster renames it.

    run_coordinator:
      module: noetl_dagster.sensors.coordinator
      class: NoetlRunCoordinator
      config: {sensor_loop_seconds: 1, max_concurrent_runs: 8, dequeue_interval_seconds: 1, ...}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster import Field, IntSource
from dagster._core.run_coordinator.queued_run_coordinator import QueuedRunCoordinator
from dagster._serdes import ConfigurableClassData

DEFAULT_SENSOR_LOOP_SECONDS = 1


def set_sensor_loop_seconds(seconds: int) -> None:
    import dagster._daemon.sensor as sensor_daemon  # the daemon's module, only where it runs

    if not hasattr(sensor_daemon, "MIN_INTERVAL_LOOP_TIME"):
        raise RuntimeError("dagster._daemon.sensor.MIN_INTERVAL_LOOP_TIME is gone: NoetlRunCoordinator needs an update")
    sensor_daemon.MIN_INTERVAL_LOOP_TIME = max(1, int(seconds))


class NoetlRunCoordinator(QueuedRunCoordinator):
    def __init__(self, *args: Any, sensor_loop_seconds: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sensor_loop_seconds = sensor_loop_seconds or DEFAULT_SENSOR_LOOP_SECONDS
        set_sensor_loop_seconds(self.sensor_loop_seconds)

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {
            **super().config_type(),
            "sensor_loop_seconds": Field(
                IntSource, is_required=False, description="The sensor daemon's loop time (Dagster's default: 5 s)."
            ),
        }

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> NoetlRunCoordinator:
        base = super().from_config_value(inst_data, {k: v for k, v in config_value.items() if k != "sensor_loop_seconds"})
        base.sensor_loop_seconds = config_value.get("sensor_loop_seconds") or DEFAULT_SENSOR_LOOP_SECONDS
        set_sensor_loop_seconds(base.sensor_loop_seconds)
        return base
