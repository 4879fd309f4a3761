"""One failure location across Dagster, ``explain``, the execution page and ``diff`` (issue 42): the
playbook line of the raising line of a python task's inline code (engine/error_location.py)."""

from __future__ import annotations

import json

import dagster as dg
from click.testing import CliRunner

from noetl_analytics.execution_view import ExecutionViews
from noetl_dagster.commands.main import cli
from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.translator import compile_playbooks

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: tenth_line, path: tests/tenth_line}
workload: {fail: true}
workflow:
  - step: start
    tool: {kind: noop}
    next: {arcs: [{step: compute}]}
  - step: compute
    tool:
      - crunch:
          kind: python
          input: {fail: "{{ workload.fail }}"}
          code: |
            a = 1
            b = 2
            c = a + b
            d = c * 2
            e = d - 1
            f = e + a
            g = f * b
            h = g + c
            total = h
            if fail: raise ValueError("tenth line")
            result = {"total": total}
"""


def test_a_python_error_is_placed_at_its_raising_line_by_dagster_explain_the_page_and_diff(
    dagster_data, tmp_path
):
    f = tmp_path / "tenth_line.yaml"
    f.write_text(PLAYBOOK)
    raising = PLAYBOOK.splitlines().index('            if fail: raise ValueError("tenth line")') + 1
    step_line = PLAYBOOK.splitlines().index("  - step: compute") + 1
    assert raising - PLAYBOOK.splitlines().index("          code: |") - 1 == 10  # the code block's 10th line
    where = f"{f}:{raising}"
    res = NoetlResource(data_dir=str(dagster_data))
    job = compile_playbooks([f], include_sensor=False, resource=res).definitions.resolve_job_def("tenth_line")
    with dg.instance_for_test() as instance:
        bad = job.execute_in_process(instance=instance, raise_on_error=False)
        good = job.execute_in_process(
            instance=instance, raise_on_error=False,
            run_config={"ops": {"noetl_start": {"config": {"workload": {"fail": False}}}}},
        )  # fmt: skip
    assert not bad.success and good.success
    # Dagster: the op's failure (headline and metadata)
    failure = bad.get_step_failure_events()[0].step_failure_data.user_failure_data
    assert failure.metadata["noetl/failed_at"].value == f"{f.name}:{raising}"  # relative to its folder
    assert f":{raising}: ValueError: tenth line" in failure.description.splitlines()[0]
    eid_bad, eid_good = (
        bad.dagster_run.tags["noetl/execution_id"],
        good.dagster_run.tags["noetl/execution_id"],
    )

    def noetl(*args: str) -> str:
        r = CliRunner().invoke(cli, [*args, "--data-dir", str(dagster_data)], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return r.output

    # explain: the failed run's error line
    assert f"error: ValueError: tenth line ({where})" in noetl("explain", eid_bad)
    # the page's data (what analytics/noetl_analytics/execution_app.js shows as "error: ... at FILE:LINE")
    views = ExecutionViews(open_event_store(None, data_dir=str(dagster_data)), data_dir=str(dagster_data))
    run = next(r for r in views.explain(eid_bad)["runs"] if r["step"] == "compute")
    assert (run["line"], run["error_line"]) == (step_line, raising)
    # diff of the good and the failed run: B's error at the same line
    d = json.loads(noetl("diff", eid_good, eid_bad, "--json"))["first"]
    assert d["step"] == "compute" and d["b_error_line"] == raising and d["a_error_line"] is None
    assert f"B error: ValueError: tenth line ({where})" in noetl("diff", eid_good, eid_bad)
