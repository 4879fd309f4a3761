"""Every example of seed 002 as a test: its diagram is what `flow compile --format mermaid`
gives (as an edge multiset over task labels, start and end; and state by state), and its
error examples raise the documented errors."""

from __future__ import annotations

from collections import Counter

import flow_seed_examples as S
import pytest
from click.testing import CliRunner
from flow_helpers import contracted_label_edges, id_edges, label_edges

from noetl_dagster.commands.main import cli
from noetl_dagster.dsl.flow import FlowCompileError, NodeKind, flow_graph, flow_to_mermaid, parse_flow
from noetl_dagster.dsl.flow.mermaid import check_state_diagram


def mermaid_via_cli(tmp_path, text: str) -> str:
    path = tmp_path / "example.flow"
    path.write_text(text, encoding="utf-8")
    res = CliRunner().invoke(cli, ["flow", "compile", str(path), "--format", "mermaid"])
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize("example", S.WITH_DIAGRAMS, ids=lambda e: e.name)
def test_diagram_matches_the_seed(tmp_path, example):
    ours = mermaid_via_cli(tmp_path, example.flow)
    assert label_edges(ours) == label_edges(example.mermaid)
    # stronger: the same states, numbered as the seed numbers them
    assert id_edges(ours) == id_edges(example.mermaid)
    assert check_state_diagram(ours) == []


def test_seed_diagrams_pass_our_grammar_check():
    for example in S.WITH_DIAGRAMS:
        assert check_state_diagram(example.mermaid) == [], example.name


def test_the_introductions_graphs():
    ours = flow_to_mermaid(S.INTRO_GRAPH_FLOW)
    assert label_edges(ours) == label_edges(S.INTRO_GRAPH_WITH_START_END)
    without_start_end = Counter({e: n for e, n in label_edges(ours).items() if "[*]" not in e})
    assert without_start_end == label_edges(S.INTRO_GRAPH)
    assert label_edges(flow_to_mermaid(S.INFORMATION_FLOW_FLOW)) == label_edges(S.INFORMATION_FLOW)


def test_label_at_start_as_the_seed_writes_it_keeps_its_start_edge():
    """`:before A` is an input label on A, so the statement still starts at :start
    (as the seed explains for `:x C`); only `:before → A` gives the seed's diagram."""
    ours = label_edges(flow_to_mermaid(S.LABEL_AT_START_AS_WRITTEN))
    expected = label_edges(S.LABEL_AT_START.mermaid) + Counter({("[*]", "A"): 1})
    assert ours == expected


def test_pipeline_and_its_multiline_form():
    one = label_edges(flow_to_mermaid(S.PIPELINE))
    assert one == Counter(
        {
            ("[*]", "transform"): 1,
            ("transform", "inference"): 1,
            ("inference", "store"): 1,
            ("store", "[*]"): 1,
        }
    )
    assert label_edges(flow_to_mermaid(S.PIPELINE_MULTILINE)) == one


def test_duplicate_output_label_is_an_error_at_its_position():
    with pytest.raises(FlowCompileError) as e:
        flow_graph(S.DUPLICATE_OUTPUT_LABEL)
    err = e.value
    assert err.rule == "duplicate-output-label"
    assert (err.line, err.column) == (1, 14)
    assert "duplicate output label 'x'" in err.message


def test_duplicate_output_label_through_the_cli(tmp_path):
    path = tmp_path / "dup.flow"
    path.write_text(S.DUPLICATE_OUTPUT_LABEL)
    res = CliRunner().invoke(cli, ["flow", "compile", str(path), "--format", "mermaid"])
    assert res.exit_code == 1
    assert f"{path}:1:14: duplicate output label 'x'" in res.output


@pytest.mark.parametrize(
    "text,line,col,fragment",
    [
        ("A → :start B", 1, 5, ":start is reserved and can only begin a flow statement"),
        ("A :start → B", 1, 3, ":start is reserved"),
        ("A → B → :start", 1, 9, ":start can only begin a flow statement"),
        (":end → A", 1, 1, ":end can only end a flow statement"),
        ("A :end → B", 1, 3, ":end is reserved and can only end a flow statement"),
        ("B\n:end A → C", 2, 1, ":end is reserved"),
    ],
)
def test_start_and_end_misuse(text, line, col, fragment):
    with pytest.raises(FlowCompileError) as e:
        flow_graph(text)
    assert e.value.rule == "reserved-label"
    assert (e.value.line, e.value.column) == (line, col)
    assert fragment in e.value.message


def test_label_forms():
    for text in S.LABEL_FORMS_OK:
        g = flow_graph(text)
        assert [n.name for n in g.nodes if n.kind == NodeKind.TASK] == ["A"]
    # a label that starts or ends a statement must be bound somewhere: alone it is an error
    for text in S.LABEL_FORMS_DANGLING:
        parse_flow(text)  # valid syntax
        with pytest.raises(FlowCompileError) as e:
            flow_graph(text)
        assert e.value.rule == "unknown-label"


def test_input_label_inside_the_statement_has_no_start_edge():
    assert label_edges(flow_to_mermaid(S.NO_START_EDGE)) == Counter(
        {("[*]", "A"): 1, ("[*]", "B"): 1, ("A", "C"): 1, ("B", "C"): 1, ("C", "[*]"): 1}
    )


def test_distinct_invocations_and_a_single_invocation():
    two = flow_graph(S.TWO_INVOCATIONS)
    assert [n.name for n in two.nodes if n.kind == NodeKind.TASK] == ["A", "C", "B", "C"]
    assert label_edges(flow_to_mermaid(S.TWO_INVOCATIONS))[("[*]", "A")] == 1
    one = flow_graph(S.ONE_INVOCATION)
    assert [n.name for n in one.nodes if n.kind == NodeKind.TASK] == ["A", "C", "B"]
    assert label_edges(flow_to_mermaid(S.ONE_INVOCATION)) == Counter(
        {("[*]", "A"): 1, ("[*]", "B"): 1, ("A", "C"): 1, ("B", "C"): 1, ("C", "[*]"): 1}
    )


def test_resources_are_load_and_store_tasks():
    g = flow_graph(S.RESOURCE_LOAD)
    kinds = [(n.kind, n.name) for n in g.nodes]
    assert kinds[1] == (NodeKind.LOAD, "dataset.json")
    g = flow_graph(S.RESOURCE_STORE)
    assert (
        g.nodes[-2].kind == NodeKind.STORE and g.nodes[-2].name == "http://example.com/myservice/api/v1/store"
    )
    g = flow_graph(S.RESOURCE_STORE_PUT)
    assert g.nodes[-2].params == {"method": "PUT"}
    assert g.sorted_edges() == [(0, 1), (1, 2), (2, 3), (3, 4)]


def test_task_names_and_parameters():
    g = flow_graph(S.TASK_NAME)
    assert g.nodes[1].name == "my:peel-banana"
    assert "my_COLON_peel_HYPHEN_banana.1" in flow_to_mermaid(S.TASK_NAME)
    assert flow_graph(S.RANGE_PARAMS).nodes[1].params == {"start": 1, "end": 10}
    g = flow_graph(S.PARAMETERIZED)
    assert [n.params for n in g.nodes[1:3]] == [{"delete": True}, {"flush": True}]
    assert flow_graph("A " + S.INLINE_YAML).nodes[1].params == {"start": 10, "end": 50}
    assert flow_graph("A " + S.MULTILINE_YAML).nodes[1].params == {"start": 10, "end": 50}


def test_literal_source():
    g = flow_graph(S.LITERAL_SOURCE)
    assert g.nodes[1].kind == NodeKind.LITERAL and g.nodes[1].params == {"customer": "C123"}
    assert label_edges(flow_to_mermaid(S.LITERAL_SOURCE))[("[*]", "literal")] == 1


def test_declarations():
    g = flow_graph(S.FLOW_DECLARATION + "\nA")
    assert g.name == "test" and g.doc == "This is a test workflow."
    g = flow_graph(S.TASK_DECLARATION + "\nA\nA (- dry-run: true -)")
    assert [n.params for n in g.nodes[1:3]] == [{"dry-run": False}, {"dry-run": True}]
    assert g.nodes[1].doc.startswith("Task A has a single parameter")


def test_alias_is_the_aliased_invocation():
    alias, expanded = flow_graph(S.ALIAS), flow_graph(S.ALIAS_EXPANDED)
    assert [(n.kind, n.name, n.params) for n in alias.nodes] == [
        (n.kind, n.name, n.params) for n in expanded.nodes
    ]
    assert alias.edges == expanded.edges
    assert alias.nodes[1].invoked_as == "X"


def test_declared_subflow_is_the_inline_subflow():
    assert flow_to_mermaid(S.DECLARED_SUBFLOW) == flow_to_mermaid(S.DECLARED_SUBFLOW_EXPANDED)


@pytest.mark.parametrize("text", S.FAN_IN_LABELS)
def test_fan_in_label_forms_equal_the_subflow(text):
    assert label_edges(flow_to_mermaid(text)) == contracted_label_edges(S.FAN_IN_SUBFLOW.mermaid)


@pytest.mark.parametrize("text", S.FAN_OUT_LABELS)
def test_fan_out_label_forms_equal_the_subflow(text):
    assert label_edges(flow_to_mermaid(text)) == contracted_label_edges(S.FAN_OUT_SUBFLOW.mermaid)


def test_guards_keep_the_graph():
    g = flow_graph(S.GUARD)
    assert g.nodes[2].guard == "$[?(@.status=0)]"
    assert label_edges(flow_to_mermaid(S.GUARD, notes=False)) == label_edges(flow_to_mermaid("A → B"))
    g = flow_graph(S.GUARD_SUBFLOW)
    assert g.nodes[2].kind == NodeKind.FORK and g.nodes[2].guard == "$[?(@.status=0)]"
    g = flow_graph(S.GUARDS_IN_SUBFLOW)
    assert [n.guard for n in g.nodes if n.kind == NodeKind.TASK] == [
        None, "$[?(@.status=0)]", "$[?(@.status>0)]", "$[?(@.status>1)]", None
    ]  # fmt: skip
    g = flow_graph(S.GUARD_ONE_STEP)
    assert [n.guard for n in g.nodes if n.kind == NodeKind.TASK] == [None, "$[?(@.status=0)]", None]


def test_comments():
    text = "# a comment at the beginning\nA :out → B; # at the end of a line\n:out → C\n#:out → D\n"
    assert label_edges(flow_to_mermaid(text)) == Counter(
        {("[*]", "A"): 1, ("A", "B"): 1, ("A", "C"): 1, ("B", "[*]"): 1, ("C", "[*]"): 1}
    )


def test_iteration_marks_the_task():
    g = flow_graph(S.ITERATE)
    assert g.nodes[1].kind == NodeKind.LOAD and g.nodes[2].star


def test_subflow_equals_its_labeled_form():
    assert label_edges(flow_to_mermaid(S.SUBFLOW_BLOCK_LABELS)) == contracted_label_edges(
        flow_to_mermaid(S.SUBFLOW_BLOCK)
    )


def test_iterated_subflow_equals_its_labeled_form():
    a, b = flow_graph(S.ITERATE_SUBFLOW), flow_graph(S.ITERATE_SUBFLOW_LABELS)
    assert label_edges(flow_to_mermaid(S.ITERATE_SUBFLOW_LABELS)) == contracted_label_edges(
        flow_to_mermaid(S.ITERATE_SUBFLOW)
    )
    stars = lambda g: sorted((n.name, n.star) for n in g.nodes if n.kind == NodeKind.TASK)  # noqa: E731
    assert stars(a) == stars(b) == [("A", False), ("B", True), ("C", True), ("D", True), ("E", False)]
