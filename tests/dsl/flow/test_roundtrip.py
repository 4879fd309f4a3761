"""Round trips: a flow compiled to YAML runs like the flow itself; a flow and a hand-written
playbook of the same workflow give the same events, step by step."""

from __future__ import annotations

import json
from pathlib import Path

import flow_seed_examples as S
import pytest
import yaml
from click.testing import CliRunner
from flow_helpers import python_tasks

from noetl_dagster.commands.main import cli
from noetl_dagster.dsl import load_playbook, load_playbook_dict
from noetl_dagster.dsl.flow import load_flow, load_flow_playbook, playbook_yaml
from noetl_dagster.runners.local import run_playbook

STATUS_A = "@task A (- {kind: python, code: \"result = {'status': input['status'], 'n': 2}\"} -);\n"

FLOWS = {
    "merge": python_tasks(["A", "C"], "result = {'{name}': 1}")
    + python_tasks(["B"], "result = input")
    + S.MERGE_OPERATOR.flow,
    "guards in a subflow": STATUS_A
    + python_tasks(["B", "C", "D", "E"], "result = {'{name}': input}")
    + S.GUARDS_IN_SUBFLOW,
    "iterated subflow": "@task A (- {kind: python, code: 'result = [1, 2]'} -);\n"
    + python_tasks(["B", "C", "D"], "result = [input, '{name}']")
    + python_tasks(["E"], "result = input")
    + S.ITERATE_SUBFLOW,
    "literal and declared subflow": python_tasks(["A", "B", "C", "D"], "result = {'{name}': input}")
    + "@task X {\n  A\n  B → C\n};\n<- customer: C123 -> → X → D",
    "resources": python_tasks(["inference"], "result = {'n': len(input)}")
    + "<data/dataset.json> → inference → <out/result.json>",
}


def _same_run(a, b) -> None:
    ja, jb = a.to_json(), b.to_json()
    ja.pop("execution_id"), jb.pop("execution_id")
    assert ja == jb


@pytest.mark.parametrize("name", list(FLOWS))
def test_yaml_runs_like_the_flow(tmp_path, data_dir, name):
    text = FLOWS[name]
    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    (src / "data" / "dataset.json").write_text(json.dumps([1, 2, 3]))
    flow_file = src / "example.flow"
    flow_file.write_text(text)
    # the YAML goes to another folder: relative resource paths are rewritten for it
    out = tmp_path / "compiled" / "example.yaml"
    res = CliRunner().invoke(cli, ["flow", "compile", str(flow_file), "--format", "yaml", "-o", str(out)])
    assert res.exit_code == 0, res.output
    workload = {"status": 2}
    direct = run_playbook(load_flow_playbook(flow_file), workload, data_dir=data_dir)
    from_yaml = run_playbook(load_playbook(out), workload, data_dir=data_dir)
    assert direct.status == "completed"
    _same_run(direct, from_yaml)


def test_compiled_yaml_is_the_compiled_dict(tmp_path):
    flow_file = tmp_path / "g.flow"
    flow_file.write_text(FLOWS["guards in a subflow"])
    assert yaml.safe_load(playbook_yaml(load_flow(flow_file))) == load_flow(flow_file)


# -- a hand-written playbook of the same workflow ------------------------------------------------

SQUARES_FLOW = """\
@task fetch (- {kind: python, code: "result = [1, 2, 3]"} -);
@task square (- {kind: python, code: "result = input * input"} -);
@task total (- {kind: python, code: "result = {'total': sum(input)}"} -);
@task count (- {kind: python, code: "result = {'count': len(input)}"} -);
fetch → * square :squares → total;
:squares → count
"""

# how a person writes the same workflow in YAML: a routing start, one step per task,
# arcs that pass each output on, a loop for `*` and a join at the end
SQUARES_PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: squares, path: tests/squares}
workflow:
  - step: start
    next:
      arcs:
        - step: fetch_1
          args: {input: "{{ workload }}"}
  - step: fetch_1
    tool:
      - fetch: {kind: python, code: "result = [1, 2, 3]", input: {input: "{{ args.input }}"}}
    next:
      arcs:
        - step: square_2
          args: {sequence: "{{ outcome.result }}"}
  - step: square_2
    loop: {in: "{{ args.sequence }}", iterator: value}
    tool:
      - square: {kind: python, code: "result = input * input", input: {input: "{{ iter.value }}"}}
    next:
      spec: {mode: inclusive}
      arcs:
        - step: total_3
          args: {input: "{{ outcome.result.results }}"}
        - step: count_4
          args: {input: "{{ outcome.result.results }}"}
  - step: total_3
    tool:
      - total: {kind: python, code: "result = {'total': sum(input)}", input: {input: "{{ args.input }}"}}
    next:
      arcs: [{step: done, args: {input: "{{ outcome.result }}"}}]
  - step: count_4
    tool:
      - count: {kind: python, code: "result = {'count': len(input)}", input: {input: "{{ args.input }}"}}
    next:
      arcs: [{step: done, args: {input: "{{ outcome.result }}"}}]
  - step: done
    tool:
      - output: {kind: python, code: "result = [a['input'] for a in args]", input: {args: "{{ args }}"}}
"""


def _trace_by_step(events) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in events:
        if e.step:
            out.setdefault(e.step, []).append(e.name)
    return out


def test_flow_and_handwritten_playbook_give_the_same_trace(tmp_path, data_dir):
    flow_file = tmp_path / "squares.flow"
    flow_file.write_text(SQUARES_FLOW)
    flow_events: list = []
    yaml_events: list = []
    by_flow = run_playbook(load_flow_playbook(flow_file), data_dir=data_dir, listeners=[flow_events.append])
    by_hand = run_playbook(
        load_playbook_dict(yaml.safe_load(SQUARES_PLAYBOOK)),
        data_dir=data_dir,
        listeners=[yaml_events.append],
    )
    assert by_flow.status == by_hand.status == "completed"
    tasks = ["fetch_1", "square_2", "total_3", "count_4"]
    flow_trace, hand_trace = _trace_by_step(flow_events), _trace_by_step(yaml_events)
    for step in tasks:
        assert flow_trace[step] == hand_trace[step], step
    assert flow_trace["square_2"].count("loop.iteration.done") == 3
    assert {s: by_flow.results[s] for s in tasks} == {s: by_hand.results[s] for s in tasks}
    assert by_flow.results["end"] == by_hand.results["done"] == [{"total": 14}, {"count": 3}]
    # the workflow-level events are the same too
    names = lambda evs: [e.name for e in evs if not e.step]  # noqa: E731
    assert names(flow_events) == names(yaml_events)


def test_the_yaml_of_a_flow_validates_from_the_command_line(tmp_path):
    flow_file = tmp_path / "squares.flow"
    flow_file.write_text(SQUARES_FLOW)
    out = tmp_path / "squares.yaml"
    runner = CliRunner()
    assert runner.invoke(cli, ["flow", "compile", str(flow_file), "-o", str(out)]).exit_code == 0
    res = runner.invoke(cli, ["validate", str(out)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["run", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["results"]["end"] == [{"total": 14}, {"count": 3}]


def test_a_flow_file_path_is_kept_as_the_source(tmp_path):
    flow_file = tmp_path / "squares.flow"
    flow_file.write_text(SQUARES_FLOW)
    pb = load_flow_playbook(flow_file)
    assert pb.source_file == str(Path(flow_file).resolve())
    assert pb.metadata.name == "squares" and pb.metadata.path == "flows/squares"
