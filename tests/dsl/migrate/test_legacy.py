"""find_legacy_constructs: every retired construct with its YAML path; nothing in standard files."""

from __future__ import annotations

import textwrap

import yaml

from noetl_dagster.dsl.legacy import find_legacy_constructs


def find(text: str):
    return {(path, what) for path, what, _ in find_legacy_constructs(yaml.safe_load(textwrap.dedent(text)))}


def test_v1_constructs_are_named_with_their_paths():
    got = find("""
        apiVersion: noetl.io/v1
        kind: Playbook
        name: x
        path: x
        workbooks:
          - {name: t, type: python, with: {a: 1}, code: "result = 1"}
        workflow:
          - step: start
            type: workbook
            task: t
            with: {a: 2}
            save: {storage: postgres}
            next:
              - when: "{{ true }}"
                then: [{step: loop}]
          - step: loop
            loop: {in: "{{ [1] }}", iterator: i, mode: parallel}
            next: end_it
          - {step: end_it, end_loop: loop, result: {a: 1}}
        """)
    assert {
        (("apiVersion",), "apiVersion noetl.io/v1"),
        (("name",), "root `name`/`path`"),
        (("workbooks",), "root `workbooks:`"),
        (("workbooks", 0, "type"), "workbook entry `type:`"),
        (("workbooks", 0, "with"), "workbook entry `with:`"),
        (("workflow", 0, "type"), "step `type:`"),
        (("workflow", 0, "task"), "`task:` workbook call"),
        (("workflow", 0, "with"), "step `with:`"),
        (("workflow", 0, "save"), "`save:` block"),
        (("workflow", 0, "next"), "`next:` list"),
        (("workflow", 1, "loop", "mode"), "`loop.mode`"),
        (("workflow", 1, "next"), "`next:` step name"),
        (("workflow", 2, "end_loop"), "`end_loop` step"),
        (("workflow", 2, "result"), "`end_loop` result"),
    } <= got


def test_early_v2_constructs_and_vars_references():
    got = find("""
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: x, path: x}
        vars: {n: 1}
        workflow:
          - step: a
            when: "{{ vars.n }}"
            tool:
              - fetch: {kind: http, args: {q: 1}, retry: {max_attempts: 2}, eval: [{expr: "{{ true }}", do: continue}]}
            case: [{when: "{{ true }}", then: {next: [b]}}]
            sink: {tool: {kind: postgres}}
            vars: {m: "{{ result }}"}
          - step: b
            tool: {kind: python, code: "print('{{ vars.n }} is literal text in code')"}
        """)
    assert {
        (("vars",), "root `vars:`"),
        (("workflow", 0, "when"), "step `when`"),
        (("workflow", 0, "case"), "`case:` rules"),
        (("workflow", 0, "sink"), "step `sink:`"),
        (("workflow", 0, "vars"), "step `vars:`"),
        (("workflow", 0, "tool", 0, "fetch", "retry"), "task `retry:` block"),
        (("workflow", 0, "tool", 0, "fetch", "eval"), "`eval:` rules"),
        (("workflow", 0, "when"), "`vars.` reference"),
    } <= got
    assert not any(p[:2] == ("workflow", 1) for p, _ in got)  # code is not a template
    # task `args` is NoETL's renamed `input`: a deprecation warning now (tests/dsl/test_renamed_keys.py)
    assert (("workflow", 0, "tool", 0, "fetch", "args"), "task `args:`") not in got


def test_standard_and_runtime_dialect_files_have_none(conformance_dir):
    for name in ("hello_world/hello_world.yaml", "control_flow_workbook/control_flow_workbook.yaml",
                 "retry_test/http_retry_status_code.yaml", "iterator_save_test.yaml"):  # fmt: skip
        doc = yaml.safe_load((conformance_dir / name).read_text())
        assert find_legacy_constructs(doc) == [], name
    assert find_legacy_constructs({"not": "a playbook"}) == []
    assert find_legacy_constructs([]) == []  # type: ignore[arg-type]
