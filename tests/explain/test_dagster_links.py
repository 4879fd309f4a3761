"""Dagster runs link to their execution page and summarize what a region or loop op ran
(issue 36), on a real execute_in_process run of a playbook with a cycle and a loop."""

from __future__ import annotations

import dagster as dg
from conftest import PLAYBOOKS

from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.translator import compile_playbooks


def _metadata(result, step: str) -> dict:  # noqa: ANN001
    for node in result.job_def.nodes:
        if node.name.endswith(step):
            for ev in result.events_for_node(node.name):
                if ev.event_type_value == "STEP_OUTPUT" and ev.step_output_data.output_name == "result":
                    return {k: getattr(v, "value", v) for k, v in ev.step_output_data.metadata.items()}
    raise AssertionError(f"no result output for {step}")


def _logs(inst, result, step: str) -> list[str]:  # noqa: ANN001
    return [e.user_message or "" for e in inst.all_logs(result.run_id) if e.step_key == step]


def test_run_tags_link_to_the_page_and_ops_summarize_their_inside(tmp_path, monkeypatch):
    monkeypatch.setenv("NOETL_DASHBOARD_URL", "http://dash.example:8765/")
    data = tmp_path / "noetl"
    data.mkdir()
    res = NoetlResource(data_dir=str(data), tenant="acme", project="sales")
    loc = compile_playbooks(PLAYBOOKS / "explain_demo.yaml", resource=res, include_sensor=False)
    with dg.instance_for_test() as inst:
        result = loc.definitions.resolve_job_def("explain_demo").execute_in_process(
            instance=inst, run_config={"ops": {}}, raise_on_error=False)  # fmt: skip
        run = inst.get_run_by_id(result.run_id)
        eid = run.tags["noetl/execution_id"]
        assert run.tags["noetl/execution_url"] == f"http://dash.example:8765/executions/{eid}"
        assert run.tags["noetl/explain"] == f"noetl-dagster explain {eid}"
        md = _metadata(result, "cycle__spin")  # the cyclic region's one op
        assert md["noetl/step_runs"] == 3 and md["noetl/retries"] == 0
        assert md["noetl/summary"].startswith("3 step runs (spin x3)")
        assert md["noetl/execution_page"] == f"http://dash.example:8765/executions/{eid}"
        fan = _metadata(result, "fan__collect")  # the loop's collecting op
        assert fan["noetl/iterations"] == 4 and "4 loop iterations (4 ok, 0 failed)" in fan["noetl/summary"]
        assert any("4 loop iterations (4 ok, 0 failed)" in m for m in _logs(inst, result, "fan__collect"))
        assert any(m.startswith("spin: 3 step runs (spin x3)") for m in _logs(inst, result, "cycle__spin"))
