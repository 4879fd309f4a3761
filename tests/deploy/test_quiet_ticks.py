"""A quiet ``dagster-daemon``: the sensor daemon's two INFO lines per tick of our sensors
(``Checking for new runs for sensor: noetl_router``, ``Sensor noetl_router skipped: no work to route``)
are DEBUG once NoetlRunCoordinator is the instance's coordinator; another sensor's lines stay INFO."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from noetl_dagster.sensors.quiet_ticks import SENSOR_DAEMON_LOGGER, IdleTickFilter

REPO = Path(__file__).resolve().parents[2]
DEFS = """\
import os
import dagster as dg
import pytest
from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.translator import compile_playbooks

@dg.sensor(job_name="hello_dagster", minimum_interval_seconds=1, default_status=dg.DefaultSensorStatus.RUNNING)
def other_sensor():
    return dg.SkipReason("nothing new")

defs = dg.Definitions.merge(
    compile_playbooks([os.environ["QT_PLAYBOOK"]], sensor_interval_seconds=1,
                      resource=NoetlResource(data_dir=os.environ["QT_DATA"])).definitions,
    dg.Definitions(sensors=[other_sensor]),
)
"""
DAGSTER_YAML = """\
telemetry: {enabled: false}
run_coordinator:
  module: noetl_dagster.sensors.coordinator
  class: NoetlRunCoordinator
  config: {sensor_loop_seconds: 0.2}
"""


@pytest.mark.slow
def test_the_daemon_logs_no_idle_lines_about_our_sensors(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    (tmp_path / "qt_defs.py").write_text(DEFS)
    env = {**os.environ, "DAGSTER_HOME": str(home), "QT_DATA": str(tmp_path / "noetl"),
           "QT_PLAYBOOK": str(REPO / "example_project/playbooks/hello_dagster.yaml"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}  # fmt: skip
    log_path = tmp_path / "daemon.log"
    with dg.DagsterInstance.from_config(str(home)) as instance, open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-m", "qt_defs"],
            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.time() + 120
            while time.time() < deadline and _router_ticks(instance) < 3:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert "DagsterInvariantViolationError" not in log_path.read_text(), log_path.read_text()[
                    -3000:
                ]
                time.sleep(1)
            router_ticks = _router_ticks(instance)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    text = log_path.read_text()
    assert router_ticks >= 3, text[-3000:]  # the router did tick (idle: SKIPPED ticks)
    assert "noetl_router" not in text, text[-3000:]
    assert "Checking for new runs for sensor: other_sensor" in text  # the daemon logs at INFO as before
    assert "Sensor other_sensor skipped: nothing new" in text


def _router_ticks(instance: dg.DagsterInstance) -> int:
    states = [s for s in instance.all_instigator_state() if s.instigator_name == "noetl_router"]
    return sum(len(instance.get_ticks(s.instigator_origin_id, s.selector_id)) for s in states)


def test_the_filter_keeps_the_lines_at_debug_when_debug_is_on():
    logger = logging.getLogger(SENSOR_DAEMON_LOGGER)
    f = IdleTickFilter()

    def rec(msg: str) -> logging.LogRecord:
        return logger.makeRecord(logger.name, logging.INFO, __file__, 1, msg, None, None)

    before = logger.level
    try:
        logger.setLevel(logging.DEBUG)
        idle = rec("Sensor noetl_router skipped: no work to route (watching 0 execution(s); no problems)")
        assert f.filter(idle) and idle.levelno == logging.DEBUG
        logger.setLevel(logging.INFO)
        assert not f.filter(rec("Checking for new runs for sensor: noetl_facts_exporter"))
        launch = rec("Launching run for noetl_router")
        assert f.filter(launch) and launch.levelno == logging.INFO
        assert f.filter(rec("Sensor my_sensor skipped: nothing"))
    finally:
        logger.setLevel(before)
