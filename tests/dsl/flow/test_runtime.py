"""Compiled flows run on the engine with the seed's semantics: input aggregation, `>`,
guards, `*`, resources and literals, declarations, task resolution."""

from __future__ import annotations

import json

import flow_seed_examples as S
import pytest
from flow_helpers import python_tasks, run_flow

from noetl_dagster.dsl.flow import NodeKind, flow_graph
from noetl_dagster.dsl.flow.jsonpath import guard_holds
from noetl_dagster.tools.flow import aggregate, merge_objects, tokens_input
from noetl_dagster.tools.registry import ToolError

# -- the aggregation rules, as functions ---------------------------------------------------------


def test_aggregation_rules():
    assert aggregate([]) == {}
    assert aggregate([{}, {}, None]) == {}  # empty objects are merged into one
    assert aggregate([{}, {"a": 1}]) == {"a": 1}  # and omitted next to a non-empty one
    assert aggregate([{"a": 1}, {}, {"b": 2}]) == [{"a": 1}, {"b": 2}]  # several: a collection
    assert aggregate([[1, 2]]) == [1, 2]  # one input is the input itself
    assert aggregate([0, {}]) == 0


def test_merge_operator_function():
    assert merge_objects([{"fruit": "banana"}, {"animal": "monkey"}]) == {
        "fruit": "banana",
        "animal": "monkey",
    }
    assert merge_objects({}) == {}
    assert merge_objects([[{"a": 1}], {"b": 2}, {"a": 3}]) == {
        "a": 3,
        "b": 2,
    }  # later wins; lists flatten once
    with pytest.raises(ToolError, match="needs objects"):
        merge_objects([{"a": 1}, 5])


def test_token_order_follows_the_flow_not_the_arrival():
    toks = [{"input": {"c": 1}, "from": "C_3"}, {"input": {"a": 1}, "from": "A_1"}]
    assert tokens_input(toks, ["A_1", "C_3"]) == [{"a": 1}, {"c": 1}]
    assert tokens_input({"input": [1], "from": "A_1"}) == [1]
    assert tokens_input({"input": None}) == {}


@pytest.mark.parametrize(
    "expr,value,holds",
    [
        ("$[?(@.status=0)]", {"status": 0}, True),
        ("$[?(@.status=0)]", {"status": 1}, False),
        ("$[?(@.status>1)]", {"status": 2}, True),
        ("$[?(@.status>1)]", [{"status": 0}, {"status": 5}], True),
        ("$.enabled", {"enabled": False}, False),
        ("$.enabled", {"enabled": True}, True),
        ("$.items[*]", {"items": []}, False),
        ("$.missing", {}, False),
    ],
)
def test_guard_semantics(expr, value, holds):
    assert guard_holds(expr, value) is holds


# -- running flows -------------------------------------------------------------------------------

FRUIT = "@task A (- {kind: python, code: \"result = {'fruit': 'banana'}\"} -)\n"
ANIMAL = "@task C (- {kind: python, code: \"result = {'animal': 'monkey'}\"} -)\n"
ECHO_B = "@task B (- {kind: python, code: 'result = input'} -)\n"


def test_several_inputs_arrive_as_a_collection(data_dir):
    r = run_flow(FRUIT + ANIMAL + ECHO_B + S.MERGE_INPUTS.flow, data_dir)
    assert r.status == "completed"
    assert r.results["B_2"] == [{"fruit": "banana"}, {"animal": "monkey"}]
    assert r.runs["B_2"] == 1


def test_merge_operator_merges_the_collection(data_dir):
    r = run_flow(FRUIT + ANIMAL + ECHO_B + S.MERGE_OPERATOR.flow, data_dir)
    assert r.results["B_2"] == {"fruit": "banana", "animal": "monkey"}


@pytest.mark.parametrize("flow", [S.MERGE_INPUTS.flow, S.MERGE_OPERATOR.flow])
def test_no_output_gives_the_empty_object(data_dir, flow):
    silent = python_tasks(["A", "C"], "x = 1")  # no result: the output is {}
    r = run_flow(silent + ECHO_B + flow, data_dir)
    assert r.results["B_2"] == {}


def test_the_final_output_is_the_collection_of_the_last_outputs(data_dir):
    tasks = python_tasks(["A", "B", "C", "D"], "result = '{name}'")
    r = run_flow(tasks + S.INFORMATION_FLOW_FLOW, data_dir)
    assert r.results["end"] == ["B", "D"]


def test_the_workflow_input_is_the_workload(data_dir):
    tasks = python_tasks(["A"], "result = {'got': input}")
    text = "@flow w (- {workload: {customer: C1}} -)\n" + tasks + "A"
    assert run_flow(text, data_dir).results["end"] == {"got": {"customer": "C1"}}
    assert run_flow(text, data_dir, workload={"customer": "C2"}).results["end"] == {"got": {"customer": "C2"}}


@pytest.mark.parametrize("example", S.WITH_DIAGRAMS, ids=lambda e: e.name)
def test_every_seed_graph_runs_each_invocation_once(data_dir, example):
    graph = flow_graph(example.flow)
    names = sorted({n.name for n in graph.nodes if n.kind == NodeKind.TASK})
    r = run_flow(python_tasks(names, "result = {'{name}': True}") + example.flow, data_dir)
    assert r.status == "completed"
    task_steps = {f"{n.name}_{n.index}" for n in graph.nodes if n.kind == NodeKind.TASK}
    assert {s: r.runs.get(s) for s in task_steps} == dict.fromkeys(task_steps, 1)
    assert r.runs["end"] == 1


def test_fan_in_and_fan_out_forms_give_the_same_outputs(data_dir):
    tasks = python_tasks(["A", "B", "C", "D"], "result = {'{name}': input}")
    outs = [run_flow(tasks + text, data_dir).results["end"] for text in [S.FAN_IN_BAR.flow, *S.FAN_IN_LABELS]]
    assert outs[0] == {"D": [{"A": {}}, {"B": {}}, {"C": {}}]}
    assert outs[1] == outs[2] == outs[0]
    outs = [
        run_flow(tasks + text, data_dir).results["end"] for text in [S.FAN_OUT_BAR.flow, *S.FAN_OUT_LABELS]
    ]
    assert outs[0] == [{"A": {"D": {}}}, {"B": {"D": {}}}, {"C": {"D": {}}}]
    assert outs[1] == outs[2] == outs[0]


# -- guards ----------------------------------------------------------------------------------------

STATUS_A = "@task A (- {kind: python, code: \"result = {'status': input['status']}\"} -)\n"


@pytest.mark.parametrize("status,runs_b", [(0, True), (1, False)])
def test_guard_on_a_task(data_dir, status, runs_b):
    r = run_flow(
        STATUS_A + python_tasks(["B"], "result = 'B'") + S.GUARD, data_dir, workload={"status": status}
    )
    assert r.status == "completed"
    assert ("B_2" in r.runs) is runs_b
    assert r.results["end"] == ("B" if runs_b else {})


@pytest.mark.parametrize("status,ran", [(0, ["B", "C"]), (3, [])])
def test_guard_on_a_subflow(data_dir, status, ran):
    r = run_flow(STATUS_A + python_tasks(["B", "C"], "result = '{name}'") + S.GUARD_SUBFLOW, data_dir,
                 workload={"status": status})  # fmt: skip
    assert r.status == "completed"
    assert sorted(s.split("_")[0] for s in r.runs if s[:2] in ("B_", "C_")) == ran
    assert r.results["end"] == ("C" if ran else {})


@pytest.mark.parametrize(
    "status,trace,e_input",
    [(0, ["B"], "B"), (1, ["C"], "C"), (2, ["C", "D"], ["C", "D"]), (-1, [], {})],
)
def test_guards_in_a_subflow_give_the_seeds_traces(data_dir, status, trace, e_input):
    tasks = (
        STATUS_A
        + python_tasks(["B", "C", "D"], "result = '{name}'")
        + python_tasks(["E"], "result = {'E': input}")
    )
    r = run_flow(tasks + S.GUARDS_IN_SUBFLOW, data_dir, workload={"status": status})
    assert r.status == "completed"
    ran = sorted(s.split("_")[0] for s, n in r.runs.items() if s in ("B_3", "C_4", "D_5"))
    assert ran == trace
    assert r.runs["A_1"] == r.runs["E_7"] == 1
    assert r.results["E_7"] == {"E": e_input}


@pytest.mark.parametrize("status", [0, 1])
def test_a_guard_applies_to_its_step_only(data_dir, status):
    tasks = STATUS_A + python_tasks(["B", "C"], "result = {'{name}': input}")
    r = run_flow(tasks + S.GUARD_ONE_STEP, data_dir, workload={"status": status})
    assert r.runs["A_1"] == r.runs["C_3"] == 1
    assert r.results["C_3"] == ({"C": {"B": {"status": 0}}} if status == 0 else {"C": {}})


# -- iteration -------------------------------------------------------------------------------------


def test_iterate_over_a_json_sequence_resource(data_dir, tmp_path):
    (tmp_path / "seqeuence.json").write_text(S.SEQUENCE_JSON)
    tasks = python_tasks(["A"], "result = input['x'] * input['y']")
    r = run_flow(tasks + S.ITERATE, data_dir, folder=tmp_path)
    assert r.status == "completed"
    assert r.results["load_1"] == [{"x": 12, "y": 24}, {"x": 3, "y": 96}, {"x": 7, "y": 12}, {"x": 7, "y": 7}]
    assert r.results["end"] == [288, 288, 84, 49]
    assert r.runs["A_2"] == 1  # one loop step, four iterations


def test_iterated_subflow_equals_its_labeled_form(data_dir):
    tasks = (
        "@task A (- {kind: python, code: 'result = [1, 2, 3]'} -)\n"
        + python_tasks(["B", "D"], "result = input * 10")
        + python_tasks(["C"], "result = input + 1")
        + python_tasks(["E"], "result = {'E': input}")
    )
    block = run_flow(tasks + S.ITERATE_SUBFLOW, data_dir).results["end"]
    labels = run_flow(tasks + S.ITERATE_SUBFLOW_LABELS, data_dir).results["end"]
    assert block == labels == {"E": [[11, 21, 31], [10, 20, 30]]}


# -- literals and resources -------------------------------------------------------------------------


def test_literal_source_feeds_the_statement(data_dir):
    tasks = python_tasks(["A", "B"], "result = {'{name}': input}")
    r = run_flow(tasks + S.LITERAL_SOURCE, data_dir)
    assert r.results["end"] == {"B": {"A": {"customer": "C123"}}}


@pytest.mark.parametrize(
    "literal,value",
    [
        ('<{ "a": {"b": 1} }>', {"a": {"b": 1}}),
        ("<[ 1, 2, 3 ]>", [1, 2, 3]),
        ("<-\n- index: 0\n- index: 1\n->", [{"index": 0}, {"index": 1}]),
        ("<>", {}),
        ("<- text: '{{ not a template }}' ->", {"text": "{{ not a template }}"}),
    ],
)
def test_resource_literals(data_dir, literal, value):
    r = run_flow(python_tasks(["A"], "result = input") + literal + " → A", data_dir)
    assert r.results["A_2"] == value


def test_file_resources_load_and_store(data_dir, tmp_path):
    (tmp_path / "dataset.json").write_text(json.dumps({"rows": [1, 2, 3]}))
    tasks = python_tasks(["inference"], "result = {'total': sum(input['rows'])}")
    text = tasks + "<dataset.json> → inference → <out/scores.yaml>"
    r = run_flow(text, data_dir, folder=tmp_path)
    assert r.status == "completed"
    assert (tmp_path / "out" / "scores.yaml").read_text() == "total: 6\n"
    stored = r.results["store_3"]
    assert stored["uri"] == (tmp_path / "out" / "scores.yaml").as_uri() and stored["format"] == "yaml"
    # and read back, as a file:// URI this time
    r2 = run_flow(python_tasks(["A"], "result = input") + f"<{stored['uri']}> → A", data_dir, name="back")
    assert r2.results["A_2"] == {"total": 6}


def test_a_missing_resource_fails_the_flow(data_dir, tmp_path):
    r = run_flow(python_tasks(["A"]) + "<nowhere.json> → A", data_dir, folder=tmp_path)
    assert r.status == "failed"


def test_http_resource_store_and_load(data_dir, httpserver):
    from werkzeug import Response

    received = []

    def store(request):
        received.append((request.method, json.loads(request.data)))
        return Response(json.dumps({"stored": True}), content_type="application/json")

    httpserver.expect_request("/api/v1/store", method="POST").respond_with_handler(store)
    httpserver.expect_request("/myscores.json", method="PUT").respond_with_handler(store)
    httpserver.expect_request("/scores.yaml", method="GET").respond_with_data(
        "a: 1\n", content_type="application/yaml"
    )
    tasks = "@task load (- {kind: python, code: \"result = {'id': 7}\"} -)\n" + python_tasks(
        ["score"], "result = {'score': input['id'] * 2}"
    )
    post = S.RESOURCE_STORE.replace("http://example.com/myservice", httpserver.url_for("").rstrip("/"))
    put = S.RESOURCE_STORE_PUT.replace("http://example.com", httpserver.url_for("").rstrip("/"))
    r1 = run_flow(tasks + post, data_dir, name="post")
    r2 = run_flow(tasks + put, data_dir, name="put")
    assert r1.status == r2.status == "completed"
    assert received == [("POST", {"score": 14}), ("PUT", {"score": 14})]
    assert r1.results["store_3"]["response"] == {"stored": True}
    r3 = run_flow(
        python_tasks(["A"], "result = input") + f"<{httpserver.url_for('/scores.yaml')}> → A", data_dir
    )
    assert r3.results["A_2"] == {"a": 1}


def test_noetl_resources_go_through_the_registry(data_dir):
    uri = "noetl://default/default/flows/dataset/scores"
    tasks = "@task make (- {kind: python, code: \"result = [{'id': 1}, {'id': 2}]\"} -)\n"
    r = run_flow(tasks + f"make → <{uri}>", data_dir, name="store")
    assert r.status == "completed", r.results
    ref = r.results["store_2"]
    assert ref["uri"].startswith(uri + "@") and ref["checksum"].startswith("sha256:")
    r2 = run_flow(python_tasks(["A"], "result = len(input)") + f"<{ref['uri']}> → A", data_dir, name="load")
    assert r2.status == "completed"
    assert r2.results["load_1"] == [{"id": 1}, {"id": 2}]
    assert r2.results["A_2"] == 2


# -- declarations and resolution ------------------------------------------------------------------


def test_alias_and_declared_defaults(data_dir):
    text = (
        "@task A (- {kind: python, code: \"result = {'fruit': fruit, 'ripe': ripe}\", ripe: false} -)\n"
        + S.ALIAS
        + "\n@task B (- {kind: python, code: 'result = input'} -)"
    )
    r = run_flow(text, data_dir)
    assert r.results["end"] == {"fruit": "banana", "ripe": False}


def test_workbook_entries_and_tool_kind_names(data_dir):
    text = (
        "@flow wb (- {workbook: [{name: greet, tool: {kind: python, code: \"result = {'hi': input, 'who': who}\"}}]} -)\n"
        "greet (- who: world -) → noop → python (- code: 'result = input' -)"
    )
    r = run_flow(text, data_dir)
    assert r.status == "completed"
    assert r.results["greet_1"] == {"hi": {}, "who": "world"}
    assert r.results["noop_2"] == {"status": "noop"}
    assert r.results["end"] == {"status": "noop"}


def test_templates_see_the_input(data_dir):
    text = (
        "@task A (- {kind: python, code: \"result = {'n': 3}\"} -)\n"
        "@task B (- {kind: noop, result: '{{ input.n * 2 }}'} -)\n"
        "@task C (- {kind: noop, result: '{{ input + 1 }}'} -)\n"
        "A → B → <[ 1, 2 ]> → * C"
    )
    text = text.replace("B → <[ 1, 2 ]> → * C", "B\n<[ 1, 2 ]> → * C")
    r = run_flow(text, data_dir)
    assert r.results["B_2"] == 6
    assert r.results["C_4"]["results"] == [2, 3]
