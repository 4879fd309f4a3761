"""Issue 22.2: launching from the UI. The job's default run config is the playbook's workload
(the launchpad opens pre-filled and runs unchanged); a per-step job launched by hand fails
with a message naming the job to launch; a detached request keeps its own tenant/project for
every event and run of the execution."""

from __future__ import annotations

from dagster_helpers import EXAMPLES, events_of

from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.sensors.router import RouterCursor, instance_run_lookup, router_tick
from noetl_dagster.translator import compile_playbooks
from noetl_dagster.translator.runner import run_playbook_dagster


def _location(data, *names):
    return compile_playbooks([EXAMPLES / n for n in names], include_sensor=False,
                             resource=NoetlResource(data_dir=str(data), tenant="demo", project="examples"))  # fmt: skip


def test_launchpad_defaults_are_the_workload_and_run_unchanged(dagster_data, ephemeral_instance):
    loc = _location(dagster_data, "hello_dagster.yaml")
    job = loc.definitions.resolve_job_def("hello_dagster")
    start = "noetl_start"
    assert job.run_config_schema.config_type.fields  # typed
    default = job.run_config  # the "default" preset the launchpad opens with
    assert default == {"ops": {start: {"config": {"workload": {"name": "Dagster", "times": 3}}}}}
    res = job.execute_in_process(instance=ephemeral_instance, run_config=default)  # the pre-filled launch
    assert res.success
    eid = res.dagster_run.tags["noetl/execution_id"]
    done = {e.step: e.data.get("result") for e in events_of(dagster_data, eid) if e.name == "step.done"}
    assert done["done"] == {"said": 3, "last": "Hello, Dagster!"}


def test_a_per_step_job_launched_by_hand_names_the_job_to_launch(dagster_data, ephemeral_instance):
    loc = _location(dagster_data, "per_step_pipeline.yaml")
    job = loc.definitions.resolve_job_def("per_step_pipeline__step__combine")
    res = job.execute_in_process(instance=ephemeral_instance, raise_on_error=False)
    assert not res.success
    (failure,) = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"]
    err = failure.step_failure_data.error
    assert err.cls_name == "Failure" and "LookupError" not in err.message
    assert "Launch the job 'per_step_pipeline'" in err.message


def test_a_detached_request_keeps_its_tenant_and_project(dagster_data, ephemeral_instance):
    loc = _location(dagster_data, "hello_dagster.yaml")  # the code location runs as demo/examples
    eid = run_playbook_dagster(EXAMPLES / "hello_dagster.yaml", {"name": "acme"}, data_dir=dagster_data,
                               tenant="acme", project="billing", detach=True).execution_id  # fmt: skip
    tick = router_tick(
        loc.index, loc.index.resource.services(), instance_run_lookup(ephemeral_instance), RouterCursor()
    )
    (launch,) = tick.launches
    assert (launch.tags["noetl/tenant"], launch.tags["noetl/project"]) == ("acme", "billing")
    job = loc.definitions.resolve_job_def(launch.job_name)
    assert job.execute_in_process(instance=ephemeral_instance, tags=launch.tags).success
    evs = events_of(dagster_data, eid)
    assert any(e.name == "workflow.finished" for e in evs)
    assert {(e.tenant_id, e.project_id) for e in evs} == {("acme", "billing")}
