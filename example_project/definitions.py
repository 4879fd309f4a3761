"""The example code location: ``dagster dev -m example_project.definitions`` (or ``make dev``).

Definitions come from the defs folder (``defs/playbooks/defs.yaml``: the NoETL
playbooks component over ``playbooks/``), merged with the event-log facts
definitions (exporter sensor, cost rollups). Both read one NoETL data home:
``$NOETL_DAGSTER_HOME``, else ``example_project/.noetl``.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

PROJECT_DIR = Path(__file__).resolve().parent
PLAYBOOKS_DIR = PROJECT_DIR / "playbooks"
# one data home for the playbooks, the router sensor and the facts exporter (run workers inherit it too)
os.environ.setdefault("NOETL_DAGSTER_HOME", str(PROJECT_DIR / ".noetl"))


def _facts_definitions() -> dg.Definitions | None:
    try:
        from noetl_dagster.sensors.facts import build_facts_definitions  # noqa: PLC0415
    except ImportError:  # analytics extras not installed
        return None
    return build_facts_definitions()


@dg.definitions
def defs() -> dg.Definitions:
    playbooks = dg.load_from_defs_folder(path_within_project=PROJECT_DIR)
    facts = _facts_definitions()
    return dg.Definitions.merge(playbooks, facts) if facts is not None else playbooks
