"""The job the Celery workers load (by this module's path) and the test launches."""

from __future__ import annotations

from pathlib import Path

from noetl_dagster.translator import build_playbook_definitions

PLAYBOOK = Path(__file__).with_name("fanout.yaml")


def fanout_job():
    defs = build_playbook_definitions([PLAYBOOK], include_sensor=False)
    return defs.get_job_def("celery_fanout")
