"""SEMANTICS §1 / spec §13: every validation rule as `FILE:LINE: RULE: message`
with the right line, all errors of a file at once, and a valid near miss for
each rule the spec names."""

from __future__ import annotations

import textwrap

import pytest

from noetl_dagster.dsl import PlaybookInvalid, load_playbook, validate_file

MARK = "#@"  # the line an issue must point at


def _write(tmp_path, text: str, name: str = "pb.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return p


def _marked_lines(path) -> list[int]:
    return [i for i, line in enumerate(path.read_text().splitlines(), start=1) if MARK in line]


# Each case: a document with one error; the marked line is where it must be reported.
CASES = {
    # -- the rules SEMANTICS §1 / spec §13 name -------------------------------
    "duplicate-step": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: a
            tool: {kind: noop}
          - step: a  #@
            tool: {kind: noop}
        """,
    "unknown-arc-target": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool: {kind: noop}
            next:
              arcs:
                - step: start
                - step: nowhere  #@
        """,
    "loop-in-iterator": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            loop:  #@
              in: "{{ [1] }}"
            tool: {kind: noop}
        """,
    "unknown-tool-kind": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool:
              - first:
                  kind: teleport  #@
        """,
    "root-vars": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        vars:  #@
          a: 1
        workflow:
          - step: start
            tool: {kind: noop}
        """,
    "step-when": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            when: "{{ true }}"  #@
            tool: {kind: noop}
        """,
    "policy-shape": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool:
              - t:
                  kind: noop
                  spec:
                    policy:  #@
                      do: retry
        """,
    "step-tool-or-next": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool: {kind: noop}
          - step: empty  #@
            desc: nothing to do
        """,
    # -- further rules of the implementation ----------------------------------
    "not-a-playbook": """
        apiVersion: noetl.io/v2
        kind: Workflow  #@
        metadata: {name: v, path: tests/v}
        """,
    "api-version": """
        apiVersion: noetl.io/v3  #@
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool: {kind: noop}
        """,
    "metadata": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata:  #@
          name: v
        workflow:
          - step: start
            tool: {kind: noop}
        """,
    "workload-shape": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workload: [1, 2]  #@
        workflow:
          - step: start
            tool: {kind: noop}
        """,
    "keychain-shape": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        keychain:  #@
          - kind: env
        workflow:
          - step: start
            tool: {kind: noop}
        """,
    "executor-shape": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        executor: local  #@
        workflow:
          - step: start
            tool: {kind: noop}
        """,
    "workbook-shape": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workbook:
          - name: w  #@
            tool: 3
        workflow:
          - step: start
            tool: {kind: noop}
        """,
    "unknown-workbook-entry": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workbook:
          - name: exists
            tool: {kind: noop}
        workflow:
          - step: start
            tool:
              kind: workbook
              name: missing  #@
        """,
    "unknown-entry-step": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        executor:
          spec:
            entry_step: nope  #@
        workflow:
          - step: start
            tool: {kind: noop}
        """,
    "template-syntax": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool:
              kind: noop
              result: "{{ 1 + }}"  #@
        """,
    "step-shape": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool: {kind: noop}
          - just a string  #@
        """,
    "step-name": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool: {kind: noop}
          - desc: unnamed  #@
            tool: {kind: noop}
        """,
    "admit-shape": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            spec:
              policy:
                admit:  #@
                  allow: false
            tool: {kind: noop}
        """,
    "loop-shape": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            loop: [1, 2]  #@
            tool: {kind: noop}
        """,
    "loop-mode": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            loop:
              in: "{{ [1] }}"
              iterator: x
              spec:
                mode: turbo  #@
            tool: {kind: noop}
        """,
    "loop-exec": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            loop:
              in: "{{ [1] }}"
              iterator: x
              spec:
                policy:
                  exec: everywhere  #@
            tool: {kind: noop}
        """,
    "tool-shape": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool: 42  #@
        """,
    "tool-kind": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool:
              - name: a
                kind: noop
              - name: b  #@
                code: "result = 1"
        """,
    "policy-directive": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool:
              - t:
                  kind: noop
                  spec:
                    policy:
                      rules:
                        - when: "{{ true }}"
                          then:
                            do: explode  #@
        """,
    "policy-backoff": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool:
              - t:
                  kind: noop
                  spec:
                    policy:
                      rules:
                        - when: "{{ true }}"
                          then:
                            do: retry
                            backoff: random  #@
        """,
    "policy-jump": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool:
              - t:
                  kind: noop
                  spec:
                    policy:
                      rules:
                        - when: "{{ true }}"
                          then:
                            do: jump
                            to: not_a_task  #@
        """,
    "set-shape": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool: {kind: noop}
            set: [1, 2]  #@
        """,
    "duplicate-task": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool:
              - t: {kind: noop}
              - t: {kind: noop}  #@
        """,
    "next-shape": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool: {kind: noop}
            next:
              arcs:
                - when: "{{ true }}"  #@
        """,
    "next-mode": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool: {kind: noop}
            next:
              spec:
                mode: broadcast  #@
              arcs: [{step: start}]
        """,
    "legacy-construct": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool: {kind: noop}
            next:  #@
              - step: start
        """,
    "set-workload": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool: {kind: noop}
            set:
              workload.x: 1  #@
        """,
    "policy-attempts": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool:
              kind: noop
              spec:
                policy:
                  rules:
                    - then:
                        do: retry
                        attempts: 0  #@
        """,
    "next-on-no-match": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool: {kind: noop}
            next:
              spec:
                on_no_match: explode  #@
              arcs: [{step: start, when: "{{ false }}"}]
        """,
    "next-spec-key": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        workflow:
          - step: start
            tool: {kind: noop}
            next:
              spec:
                fan: all  #@
              arcs: [{step: start, when: "{{ false }}"}]
        """,
    "yaml-syntax": """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: [tests/v}  #@
        workflow:
          - step: start
        """,
}


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_reported_with_file_line_and_rule(tmp_path, rule):
    path = _write(tmp_path, CASES[rule])
    (line,) = _marked_lines(path)
    issues = validate_file(path)
    hits = [i for i in issues if i.rule == rule]
    assert hits, f"no {rule} issue in {[str(i) for i in issues]}"
    assert hits[0].line == line, f"{rule}: reported line {hits[0].line}, expected {line}: {hits[0]}"
    text = str(hits[0])
    assert text.startswith(f"{path}:{line}: {rule}: "), text
    assert hits[0].message and hits[0].file == str(path)
    assert "\n" not in text
    # load_playbook refuses the same document with the same issues
    with pytest.raises(PlaybookInvalid) as e:
        load_playbook(path)
    assert any(i.rule == rule for i in e.value.issues)


# Valid near misses: each stays just inside a rule the spec names.
VALID = {
    "loop with in and iterator": """
        loop: {in: "{{ [1] }}", iterator: x}
        tool: {kind: noop}
    """,
    "routing-only step (next, no tool)": """
        next: {arcs: [{step: other}]}
    """,
    "arc when is fine (only step when is not)": """
        tool: {kind: noop}
        next: {arcs: [{step: other, when: "{{ true }}"}]}
    """,
    "admission instead of step when": """
        spec: {policy: {admit: {rules: [{when: "{{ true }}", then: {allow: true}}]}}}
        tool: {kind: noop}
    """,
    "policy object with rules": """
        tool:
          - t: {kind: noop, spec: {policy: {rules: [{else: {then: {do: continue}}}]}}}
    """,
    "known kinds": """
        tool:
          - a: {kind: python, code: "result = 1"}
          - b: {kind: workbook, name: wb}
          - c: {kind: playbook, path: x}
    """,
}


@pytest.mark.parametrize("case", sorted(VALID))
def test_valid_near_misses(tmp_path, case):
    body = textwrap.indent(textwrap.dedent(VALID[case]).strip("\n"), "    ")
    doc = f"""apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: v, path: tests/v}}
workload: {{vars: allowed-inside-workload}}
workbook:
  - name: wb
    tool: {{kind: noop}}
workflow:
  - step: start
{body}
  - step: other
    tool: {{kind: noop}}
"""
    p = tmp_path / "ok.yaml"
    p.write_text(doc)
    assert validate_file(p) == []
    assert load_playbook(p).name == "v"


def test_all_errors_of_a_file_are_reported_at_once(tmp_path):
    path = _write(
        tmp_path,
        """
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: v, path: tests/v}
        vars: {a: 1}
        workflow:
          - step: start
            when: "{{ x }}"
            tool:
              - t:
                  kind: teleport
                  spec: {policy: {do: retry}}
            next:
              arcs: [{step: ghost}]
          - step: start
            tool: {kind: noop}
          - step: idle
            loop: {in: "{{ [1] }}"}
            tool: {kind: noop}
          - step: nothing
        """,
    )
    issues = validate_file(path)
    rules = {i.rule for i in issues}
    assert {"root-vars", "step-when", "unknown-tool-kind", "policy-shape", "unknown-arc-target",
            "duplicate-step", "loop-in-iterator", "step-tool-or-next"} <= rules  # fmt: skip
    lines = {i.rule: i.line for i in issues}
    assert lines["root-vars"] == 4 and lines["step-when"] == 7 and lines["unknown-tool-kind"] == 10
    assert lines["policy-shape"] == 11 and lines["unknown-arc-target"] == 13 and lines["duplicate-step"] == 14
    assert lines["loop-in-iterator"] == 17 and lines["step-tool-or-next"] == 19
    with pytest.raises(PlaybookInvalid) as e:
        load_playbook(path)
    assert len(e.value.issues) == len(issues)
    assert str(e.value).count("\n") == len(issues) - 1


def test_missing_file(tmp_path):
    (issue,) = validate_file(tmp_path / "absent.yaml")
    assert issue.rule == "file-not-found"
    with pytest.raises(FileNotFoundError):
        load_playbook(tmp_path / "absent.yaml")


@pytest.mark.parametrize("text", ["", "- 1\n- 2\n", "just text\n"])
def test_non_mapping_documents(tmp_path, text):
    p = tmp_path / "x.yaml"
    p.write_text(text)
    (issue,) = validate_file(p)
    assert issue.rule == "not-a-playbook" and issue.line == 1


def test_every_conformance_fixture_we_run_is_valid(conformance_dir):
    for rel in ("hello_world/hello_world.yaml", "control_flow_workbook/control_flow_workbook.yaml",
                "fanout_reduce/fanout_reduce_phase6.yaml", "test_loop_instance_isolation/playbook.yaml",
                "vars_test/test_vars_block.yaml", "playbook_composition/user_profile_scorer.yaml",
                "playbook_composition/playbook_composition.yaml"):  # fmt: skip
        assert validate_file(conformance_dir / rel) == [], rel


@pytest.mark.parametrize("value", ["0", "-1"])
def test_retry_attempts_below_one_rejected(tmp_path, value):
    text = CASES["policy-attempts"].replace("attempts: 0", f"attempts: {value}")
    issues = validate_file(_write(tmp_path, text))
    assert [i.rule for i in issues] == ["policy-attempts"]
