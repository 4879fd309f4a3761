"""A scheduled run records its nominal time on the execution request (lineage reads it)."""

from __future__ import annotations

import dagster as dg
import pytest
from dagster_helpers import EXAMPLES

from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.translator import compile_playbooks


@pytest.mark.parametrize("tag", [".dagster/scheduled_execution_time", "dagster/scheduled_execution_time"])
def test_scheduled_run_carries_nominal_time(dagster_data, ephemeral_instance, tag):
    """Dagster's scheduler sets the hidden ``.dagster/`` tag (a real daemon tick: test_partitioned_schedules)."""
    loc = compile_playbooks([EXAMPLES / "nightly_report.yaml"], resource=NoetlResource(data_dir=str(dagster_data)),
                            include_sensor=False)  # fmt: skip
    (sched,) = loc.definitions.schedules
    request = sched.evaluate_tick(dg.build_schedule_context(scheduled_execution_time=None)).run_requests[0]
    job = loc.definitions.resolve_job_def(sched.job_name)
    nominal = "2026-11-21T02:00:00+00:00"
    res = job.execute_in_process(run_config=request.run_config, instance=ephemeral_instance,
                                 tags={tag: nominal})  # fmt: skip
    assert res.success
    store = open_event_store(None, data_dir=dagster_data)
    eid = res.dagster_run.tags.get("noetl/execution_id") or next(
        e.execution_id for e in store.executions(10) if e.playbook
    )
    req = next(e for e in store.read(eid) if e.name == "playbook.execution.requested")
    assert req.data["nominal_time"] == nominal


def test_unscheduled_run_has_no_nominal_time(dagster_data, ephemeral_instance):
    loc = compile_playbooks([EXAMPLES / "nightly_report.yaml"], resource=NoetlResource(data_dir=str(dagster_data)),
                            include_sensor=False)  # fmt: skip
    job = loc.definitions.resolve_job_def("nightly_report")
    res = job.execute_in_process(instance=ephemeral_instance)
    assert res.success
    store = open_event_store(None, data_dir=dagster_data)
    (info,) = [e for e in store.executions(10) if e.playbook]
    req = next(e for e in store.read(info.execution_id) if e.name == "playbook.execution.requested")
    assert "nominal_time" not in req.data
