"""Issue 42 part 4: a step that failed while an unguarded arc routed the flow on completes the
execution (the spec: an arc that routes a failure handles it), so the Dagster run is green; but the
failure is in the catalog: run tags to filter on, a failed ``step_succeeded`` check (severity ERROR)
on each table the step stores, and an ERROR log line naming the raising line of the playbook."""

from __future__ import annotations

import logging
from pathlib import Path

import dagster as dg

from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.translator import compile_playbooks

TABLE = dg.AssetKey(["t", "divided"])  # the default key: namespace and name
PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: divide, path: tests/divide}}
workload: {{by: 0}}
workflow:
  - step: start
    tool:
      - divide:
          kind: python
          input: {{by: "{{{{ workload.by }}}}"}}
          code: |
            def main(by):
                return [{{"x": 1 / by}}]
      - save:
          kind: parquet
          uri: noetl://demo/examples/t/dataset/divided
          data: "{{{{ divide }}}}"
    next:
      arcs:
        - step: end{guard}
  - step: end
    tool: {{kind: noop}}
"""


def _defs(tmp_path: Path, data_dir: Path, guard: str = "") -> dg.Definitions:
    f = tmp_path / "divide.yaml"
    f.write_text(PLAYBOOK.format(guard=guard))
    res = NoetlResource(data_dir=str(data_dir), tenant="demo", project="examples")
    return compile_playbooks([f], include_sensor=False, resource=res).definitions


def _step_checks(instance: dg.DagsterInstance, run_id: str) -> list[dg.AssetCheckEvaluation]:
    return [
        rec.dagster_event.event_specific_data
        for rec in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
        if rec.dagster_event.event_specific_data.check_name == "step_succeeded"
    ]


def test_a_routed_failure_is_a_green_run_with_the_failure_in_the_catalog(dagster_data, tmp_path):
    defs = _defs(tmp_path, dagster_data)
    assert dg.AssetCheckKey(TABLE, "step_succeeded") in defs.resolve_asset_graph().asset_check_keys
    with dg.instance_for_test() as instance:
        res = defs.resolve_job_def("divide").execute_in_process(instance=instance)
        assert res.success  # the spec: the arc handled the failure, the execution completed
        tags = instance.get_run_by_id(res.run_id).tags
        assert tags["noetl/status"] == "completed"
        assert tags["noetl/failed_steps"] == "start" and tags["noetl/has_failed_steps"] == "true"
        (ev,) = _step_checks(instance, res.run_id)
        assert ev.asset_key == TABLE and not ev.passed and ev.severity == dg.AssetCheckSeverity.ERROR
        assert "ZeroDivisionError" in ev.description and "divide.yaml:" in ev.description
        assert ev.metadata["noetl/failed_step"].value == "start"
        errors = [
            r.user_message
            for r in instance.all_logs(res.run_id)
            if r.level == logging.ERROR and "an arc routed the failure" in (r.user_message or "")
        ]
        assert len(errors) == 1 and "ZeroDivisionError" in errors[0]
        assert "return [{'x': 1 / by}]" in errors[0] or "1 / by" in errors[0]  # the raising line
        assert "divide.yaml:" in errors[0]
        # the Checks tab (the check alone) reads the same verdict off the newest execution
        only = dg.define_asset_job("step_check", selection=dg.AssetSelection.checks_for_assets(TABLE))
        job = dg.Definitions.merge(defs, dg.Definitions(jobs=[only])).resolve_job_def("step_check")
        alone = job.execute_in_process(instance=instance, raise_on_error=False)
        (again,) = [e for e in alone.get_asset_check_evaluations() if e.check_name == "step_succeeded"]
        assert not again.passed and "ZeroDivisionError" in again.description


def test_a_step_that_succeeds_passes_its_check_and_tags_nothing(dagster_data, tmp_path):
    defs = _defs(tmp_path, dagster_data)
    with dg.instance_for_test() as instance:
        job = defs.resolve_job_def("divide")
        res = job.execute_in_process(instance=instance, run_config=_workload(by=2))
        assert res.success
        tags = instance.get_run_by_id(res.run_id).tags
        assert "noetl/failed_steps" not in tags and "noetl/has_failed_steps" not in tags
        (ev,) = _step_checks(instance, res.run_id)
        assert ev.passed and ev.asset_key == TABLE


def test_an_unrouted_failure_still_fails_the_run(dagster_data, tmp_path):
    guard = "\n          when: \"{{ event.name == 'call.done' }}\""
    defs = _defs(tmp_path, dagster_data, guard=guard)
    with dg.instance_for_test() as instance:
        res = defs.resolve_job_def("divide").execute_in_process(instance=instance, raise_on_error=False)
        assert not res.success
        assert instance.get_run_by_id(res.run_id).tags["noetl/status"] == "failed"


def _workload(**kw: object) -> dict:
    return {"ops": {"noetl_start": {"config": {"workload": kw}}}}


ROUTED_ON = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: fallback, path: tests/fallback}
workflow:
  - step: start
    tool:
      - fetch:
          kind: python
          code: |
            def main():
                raise RuntimeError("upstream down")
    next:
      arcs:
        - step: store
  - step: store
    tool:
      - save:
          kind: parquet
          uri: noetl://demo/examples/t/dataset/fallback
          data: [{x: 1}]
"""


def test_a_materialize_that_routed_a_failure_on_is_green_but_tagged_and_logged(dagster_data, tmp_path):
    f = tmp_path / "fallback.yaml"
    f.write_text(ROUTED_ON)
    res = NoetlResource(data_dir=str(dagster_data), tenant="demo", project="examples")
    defs = compile_playbooks([f], include_sensor=False, resource=res).definitions
    with dg.instance_for_test() as instance:
        r = defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=instance)
        assert r.success  # the table was stored (by the step the arc led to)
        tags = instance.get_run_by_id(r.run_id).tags
        assert tags["noetl/failed_steps"] == "start" and tags["noetl/has_failed_steps"] == "true"
        errors = [
            rec.user_message
            for rec in instance.all_logs(r.run_id)
            if rec.level == logging.ERROR and "an arc routed the failure" in (rec.user_message or "")
        ]
        assert (
            len(errors) == 1 and "RuntimeError: upstream down" in errors[0] and "fallback.yaml:" in errors[0]
        )


def test_the_failed_check_keeps_the_traceback_lines_and_names_the_file_from_the_playbook_root(
    dagster_data, tmp_path
):
    """The Checks tab shows a check's description as one paragraph: the traceback is a markdown code
    block in the check's metadata (line by line), and ``noetl/failed_at`` names the file relative to
    the folder the code location loaded (``sub/divide.yaml:LINE``), not an absolute path."""
    root = tmp_path / "playbooks"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "divide.yaml").write_text(PLAYBOOK.format(guard=""))
    res = NoetlResource(data_dir=str(dagster_data), tenant="demo", project="examples")
    defs = compile_playbooks([root], include_sensor=False, resource=res).definitions
    line = PLAYBOOK.splitlines().index('                return [{{"x": 1 / by}}]') + 1
    with dg.instance_for_test() as instance:
        res_ = defs.resolve_job_def("divide").execute_in_process(instance=instance)
        (ev,) = _step_checks(instance, res_.run_id)
    assert ev.metadata["noetl/failed_at"].value == f"sub/divide.yaml:{line}"
    error = ev.metadata["noetl/error"]
    assert isinstance(error, dg.MarkdownMetadataValue)
    lines = error.value.splitlines()
    assert lines[0] == "```" and lines[-1] == "```"
    assert "Traceback (your code):" in lines and f'  File "sub/divide.yaml", line {line}, in main' in lines
    assert "    return [{'x': 1 / by}]" in lines or '    return [{"x": 1 / by}]' in lines
    assert isinstance(ev.metadata["noetl/traceback"], dg.MarkdownMetadataValue)
    assert "\n" not in ev.description and "sub/divide.yaml:" in ev.description
