"""The compiler's output: a valid standard-form playbook whose steps and arcs follow the flow;
task resolution; the command line; the mermaid grammar check; resource formats."""

from __future__ import annotations

import json

import flow_seed_examples as S
import pytest
import yaml
from click.testing import CliRunner
from flow_helpers import python_tasks

from noetl_dagster.commands.main import cli
from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.dsl.flow import FlowCompileError, compile_flow, flow_to_mermaid, playbook_yaml
from noetl_dagster.dsl.flow.mermaid import check_state_diagram
from noetl_dagster.tools.flow import decode, encode, resource_format
from noetl_dagster.tools.registry import ToolError

MERGE = python_tasks(["A", "B", "C"]) + S.MERGE_OPERATOR.flow


def steps(pb):
    return {s["step"]: s for s in pb["workflow"]}


def test_standard_form_shape():
    pb = compile_flow(MERGE, name="merge")
    assert pb["apiVersion"] == "noetl.io/v2" and pb["kind"] == "Playbook"
    assert pb["metadata"] == {"name": "merge", "path": "flows/merge"}
    st = steps(pb)
    assert list(st) == ["start", "A_1", "B_2_in", "B_2", "C_3", "end"]
    assert pb["workflow"][0]["step"] == "start"  # the entry
    a = st["A_1"]
    assert a["tool"] == [
        {
            "name": "A",
            "kind": "python",
            "code": "result = {'A': input}",
            "input": {"input": "{{ args.input }}"},
        }
    ]
    assert a["next"] == {
        "spec": {"mode": "inclusive"},
        "arcs": [
            {
                "step": "B_2_in",
                "when": "{{ outcome.status == 'ok' }}",  # a flow stops where a task fails
                "args": {
                    "input": "{{ outcome.result if outcome.result is not none else {} }}",
                    "from": "A_1",
                },
            }
        ],
    }
    join = st["B_2_in"]["tool"][0]
    assert join == {
        "name": "input",
        "kind": "flow_input",
        "tokens": "{{ args }}",
        "order": ["A_1", "C_3"],
        "merge": True,
    }
    assert st["end"]["tool"][0]["kind"] == "flow_input" and "next" not in st["end"]
    load_playbook_dict(pb)  # valid for the playbook loader


def test_guards_and_iteration_compile_to_guard_steps_and_loops():
    pb = compile_flow(python_tasks(["A", "B", "C"]) + "A → ? `$.go` * B → C")
    st = steps(pb)
    guard = st["B_2_guard"]
    assert guard["tool"][0] == {"name": "guard", "kind": "flow_guard", "path": "$.go", "tokens": "{{ args }}"}
    assert guard["next"]["arcs"] == [
        {
            "step": "B_2",
            "when": "{{ outcome.status == 'ok' and outcome.result.pass }}",
            "args": {"sequence": "{{ outcome.result.input }}", "from": "B_2"},
        },
        {
            "step": "C_3_in",
            "when": "{{ outcome.status == 'ok' and not outcome.result.pass }}",
            "args": {"input": {}, "from": "B_2"},
        },
    ]
    assert st["B_2"]["loop"] == {
        "in": "{{ args.sequence }}",
        "iterator": "input",
        "spec": {"mode": "sequential"},
    }
    assert st["B_2"]["tool"][0]["input"] == {"input": "{{ iter.input }}"}
    assert st["B_2"]["next"]["arcs"][0]["args"]["input"] == "{{ outcome.result.results }}"
    # C is reached from B and from B's guard: a join, so it gets an input step
    assert st["C_3_in"]["tool"][0] == {"name": "input", "kind": "flow_input", "tokens": "{{ args }}"}
    load_playbook_dict(pb)


def test_guarded_subflow_fork_skips_to_its_join():
    pb = compile_flow(python_tasks(["A", "B", "C"]) + S.GUARD_SUBFLOW)
    fork = steps(pb)["fork_2"]
    assert fork["tool"][0]["kind"] == "flow_guard"
    assert [(a["step"], a.get("when")) for a in fork["next"]["arcs"]] == [
        ("B_3", "{{ outcome.status == 'ok' and outcome.result.pass }}"),
        ("join_5", "{{ outcome.status == 'ok' and not outcome.result.pass }}"),
    ]


def test_resources_compile_to_resource_tasks():
    pb = compile_flow(
        python_tasks(["score"]) + "<in.json>(- format: yaml -) → score → <http://h/x>(- {method: PUT} -)"
    )
    st = steps(pb)
    assert st["load_1"]["tool"] == [
        {"name": "load", "kind": "resource", "op": "load", "uri": "in.json", "format": "yaml"}
    ]
    assert st["store_3"]["tool"] == [
        {
            "name": "store",
            "kind": "resource",
            "op": "store",
            "uri": "http://h/x",
            "method": "PUT",
            "value": "{{ args.input }}",
        }
    ]
    with pytest.raises(FlowCompileError, match="cannot set uri"):
        compile_flow("<in.json>(- uri: x -) → noop")


def test_flow_declaration_sets_the_playbook_fields():
    text = (
        "@flow scores (- {path: team/scores, version: 3, workload: {limit: 5},"
        " keychain: [{name: pg, kind: postgres}]} -) '''Scores.'''\nnoop"
    )
    pb = compile_flow(text)
    assert pb["metadata"] == {"name": "scores", "path": "team/scores", "version": 3, "description": "Scores."}
    assert pb["workload"] == {"limit": 5} and pb["keychain"] == [{"name": "pg", "kind": "postgres"}]


@pytest.mark.parametrize(
    "text,rule,fragment",
    [
        ("@flow f (- {limit: 5} -)\nnoop", "flow-params", "the flow's default input goes under `workload`"),
        ("@flow f (- [1] -)\nnoop", "flow-params", "must be an object"),
        ("@flow f (- {executor: {spec: {entry_step: x}}} -)\nnoop", "flow-params", "entry_step"),
        ("A → B", "unknown-task", "does not resolve to a tool"),
        ("A (- {kind: teleport} -)", "unknown-tool-kind", "'teleport' is not recognized"),
        ("python ([1, 2])", "task-params", "must be an object"),
        ("flow_input", "unknown-tool-kind", "internal"),
    ],
)
def test_compile_errors(text, rule, fragment):
    with pytest.raises(FlowCompileError) as e:
        compile_flow(text)
    assert e.value.rule == rule
    assert fragment in e.value.message


def test_unknown_task_error_points_at_the_invocation():
    with pytest.raises(FlowCompileError) as e:
        compile_flow("noop →\n  mystery", file="m.flow")
    assert str(e.value).startswith("m.flow:2:3: task 'mystery' does not resolve")


def test_workbook_entries_are_called_by_name():
    text = "@flow w (- {workbook: {greet: {tool: {kind: noop}}}} -)\ngreet (- who: me -)"
    pb = compile_flow(text)
    assert pb["workbook"] == [{"name": "greet", "tool": {"kind": "noop"}}]
    assert steps(pb)["greet_1"]["tool"] == [
        {"name": "greet", "kind": "workbook", "input": {"who": "me", "input": "{{ args.input }}"}}
    ]


def test_literals_that_look_like_templates_stay_literal():
    pb = compile_flow("<- {a: '{{ x }}'} -> → noop")
    task = steps(pb)["literal_1"]["tool"][0]
    assert "literal" not in task and "literal_b64" in task
    pb = compile_flow("<- {a: 1} -> → noop")
    assert steps(pb)["literal_1"]["tool"][0]["literal"] == {"a": 1}


def test_yaml_text_keeps_code_readable():
    pb = compile_flow('@task A (- {kind: python, code: "x = 1\\nresult = x"} -);\nA')
    text = playbook_yaml(pb)
    assert "code: |-\n      x = 1\n      result = x" in text
    assert yaml.safe_load(text) == pb


# -- command line ------------------------------------------------------------------------------


def test_cli_compile_yaml_and_mermaid(tmp_path):
    f = tmp_path / "m.flow"
    f.write_text(MERGE)
    runner = CliRunner()
    res = runner.invoke(cli, ["flow", "compile", str(f)])
    assert res.exit_code == 0 and yaml.safe_load(res.output) == compile_flow(MERGE, name="m")
    res = runner.invoke(cli, ["flow", "compile", str(f), "--format", "mermaid", "--direction", "TB"])
    assert res.exit_code == 0 and res.output.startswith("stateDiagram-v2\ndirection TB\n")
    out = tmp_path / "sub" / "m.mmd"
    res = runner.invoke(cli, ["flow", "compile", str(f), "--format", "mermaid", "-o", str(out)])
    assert res.exit_code == 0 and out.read_text() == flow_to_mermaid(MERGE)


@pytest.mark.parametrize(
    "text,code,fragment",
    [
        ("A → B →", 2, ":1:8: the flow ends unexpectedly"),
        ("A :x → B → C :x → D", 1, ":1:14: duplicate output label 'x'"),
        ("A → B", 1, "task 'A' does not resolve to a tool"),
    ],
)
def test_cli_errors_and_exit_codes(tmp_path, text, code, fragment):
    f = tmp_path / "bad.flow"
    f.write_text(text)
    res = CliRunner().invoke(cli, ["flow", "compile", str(f)])
    assert res.exit_code == code
    assert fragment in res.output


def test_cli_missing_file(tmp_path):
    res = CliRunner().invoke(cli, ["flow", "compile", str(tmp_path / "none.flow")])
    assert res.exit_code == 2 and "no such flow file" in res.output


# -- mermaid grammar check -------------------------------------------------------------------------


def test_grammar_check_accepts_what_we_write():
    text = (
        python_tasks(["A"])
        + "<- {a: 1} -> → A → ? `$.a` * my:peel-banana → <out.json>\n<in.json> → > { A B }"
    )
    assert check_state_diagram(flow_to_mermaid(text)) == []


@pytest.mark.parametrize(
    "bad,problem",
    [
        ("graph LR\nA-->B", "first line"),
        ("stateDiagram-v2\nA.1-->B.2", "undeclared state A.1"),
        ('stateDiagram-v2\nstate "A" as A.1\nstate "A" as A.1', "declared twice"),
        ('stateDiagram-v2\nstate "A<b>" as A.1', "not a statement"),
        ('stateDiagram-v2\nstate "A" as A.1\nA.1 --> [*] : oops', "not a statement"),
        ("stateDiagram-v2\nnote right of X.1 : hi", "undeclared state X.1"),
    ],
)
def test_grammar_check_rejects(bad, problem):
    problems = check_state_diagram(bad)
    assert problems and any(problem in p for p in problems), problems


# -- resource formats ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data,fmt,value",
    [
        (b'{"a": 1}', "json", {"a": 1}),
        (b'{"a": 1}\n{"a": 2}\n', "json", [{"a": 1}, {"a": 2}]),  # a .json file holding JSON lines
        (b'\x1e{"a": 1}\n\x1e{"a": 2}\n', "json-seq", [{"a": 1}, {"a": 2}]),
        (b'\x1e{"a": 1}\n\x1e[2]\n', None, [{"a": 1}, [2]]),
        (b"a: 1\nb: [x]\n", "yaml", {"a": 1, "b": ["x"]}),
        (b"a: 1\n", None, {"a": 1}),
        (b"", None, {}),
        (b"hello", "text", "hello"),
    ],
)
def test_decode(data, fmt, value):
    assert decode(data, fmt, "x") == value


def test_decode_error_is_a_tool_error():
    with pytest.raises(ToolError, match="cannot decode"):
        decode(b"{not json", "json", "x.json")


@pytest.mark.parametrize("fmt", ["json", "jsonl", "json-seq", "yaml"])
def test_encode_decode_round_trip(fmt):
    value = [{"a": 1}, {"b": [1, 2]}]
    assert decode(encode(value, fmt), fmt, "x") == value


def test_formats_from_parameters_content_types_and_extensions():
    assert resource_format("x.yml", {}) == "yaml"
    assert resource_format("x.json", {"content-type": "text/plain+yaml"}) == "yaml"
    assert resource_format("http://h/x", {}, "application/json; charset=utf-8") == "json"
    assert resource_format("http://h/x.ndjson", {}) == "jsonl"
    assert resource_format("x.bin", {}) is None
    with pytest.raises(ToolError, match="unknown resource format"):
        resource_format("x", {"format": "xml"})
    assert json.loads(encode({"a": 1}, None)) == {"a": 1}
