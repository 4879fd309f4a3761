"""What the migration cannot translate faithfully is reported (file, line, reason) and left as written."""

from __future__ import annotations

import textwrap

import yaml

from noetl_dagster.dsl.migrate import migrate_text


def y(text: str) -> str:
    return textwrap.dedent(text).lstrip()


HEAD = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: t, path: t}\n"


def refused(r):
    return [n for n in r.notes if n.level == "refused"]


def test_pagination_collect_in_case_is_refused_and_kept_verbatim():
    src = HEAD + y("""
        workflow:
          - step: fetch
            tool: {kind: http, url: "http://x"}
            case:
              - when: "{{ event.name == 'call.done' and response.data.more }}"
                then:
                  collect: {strategy: append, path: data.items}
                  retry:
                    params: {page: "{{ response.data.page + 1 }}"}
            next: [{step: end}]
          - {step: end, tool: {kind: noop}}
        """)
    r = migrate_text(src, "pages.yaml")
    (note,) = refused(r)
    assert note.file == "pages.yaml" and note.line == 8 and note.rule == "case"  # the rule it refused
    assert "collect" in note.message and "left as written" in note.message
    doc = yaml.safe_load(r.text)
    fetch = doc["workflow"][0]
    # the case is untouched, and so is the `next` list it works with; the rest of the file migrates
    assert fetch["case"] == yaml.safe_load(src)["workflow"][0]["case"]
    assert fetch["next"] == [{"step": "end"}]
    assert str(note).startswith("pages.yaml:8: refused: case: workflow[0].case: ")


def test_retry_with_a_delay_cap_is_refused():
    src = HEAD + y("""
        workflow:
          - step: start
            tool:
              kind: http
              url: "http://x"
              retry: {max_attempts: 3, max_delay: 30}
        """)
    r = migrate_text(src, "r.yaml")
    (note,) = refused(r)
    assert note.line == 9 and "max_delay" in note.message
    assert r.text == src  # nothing else to migrate: byte for byte


def test_a_loop_steps_case_routing_per_iteration_is_refused():
    src = HEAD + y("""
        workflow:
          - step: each
            loop: {in: "{{ [1, 2] }}", iterator: x}
            tool: {kind: noop}
            case:
              - when: "{{ event.name == 'call.done' }}"
                then: {next: [{step: after}]}
          - {step: after, tool: {kind: noop}}
        """)
    r = migrate_text(src, "l.yaml")
    (note,) = refused(r)
    assert "per iteration" in note.message
    assert yaml.safe_load(r.text)["workflow"][0]["case"]


def test_v1_loop_body_that_fans_out_is_not_folded_and_the_document_is_untouched_there():
    src = y("""
        apiVersion: noetl.io/v1
        kind: Playbook
        name: d
        path: d
        workflow:
          - step: start
            next: [{step: each}]
          - step: each
            loop: {in: "{{ workload.xs }}", iterator: x}
            next: [{step: a}]
          - step: a
            type: python
            code: "result = 1"
            next:
              - step: b
              - step: c
          - {step: b, type: python, code: "result = 2", next: [{step: close}]}
          - {step: c, type: python, code: "result = 3", next: [{step: close}]}
          - step: close
            end_loop: each
            next: [{step: done}]
          - {step: done, desc: x}
        """)
    r = migrate_text(src, "fan.yaml")
    notes = refused(r)
    assert any(n.rule == "end-loop" and "fans out" in n.message and n.line == 14 for n in notes)
    doc = yaml.safe_load(r.text)
    original = yaml.safe_load(src)["workflow"]
    assert doc["workflow"][1:6] == original[1:6]  # the loop, its chain and its end: exactly as written
    assert doc["workflow"][0]["next"] == {"spec": {"mode": "exclusive"}, "arcs": [{"step": "each"}]}


def test_pass_steps_and_unknown_case_actions_are_refused_with_their_lines():
    src = y("""
        apiVersion: noetl.io/v1
        kind: Playbook
        metadata: {name: d, path: d}
        workflow:
          - step: start
            type: python
            pass: true
            code: "result = 1"
          - step: other
            tool: {kind: noop}
            case:
              - when: "{{ true }}"
                then: {call: {step: start}}
        """)
    r = migrate_text(src, "p.yaml")
    got = {(n.rule, n.line) for n in refused(r)}
    assert ("step-type", 7) in got  # the `pass` key
    assert ("case", 12) in got


def test_storage_kinds_without_a_standard_tool_are_refused():
    src = HEAD + y("""
        workflow:
          - step: s
            tool: {kind: python, code: "result = 1"}
            sink:
              tool: {kind: mongodb, collection: c}
              args: {a: 1}
        """)
    r = migrate_text(src, "s.yaml")
    (note,) = refused(r)
    assert "mongodb" in note.message
    assert yaml.safe_load(r.text)["workflow"][0]["sink"]["tool"]["kind"] == "mongodb"


def test_a_file_with_only_refusals_is_returned_byte_for_byte():
    src = HEAD + y("""
        workflow:
          - step: s   # keep me
            tool: {kind: python, code: "result = 1"}
            case:
              - when: "{{ event.name == 'step.enter' }}"
                then: {sink: {tool: {kind: postgres, auth: a, table: t}, args: {a: 1}}}
        """)
    r = migrate_text(src, "b.yaml")
    assert refused(r) and r.text == src and not r.changed
