"""The parser: every construct of the grammar, and syntax errors at the right line and column."""

from __future__ import annotations

import pytest

from noetl_dagster.dsl.flow import FlowCompileError, FlowSyntaxError, flow_graph, parse_flow
from noetl_dagster.dsl.flow.ast import Block, Label, Resource, ResourceLiteral, TaskList, TaskRef


def test_arrows_both_spellings_and_positions():
    doc = parse_flow("A -> B\n  → C")
    (st,) = doc.statements
    assert [s.target.name for s in st.steps] == ["A", "B", "C"]
    assert [(s.pos.line, s.pos.column) for s in st.steps] == [(1, 1), (1, 6), (2, 5)]


def test_names_with_hyphens_colons_and_an_arrow_without_spaces():
    (st,) = parse_flow("my:peel-banana->eat-it").statements
    assert [s.target.name for s in st.steps] == ["my:peel-banana", "eat-it"]


def test_statements_end_where_no_arrow_follows():
    doc = parse_flow("A → B\nC\nD → E; F")
    assert [[s.target.name for s in st.steps] for st in doc.statements] == [
        ["A", "B"],
        ["C"],
        ["D", "E"],
        ["F"],
    ]


def test_labels_attach_to_the_step_before_them():
    (st,) = parse_flow("A :x → B").statements
    assert st.steps[0].out_label.name == "x"
    # without ';' the label after B is B's output label, not the start of a new statement
    (st,) = parse_flow("A :out → B\n:out → C").statements
    assert st.steps[1].out_label.name == "out" and len(st.steps) == 3
    sts = parse_flow("A :out → B;\n:out → C").statements
    assert isinstance(sts[1].source, Label) and sts[1].source.name == "out"


def test_label_roles():
    st = parse_flow(":x → A").statements[0]
    assert isinstance(st.source, Label)
    st = parse_flow(":x A").statements[0]
    assert st.source is None and st.steps[0].in_label.name == "x"
    st = parse_flow("A → :x").statements[0]
    assert isinstance(st.destination, Label)
    st = parse_flow("A → :x B").statements[0]
    assert st.destination is None and st.steps[1].in_label.name == "x"


def test_modifiers_and_guards():
    st = parse_flow("A → :x > ? `$.ok` * B").statements[0]
    b = st.steps[1]
    assert (b.in_label.name, b.merge, b.guard.expr, b.star) == ("x", True, "$.ok", True)
    st = parse_flow("A → > :end").statements[0]
    assert st.destination_merge and st.destination.name == "end"


def test_subflows_task_lists_resources_and_literals():
    st = parse_flow("<in.json>(- a: 1 -) → [ B C ] → { D } → E|F → <out.json>").statements[0]
    assert isinstance(st.source, Resource) and st.source.params.value == {"a": 1}
    assert isinstance(st.steps[0].target, Block) and isinstance(st.steps[1].target, Block)
    assert isinstance(st.steps[2].target, TaskList)
    assert [t.name for t in st.steps[2].target.tasks] == ["E", "F"]
    assert isinstance(st.destination, Resource) and st.destination.uri == "out.json"
    st = parse_flow('<{ "a": 1 }> → A').statements[0]
    assert isinstance(st.source, ResourceLiteral) and st.source.literal.value == {"a": 1}


@pytest.mark.parametrize(
    "params,value",
    [
        ("()", {}),
        ("( )", {}),
        ("(--)", {}),
        ("(- 5 -)", 5),
        ("(- [1, 2] -)", [1, 2]),
        ('({"a": {"b": [1, 2]}})', {"a": {"b": [1, 2]}}),
        ('([1, "two"])', [1, "two"]),
        ("(-\n  nested:\n    deep: true\n  list:\n    - 1\n-)", {"nested": {"deep": True}, "list": [1]}),
        ("(- {url: 'http://x/{{ input.id }}'} -)", {"url": "http://x/{{ input.id }}"}),
    ],
)
def test_parameter_literals(params, value):
    (st,) = parse_flow(f"A {params}").statements
    assert st.steps[0].target.params.value == value


def test_declarations_in_order_name_alias_params_doc_subflow():
    doc = parse_flow(
        "@flow f (- {workload: {a: 1}} -) \"\"\"The flow.\"\"\"\n@task X = A (- {p: 1} -) '''Doc.''';\n@task S { A → B }\nS"
    )
    f, x, s = doc.declarations
    assert (f.kind, f.name, f.params.value, f.doc) == ("flow", "f", {"workload": {"a": 1}}, "The flow.")
    assert (x.alias.name, x.params.value, x.doc) == ("A", {"p": 1}, "Doc.")
    assert isinstance(s.block, Block)


def test_comments_are_ignored_but_not_inside_literals():
    (st,) = parse_flow("A (- {note: '# not a comment'} -) # a comment\n# another\n").statements
    assert st.steps[0].target.params.value == {"note": "# not a comment"}


@pytest.mark.parametrize(
    "text,line,col,fragment",
    [
        ("A → B →", 1, 8, "the flow ends unexpectedly; expected"),
        ("A → {B → C\nD → E", 2, 6, "missing its closing bracket"),
        ("A → <x.json> → B", 1, 14, "a resource can only begin (load) or end (store)"),
        ("A → :x → B", 1, 8, "a label after an arrow"),
        ("A (- x: 1 → B", 1, 3, "unexpected character '('"),
        ("A → ? `$[?(@.s=` B", 1, 7, "not a valid JSONPath"),
        ('A ({"a": 1,}) → B', 1, 12, "invalid JSON literal"),
        ("A (-\n  a: 1\n   b: 2\n-)", 3, 5, "invalid YAML literal"),
        ("@task D (- {kind: noop} -)\n{ A B C } → D", 2, 11, "end the declaration with ';'"),
        ("@bogus A", 1, 1, "unknown declaration @bogus"),
        ("@task X = A { B }", 1, 13, "has an alias, so it cannot also have a subflow"),
        ("A → * * B", 1, 7, "'*' is given twice"),
        ("A → ? `$.a` ? `$.b` B", 1, 13, "at most one guard"),
        ("A → ? `` B", 1, 7, "empty guard"),
        ("A '''doc", 1, 3, "unexpected character"),
    ],
)
def test_syntax_errors_point_at_line_and_column(text, line, col, fragment):
    with pytest.raises(FlowSyntaxError) as e:
        parse_flow(text, file="x.flow")
    err = e.value
    assert (err.line, err.column) == (line, col), str(err)
    assert fragment in err.message
    assert str(err).startswith(f"x.flow:{line}:{col}: ")


@pytest.mark.parametrize(
    "text,rule,line,col",
    [
        ("@flow a\n@flow b\nA", "duplicate-flow", 2, 1),
        ("@task A\n@task A\nA", "duplicate-task", 2, 1),
        ("@task X = Y;\n@task Y = X;\nX", "alias-cycle", 1, 1),
        ("@task X { A → X }\nX", "recursive-subflow", 1, 15),
        ("@task X { A }\nX (- a: 1 -)", "subflow-params", 2, 3),
        ("@task X (- a: 1 -) { A }\nX", "subflow-params", 1, 9),
        ("@task S { A };\n@task X = S (- a: 1 -);\nX", "subflow-params", 3, 1),
        ("@task A (- {a: 1} -);\nA ([1])", "params-type", 2, 3),
        (":x A;\n:x B", "duplicate-input-label", 2, 1),
        ("{ A :x → B :x }", "duplicate-output-label", 1, 12),
    ],
)
def test_structural_errors(text, rule, line, col):
    with pytest.raises(FlowCompileError) as e:
        flow_graph(text)
    assert e.value.rule == rule
    assert (e.value.line, e.value.column) == (line, col), str(e.value)


def test_labels_are_local_to_their_subflow():
    # :x inside the subflow is not the :x outside it
    with pytest.raises(FlowCompileError) as e:
        flow_graph("A :x → { :x → B }")
    assert e.value.rule == "unknown-label"
    g = flow_graph("A :x → { B :x → C; :x → D }; :x → E")
    names = {n.index: n.name for n in g.nodes}
    edges = {(names.get(a, a), names.get(b, b)) for a, b in g.edges}
    assert ("A", "E") in edges and ("B", "D") in edges and ("A", "D") not in edges


def test_empty_flow_is_an_error():
    with pytest.raises(FlowCompileError, match="no flow statements"):
        flow_graph("@flow nothing '''just a name'''")
    with pytest.raises(FlowSyntaxError):
        parse_flow("A → { }")


def test_task_refs_keep_their_position():
    st = parse_flow("\n\n   A (- x: 1 -)").statements[0]
    ref = st.steps[0].target
    assert isinstance(ref, TaskRef) and (ref.pos.line, ref.pos.column) == (3, 4)
    assert (ref.params.pos.line, ref.params.pos.column) == (3, 6)
