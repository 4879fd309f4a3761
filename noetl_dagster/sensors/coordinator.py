"""A QueuedRunCoordinator that launches a run at once when the queue would (issue 19 §3, issue 35).

Two waits stood between a detached request and its run (docs/capacity.md, "Request to start"):

* Dagster's sensor daemon evaluates sensors at most every ``MIN_INTERVAL_LOOP_TIME`` seconds (5,
  a module constant in ``dagster._daemon.sensor``), whatever a sensor's ``minimum_interval_seconds``.
  The daemon process loads no user code, but it does build the instance's run coordinator from
  ``dagster.yaml``; this one sets the loop time there (``sensor_loop_seconds``, default 1; a
  fraction is allowed: with a 1 s sensor interval, a 1 s loop ticks the sensor every 1 *or 2* s,
  because the sensor's last start is always a little under a second old when the loop comes back).
  It relies on a private constant: tests/deploy/test_coordinator.py fails if Dagster renames it.
* The queue daemon starts queued runs every ``dequeue_interval_seconds`` (whole seconds, polled
  at 0.5 s steps): 0.5-1.5 s more per run. With ``launch_when_free`` (default on) a submitted run
  that the queue would start right now -- nothing queued before it, fewer than
  ``max_concurrent_runs`` in progress, no ``tag_concurrency_limits`` rule at its limit (Dagster's
  own ``TagConcurrencyLimitsCounter``) -- is launched in ``submit_run``, the way Dagster's
  ``DefaultRunCoordinator`` launches (``instance.launch_run``: STARTING, then the run launcher).
  Anything else is enqueued as before, and the queue daemon starts it in order.
* The backfill daemon looks for new backfills every 30 s (``DEFAULT_DAEMON_INTERVAL_SECONDS`` in
  ``dagster._daemon.controller``): a backfill waited 0-30 s for its first run. ``backfill_loop_seconds``
  (issue 42) sets that loop time; each loop is one query for the backfills in progress.

It also keeps Dagster's migration scripts read once per process (``zygote.cache_dagster_migrations``)
and the run storage's schema checks answered once per instance (``zygote.cache_schema_checks``: a
catalog reflection on every run record read and run status event, three of them per launch).

The check and the launch are not one transaction with the queue daemon's: a run the queue daemon
starts in the same instant may put one run over a limit. Submissions of this process are
serialized (one lock), and the router submits one execution's runs from one sensor tick.

    run_coordinator:
      module: noetl_dagster.sensors.coordinator
      class: NoetlRunCoordinator
      config: {sensor_loop_seconds: 0.2, launch_when_free: true, max_concurrent_runs: 8, ...}
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from dagster import BoolSource, Field
from dagster._core.run_coordinator.base import SubmitRunContext
from dagster._core.run_coordinator.queued_run_coordinator import QueuedRunCoordinator
from dagster._core.storage.dagster_run import ACTIVE_RUN_STATUSES, DagsterRun, DagsterRunStatus, RunsFilter
from dagster._serdes import ConfigurableClassData
from dagster._utils.tags import TagConcurrencyLimitsCounter

from noetl_dagster.sensors.quiet_ticks import quiet_idle_ticks
from noetl_dagster.sensors.zygote import cache_dagster_migrations, cache_schema_checks

DEFAULT_SENSOR_LOOP_SECONDS = 1.0
MIN_SENSOR_LOOP_SECONDS = 0.05
OUR_KEYS = ("sensor_loop_seconds", "launch_when_free", "backfill_loop_seconds")
MIN_BACKFILL_LOOP_SECONDS = 0.5


def set_sensor_loop_seconds(seconds: float) -> None:
    import dagster._daemon.sensor as sensor_daemon  # the daemon's module, only where it runs

    if not hasattr(sensor_daemon, "MIN_INTERVAL_LOOP_TIME"):
        raise RuntimeError(
            "dagster._daemon.sensor.MIN_INTERVAL_LOOP_TIME is gone: NoetlRunCoordinator needs an update"
        )
    sensor_daemon.MIN_INTERVAL_LOOP_TIME = max(MIN_SENSOR_LOOP_SECONDS, float(seconds))


def set_backfill_loop_seconds(seconds: float) -> None:
    """The backfill daemon's loop time (Dagster: 30 s, ``DEFAULT_DAEMON_INTERVAL_SECONDS``, which its
    loop reads when it starts; the legacy non-sensor auto-materialize daemon's default reads it too)."""
    import dagster._daemon.controller as controller  # the daemon's module, only where it runs

    if not hasattr(controller, "DEFAULT_DAEMON_INTERVAL_SECONDS"):
        raise RuntimeError(
            "dagster._daemon.controller.DEFAULT_DAEMON_INTERVAL_SECONDS is gone: NoetlRunCoordinator needs an update"
        )
    controller.DEFAULT_DAEMON_INTERVAL_SECONDS = max(MIN_BACKFILL_LOOP_SECONDS, float(seconds))


class NoetlRunCoordinator(QueuedRunCoordinator):
    def __init__(
        self,
        *args: Any,
        sensor_loop_seconds: float | None = None,
        launch_when_free: bool = True,
        backfill_loop_seconds: float | None = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self._configure(sensor_loop_seconds, launch_when_free, backfill_loop_seconds)

    def _configure(
        self,
        sensor_loop_seconds: float | None,
        launch_when_free: bool | None,
        backfill_loop_seconds: float | None = None,
    ) -> None:
        self.sensor_loop_seconds = float(sensor_loop_seconds or DEFAULT_SENSOR_LOOP_SECONDS)
        self.launch_when_free = True if launch_when_free is None else bool(launch_when_free)
        self._submit_lock = threading.Lock()
        self.launched_at_once = 0  # counters for tests and benchmarks
        self.enqueued = 0
        set_sensor_loop_seconds(self.sensor_loop_seconds)
        self.backfill_loop_seconds = float(backfill_loop_seconds) if backfill_loop_seconds else None
        if self.backfill_loop_seconds:  # unset: Dagster's 30 s
            set_backfill_loop_seconds(self.backfill_loop_seconds)
        cache_dagster_migrations()  # the daemon opens each run's event log (SQLite instance) as it starts it
        quiet_idle_ticks()  # the daemon's two INFO lines per idle tick of our sensors: DEBUG

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {
            **super().config_type(),
            "sensor_loop_seconds": Field(
                float, is_required=False, description="The sensor daemon's loop time (Dagster's default: 5 s)."
            ),
            "backfill_loop_seconds": Field(
                float, is_required=False,
                description="The backfill daemon's loop time (Dagster's default: 30 s): how long a backfill may wait to start.",
            ),
            "launch_when_free": Field(
                BoolSource, is_required=False,
                description="Launch a submitted run at once when the queue would start it now (default true).",
            ),
        }  # fmt: skip

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]
    ) -> NoetlRunCoordinator:
        base = super().from_config_value(
            inst_data, {k: v for k, v in config_value.items() if k not in OUR_KEYS}
        )
        base._configure(config_value.get("sensor_loop_seconds"), config_value.get("launch_when_free"),
                        config_value.get("backfill_loop_seconds"))  # fmt: skip
        return base

    # -- submitting --------------------------------------------------------------------------
    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        run = context.dagster_run
        cache_schema_checks(self._instance)  # the daemon's instance: its run storage's schema checks, once
        if not self.launch_when_free or run.status != DagsterRunStatus.NOT_STARTED:
            return self._enqueue(context)
        with self._submit_lock:
            if not self._queue_would_start(run):
                return self._enqueue(context)
            self.launched_at_once += 1
            # DefaultRunCoordinator's launch: STARTING, then the run launcher; never QUEUED, so the
            # queue daemon does not see it
            return self._instance.launch_run(run.run_id, context.workspace)

    def _enqueue(self, context: SubmitRunContext) -> DagsterRun:
        self.enqueued += 1
        return super().submit_run(context)

    def _queue_would_start(self, run: DagsterRun) -> bool:
        """What the queue daemon would decide for ``run`` now, were it first in the queue."""
        if run.run_op_concurrency and run.run_op_concurrency.all_pools:
            return False  # pools and op slots: the queue daemon's own accounting decides
        instance = self._instance
        if instance.get_runs_count(RunsFilter(statuses=[DagsterRunStatus.QUEUED])):
            return False  # runs are waiting: they go first, in the queue's order
        config = (
            instance.get_concurrency_config().run_queue_config or self.get_run_queue_config()
        )  # as the daemon
        in_progress = instance.get_runs(RunsFilter(statuses=ACTIVE_RUN_STATUSES))
        if config.max_concurrent_runs != -1 and len(in_progress) >= config.max_concurrent_runs:
            return False
        limits = list(config.tag_concurrency_limits or [])
        return not (limits and TagConcurrencyLimitsCounter(limits, list(in_progress)).is_blocked(run))
