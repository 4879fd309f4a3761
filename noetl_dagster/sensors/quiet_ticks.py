"""The sensor daemon's idle lines about our sensors at DEBUG.

Dagster's sensor daemon logs two INFO lines per sensor tick, whatever the tick did: ``Checking for new
runs for sensor: noetl_router`` and ``Sensor noetl_router skipped: no work to route ...`` (or ``No run
requests returned for ...``). The router ticks every second or so (docs/capacity.md), so a quiet
``dagster dev`` scrolled two lines a second. For sensors named ``noetl_*`` those lines become DEBUG
records (shown with ``--log-level debug``); a tick that launches still logs Dagster's ``Launching run
for ...`` at INFO, and the skip reason stays on the tick in the UI. Other sensors' lines are untouched.

``NoetlRunCoordinator`` installs it: the coordinator is built in the daemon process from dagster.yaml.
"""

from __future__ import annotations

import logging
import re

SENSOR_DAEMON_LOGGER = "dagster.daemon.SensorDaemon"
OUR_SENSOR = r"noetl_\w+"
IDLE_LINES = re.compile(
    rf"^(?:Checking for new runs for sensor: {OUR_SENSOR}"
    rf"|Sensor {OUR_SENSOR} skipped: .*"
    rf"|No run requests returned for {OUR_SENSOR}, skipping)$",
    re.DOTALL,
)


class IdleTickFilter(logging.Filter):
    """Demotes the daemon's per-tick lines about ``noetl_*`` sensors to DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not IDLE_LINES.match(record.getMessage()):
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def quiet_idle_ticks() -> None:
    """Install the filter on the sensor daemon's logger (once per process)."""
    logger = logging.getLogger(SENSOR_DAEMON_LOGGER)
    if not any(isinstance(f, IdleTickFilter) for f in logger.filters):
        logger.addFilter(IdleTickFilter())
