"""One small case per rewrite rule: the output has the standard shape and validates."""

from __future__ import annotations

import textwrap

import yaml

from noetl_dagster.dsl.legacy import find_legacy_constructs
from noetl_dagster.dsl.migrate import migrate_text
from tests.dsl.migrate.conftest import assert_valid, migrate, step


def y(text: str) -> str:
    return textwrap.dedent(text).lstrip()


V2_HEAD = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: t, path: t}\n"


def test_v1_root_name_path_and_api_version_move_to_metadata():
    r, doc = migrate(
        y("""
        apiVersion: noetl.io/v1
        kind: Playbook
        name: demo      # the playbook's name
        path: examples/demo
        workflow:
          - step: start
            type: python
            code: "result = 1"
        """)
    )
    assert doc["apiVersion"] == "noetl.io/v2"
    assert doc["metadata"] == {"name": "demo", "path": "examples/demo"}
    assert "name" not in doc and "path" not in doc
    assert "# the playbook's name" in r.text  # the comment travels with its key
    assert list(doc) == ["apiVersion", "kind", "metadata", "workflow"]
    assert_valid(r.text)


def test_v1_workbooks_become_workbook_entries_with_tool_and_input():
    r, doc = migrate(
        y("""
        apiVersion: noetl.io/v1
        kind: Playbook
        name: d
        path: d
        workflow:
          - step: start
            type: workbook
            task: add
            with: {a: 1, b: 2}
        workbooks:
          - name: add
            type: python
            with: {a: 0}
            code: |
              def main(a, b):
                  return a + b
        """)
    )
    assert "workbooks" not in doc
    entry = doc["workbook"][0]
    assert entry["name"] == "add"
    assert entry["tool"]["kind"] == "python" and entry["tool"]["input"] == {"a": 0}
    assert entry["tool"]["code"].startswith("def main")
    s = step(doc, "start")
    assert s["tool"] == {"kind": "workbook", "name": "add", "input": {"a": 1, "b": 2}}
    assert not {"type", "task", "with"} & set(s)
    assert_valid(r.text)


def test_v1_inline_tool_keys_move_under_tool_in_place_of_type():
    r, doc = migrate(
        y("""
        apiVersion: noetl.io/v1
        kind: Playbook
        name: d
        path: d
        workflow:
          - step: start
            desc: fetch
            type: http
            method: GET
            endpoint: "{{ workload.url }}"
            timeout: 10
            next:
              - step: end
          - step: end
            desc: done
        """)
    )
    s = step(doc, "start")
    assert list(s) == ["step", "desc", "tool", "next"]
    assert s["tool"] == {"kind": "http", "method": "GET", "endpoint": "{{ workload.url }}", "timeout": 10}
    # a step with neither tool nor next is given a noop
    assert step(doc, "end")["tool"] == {"kind": "noop"}
    assert_valid(r.text)


def test_v1_when_then_else_becomes_an_exclusive_router_that_does_not_route_failures():
    r, doc = migrate(
        y("""
        apiVersion: noetl.io/v1
        kind: Playbook
        name: d
        path: d
        workflow:
          - step: start
            type: python
            code: "result = {'n': 3}"
            next:
              - when: "{{ start.n > 2 }}"
                then:
                  - step: big
                    with: {n: "{{ start.n }}"}
              - else:
                  - step: small
          - step: big
            type: python
            code: "def main(n):\\n    return n"
          - step: small
            desc: small
        """)
    )
    nxt = step(doc, "start")["next"]
    assert nxt["spec"] == {"mode": "exclusive"}
    assert nxt["arcs"] == [
        {
            "step": "big",
            "when": "{{ event.name != 'call.error' and start.n > 2 }}",
            "set": {"step.n": "{{ start.n }}"},
        },
        {"step": "small", "when": "{{ event.name != 'call.error' }}"},
    ]
    # main(n) read `n` routed in by `with`: it becomes an input
    assert step(doc, "big")["tool"]["input"] == {"n": "{{ n }}"}
    assert_valid(r.text)


def test_direct_and_conditional_next_items_become_inclusive_with_first_match_guards():
    r, doc = migrate(
        y("""
        apiVersion: noetl.io/v1
        kind: Playbook
        name: d
        path: d
        workflow:
          - step: start
            desc: router
            next:
              - step: always
              - when: "{{ workload.a }}"
                then: [{step: first}]
              - when: "{{ workload.b or workload.c }}"
                then: [{step: second}, {step: third}]
              - else: [{step: neither}]
          - {step: always, desc: x}
          - {step: first, desc: x}
          - {step: second, desc: x}
          - {step: third, desc: x}
          - {step: neither, desc: x}
        """)
    )
    nxt = step(doc, "start")["next"]
    assert nxt["spec"] == {"mode": "inclusive"}
    whens = {a["step"]: a.get("when") for a in nxt["arcs"]}
    assert whens["always"] is None
    assert whens["first"] == "{{ workload.a }}"
    assert whens["second"] == whens["third"] == "{{ not workload.a and (workload.b or workload.c) }}"
    assert whens["neither"] == "{{ not (workload.a or (workload.b or workload.c)) }}"
    assert_valid(r.text)


def test_next_as_a_name_and_as_a_fan_out_list():
    r, doc = migrate(
        V2_HEAD
        + y("""
        workflow:
          - step: start
            tool: {kind: noop}
            next: a
          - step: a
            tool: {kind: noop}
            next:
              - step: b
              - step: c
                args: {x: 1}
          - {step: b, tool: {kind: noop}}
          - {step: c, tool: {kind: noop}}
        """)
    )
    # a legacy step never routed on failure: the migrated arcs keep that with a guard
    assert step(doc, "start")["next"] == {
        "spec": {"mode": "exclusive"},
        "arcs": [{"step": "a", "when": "{{ event.name != 'call.error' }}"}],
    }
    assert step(doc, "a")["next"] == {
        "spec": {"mode": "inclusive"},
        "arcs": [
            {"step": "b", "when": "{{ event.name != 'call.error' }}"},
            {"step": "c", "when": "{{ event.name != 'call.error' }}", "set": {"step.x": 1}},
        ],
    }
    assert_valid(r.text)


def test_loop_mode_moves_under_loop_spec():
    r, doc = migrate(
        V2_HEAD
        + y("""
        workflow:
          - step: start
            loop: {in: "{{ [1, 2] }}", iterator: x, mode: parallel, max_in_flight: 2}
            tool: {kind: noop}
        """)
    )
    assert step(doc, "start")["loop"] == {
        "in": "{{ [1, 2] }}",
        "iterator": "x",
        "spec": {"mode": "parallel", "max_in_flight": 2},
    }
    assert_valid(r.text)


def test_args_and_with_become_input_and_label_maps_are_kept():
    r, doc = migrate(
        V2_HEAD
        + y("""
        workflow:
          - step: start
            tool:
              - first:
                  kind: python
                  args: {a: 1}
                  code: "result = a"
              - second:
                  kind: python
                  with: {b: "{{ _prev }}"}
                  code: "result = b"
          - step: other
            args: {c: 3}
            tool: {kind: python, code: "result = c"}
          - step: box
            tool: {kind: container, image: alpine, args: ["echo", "hi"]}
        """)
    )
    tools = step(doc, "start")["tool"]
    assert tools[0] == {"first": {"kind": "python", "input": {"a": 1}, "code": "result = a"}}
    assert tools[1]["second"]["input"] == {"b": "{{ _prev }}"}
    assert step(doc, "other")["input"] == {"c": 3}  # step-level input: merged into each task's input
    assert step(doc, "box")["tool"]["args"] == ["echo", "hi"]  # a container's own `args` list is not an input


def test_step_vars_become_ctx_writes_and_vars_reads_become_ctx_reads():
    r, doc = migrate(
        V2_HEAD
        + y("""
        workflow:
          - step: count
            tool: {kind: python, code: "result = {'n': 2}"}
            vars:
              total: "{{ result.n }}"
            next: [{step: use}]
          - step: use
            tool:
              kind: python
              args: {t: "{{ vars.total }}"}
              code: "result = t"
        """)
    )
    assert step(doc, "count")["set"] == {"ctx.total": "{{ count.n }}"}
    assert step(doc, "use")["tool"]["input"] == {"t": "{{ ctx.total }}"}
    assert_valid(r.text)


def test_root_vars_become_workload_defaults_and_reads_fall_back_to_them():
    r, doc = migrate(
        V2_HEAD
        + y("""
        workload: {url: "http://x"}
        vars:
          page: 1
          size: 10
        workflow:
          - step: fetch
            tool:
              kind: python
              args: {p: "{{ vars.page }}", s: "{{ vars.size }}"}
              code: "result = {'next': p + 1}"
            vars:
              page: "{{ result.next }}"
        """)
    )
    assert "vars" not in doc
    assert doc["workload"] == {"url": "http://x", "page": 1, "size": 10}
    inp = step(doc, "fetch")["tool"]["input"]
    assert inp["p"] == "{{ (ctx.page | default(workload.page)) }}"  # written by a step: ctx first
    assert inp["s"] == "{{ workload.size }}"  # never written: the default
    assert any(n.rule == "root-vars" for n in r.notes)
    assert_valid(r.text)


def test_retry_blocks_become_retry_policy_rules():
    r, doc = migrate(
        y("""
        apiVersion: noetl.io/v1
        kind: Playbook
        metadata: {name: d, path: d}
        workflow:
          - step: start
            type: http
            url: "{{ workload.url }}"
            retry:
              max_attempts: 4
              initial_delay: 0.5
              backoff_multiplier: 2.0
              retry_when: "{{ status_code >= 500 }}"
            next: [{step: plain}]
          - step: plain
            type: python
            code: "result = 1"
            retry: 5
            next: [{step: kinds}]
          - step: kinds
            tool:
              kind: playbook
              path: child
              retry: {max_attempts: 2, retry_on: [timeout, connection_error], backoff: 5}
        """)
    )
    rules = step(doc, "start")["tool"]["spec"]["policy"]["rules"]
    assert rules == [{"when": "{{ output.result.status_code >= 500 }}",
                      "then": {"do": "retry", "attempts": 4, "backoff": "exponential", "delay": 0.5}}]  # fmt: skip
    plain = step(doc, "plain")["tool"]["spec"]["policy"]["rules"][0]
    assert plain == {
        "when": "{{ output.status == 'error' }}",
        "then": {"do": "retry", "attempts": 5, "backoff": "exponential"},
    }
    kinds = step(doc, "kinds")["tool"]
    assert "retry" not in kinds
    assert kinds["spec"]["policy"]["rules"][0] == {
        "when": "{{ output.status == 'error' and output.error.kind in ['timeout', 'connection_error'] }}",
        "then": {"do": "retry", "attempts": 2, "backoff": "fixed", "delay": 5},
    }
    assert_valid(r.text)


def test_eval_expr_and_set_vars_become_policy_rules():
    r, doc = migrate(
        V2_HEAD
        + y("""
        workflow:
          - step: start
            tool:
              - fetch:
                  kind: http
                  url: "http://x"
                  eval:
                    - expr: "{{ outcome.status == 'error' }}"
                      do: retry
                      attempts: 3
                    - else:
                        do: continue
                        set_vars:
                          email: "{{ outcome.result.email }}"
        """)
    )
    fetch = step(doc, "start")["tool"][0]["fetch"]
    assert "eval" not in fetch
    assert fetch["spec"]["policy"]["rules"] == [
        {"when": "{{ output.status == 'error' }}", "then": {"do": "retry", "attempts": 3}},
        {"else": {"then": {"do": "continue", "set": {"ctx.email": "{{ output.result.email }}"}}}},
    ]
    assert_valid(r.text)


def test_step_when_becomes_admission_rules():
    r, doc = migrate(
        V2_HEAD
        + y("""
        workflow:
          - step: start
            when: "{{ workload.enabled }}"
            tool: {kind: noop}
        """)
    )
    s = step(doc, "start")
    assert "when" not in s
    assert s["spec"]["policy"]["admit"]["rules"] == [
        {"when": "{{ workload.enabled }}", "then": {"allow": True}},
        {"else": {"then": {"allow": False}}},
    ]
    assert_valid(r.text)


def test_case_sink_becomes_a_storage_task_with_policy_rules_and_case_next_becomes_arcs():
    r, doc = migrate(
        V2_HEAD
        + y("""
        workflow:
          - step: fetch
            tool: {kind: http, url: "http://x"}
            case:
              - when: "{{ event.name == 'call.error' }}"
                then:
                  retry: {max_attempts: 3, initial_delay: 0.1, backoff_multiplier: 2.0}
              - when: "{{ event.name == 'call.done' and response.status_code == 200 }}"
                then:
                  sink:
                    tool: {kind: postgres, auth: pg_local, table: public.t, mode: upsert, key: id}
                    args: {id: "{{ response.data.id }}", v: "{{ result.v }}"}
              - when: "{{ event.name == 'call.done' and response.data.more }}"
                then:
                  next: [{step: again}]
            next: [{step: done}]
          - {step: again, tool: {kind: noop}}
          - {step: done, tool: {kind: noop}}
        """)
    )
    s = step(doc, "fetch")
    assert "case" not in s
    main, sink = s["tool"]
    assert main["name"] == "fetch" and sink["name"] == "fetch_sink"
    assert main["spec"]["policy"]["rules"] == [
        {"when": "{{ output.status == 'error' }}",
         "then": {"do": "retry", "attempts": 3, "backoff": "exponential", "delay": 0.1}},
        {"when": "{{ output.status == 'ok' and output.result.status_code == 200 }}",
         "then": {"do": "jump", "to": "fetch_sink"}},
        {"when": "{{ output.status == 'ok' }}", "then": {"do": "break"}},
    ]  # fmt: skip
    assert sink["kind"] == "postgres" and sink["auth"] == "pg_local"
    assert sink["command"].startswith(
        "INSERT INTO public.t (id, v)\nVALUES (%(id)s, %(v)s)\nON CONFLICT (id)"
    )
    assert sink["params"] == {"id": "{{ results.fetch.data.id }}", "v": "{{ results.fetch.data.v }}"}
    # the legacy worker logged a failed sink and carried on
    assert sink["spec"]["policy"]["rules"] == [{"else": {"then": {"do": "continue"}}}]
    assert s["next"] == {"spec": {"mode": "exclusive"}, "arcs": [
        {"step": "again", "when": "{{ event.name == 'call.done' and fetch.data.more }}"}, {"step": "done"}]}  # fmt: skip
    assert_valid(r.text)


def test_step_sink_keeps_the_step_result_when_a_later_step_reads_it():
    r, doc = migrate(
        V2_HEAD
        + y("""
        workflow:
          - step: make
            tool: {kind: python, code: "result = {'a': 1}"}
            sink:
              tool: {kind: duckdb, table: t, mode: insert}
              args: {a: "{{ result.a }}"}
            next: [{step: read}]
          - step: read
            tool: {kind: python, args: {v: "{{ make.a }}"}, code: "result = v"}
        """)
    )
    tools = step(doc, "make")["tool"]
    assert [t["name"] for t in tools] == ["make", "make_sink", "make_result"]
    assert tools[1]["command"] == "INSERT INTO t (a)\nVALUES ($a);\n"
    assert tools[1]["params"] == {
        "a": "{{ (results.make.data if results.make.data is defined else results.make).a }}"
    }
    assert tools[2] == {"name": "make_result", "kind": "noop", "result": "{{ results.make }}"}
    assert_valid(r.text)


def test_v1_save_with_a_statement_and_the_event_log_sink():
    r, doc = migrate(
        y("""
        apiVersion: noetl.io/v1
        kind: Playbook
        metadata: {name: d, path: d}
        workflow:
          - step: start
            type: python
            code: "result = {'status': 'success', 'data': {'kind': 'x'}}"
            save:
              storage:
                type: postgres
                statement: "INSERT INTO s (kind, run) VALUES ('{{ data.kind }}', :run)"
                args: {run: "{{ execution_id }}"}
                auth: pg_local
            next: [{step: end}]
          - step: end
            desc: done
            save: {storage: event_log, args: "{{ result }}"}
        """)
    )
    tools = step(doc, "start")["tool"]
    assert (
        tools[1]["command"]
        == "INSERT INTO s (kind, run) VALUES ('{{ (results.start.data if results.start.data is defined else results.start).kind }}', :run)"
    )
    assert "save" not in step(doc, "end")
    assert any(n.rule == "save" and "event log" in n.message for n in r.notes)
    assert_valid(r.text)


def test_v1_iterator_becomes_a_loop_step():
    r, doc = migrate(
        y("""
        apiVersion: noetl.io/v1
        kind: Playbook
        metadata: {name: d, path: d}
        workflow:
          - step: start
            type: iterator
            collection: "{{ workload.items }}"
            element: item
            mode: parallel
            task:
              type: python
              data: {x: "{{ item }}"}
              code: "def main(x):\\n    return x * 2"
        """)
    )
    s = step(doc, "start")
    assert s["loop"] == {"in": "{{ workload.items }}", "iterator": "item", "spec": {"mode": "parallel"}}
    assert s["tool"]["kind"] == "python" and s["tool"]["input"] == {"x": "{{ item }}"}
    assert_valid(r.text)


V1_LOOP = y("""
    apiVersion: noetl.io/v1
    kind: Playbook
    name: loop_demo
    path: tests/loop_demo
    workload:
      numbers: [1, 5, 12]
    workflow:
      - step: start
        next:
          - step: each
      - step: each
        loop:
          in: "{{ workload.numbers }}"
          iterator: n
        next:
          - step: square
            with: {value: "{{ n }}"}
      - step: square
        type: python
        code: |
          def main(value):
              return {"sq": value * value}
        next:
          - when: "{{ square.sq > 100 }}"
            then:
              - step: big
                with: {v: "{{ square.sq }}"}
          - else:
              - step: small
      - step: big
        type: python
        code: |
          def main(v):
              return {"label": "big", "v": v}
        next:
          - step: done_each
      - step: small
        type: python
        code: "result = {'label': 'small'}"
        next:
          - step: done_each
      - step: done_each
        end_loop: each
        result:
          squares: "{{ each_results | map(attribute='square') | map(attribute='sq') | list }}"
          last: "{{ square }}"
        next:
          - step: report
            with: {squares: "{{ squares }}"}
      - step: report
        type: python
        code: |
          def main(squares):
              return {"total": sum(squares)}
    """)


def test_v1_loop_with_end_loop_folds_its_chain_into_the_loop_pipeline():
    r, doc = migrate(V1_LOOP)
    each = step(doc, "each")
    labels = [next(iter(t)) if "name" not in t else t["name"] for t in each["tool"]]
    assert labels == ["each_bind", "square", "big", "small", "each_iteration"]
    square = each["tool"][1]
    assert square["spec"]["policy"]["rules"] == [
        {"when": "{{ output.status == 'ok' and output.result.sq > 100 }}",
         "then": {"do": "continue", "set": {"iter.v": "{{ output.result.sq }}"}}},
        {"when": "{{ output.status == 'ok' }}", "then": {"do": "jump", "to": "small"}},
    ]  # fmt: skip
    assert each["tool"][2]["spec"]["policy"]["rules"] == [
        {"when": "{{ output.status == 'ok' }}", "then": {"do": "jump", "to": "each_iteration"}}
    ]
    assert each["next"] == {"spec": {"mode": "exclusive"}, "arcs": [{"step": "done_each"}]}
    assert [s["step"] for s in doc["workflow"]] == ["start", "each", "done_each", "report"]
    end = step(doc, "done_each")
    assert end["tool"]["result"] == {
        "squares": "{{ each.results | map(attribute='square') | map(attribute='sq') | list }}",
        "last": "{{ (each.results | last).square }}",
    }
    assert end["next"]["arcs"] == [
        {
            "step": "report",
            "when": "{{ event.name != 'call.error' }}",
            "set": {"step.squares": "{{ done_each.squares }}"},
        }
    ]
    assert_valid(r.text)


def test_v1_loop_fold_runs_each_branch(data_dir, tmp_path):
    from noetl_dagster.runners.local import run_playbook

    r = migrate_text(V1_LOOP, "loop.yaml")
    p = tmp_path / "loop.yaml"
    p.write_text(r.text)
    res = run_playbook(p)
    assert res.status == "completed", res.to_json()
    iters = res.results["each"]["results"]
    assert [i["square"]["sq"] for i in iters] == [1, 25, 144]
    assert [(i["big"] or i["small"])["label"] for i in iters] == ["small", "small", "big"]
    assert iters[2]["big"]["v"] == 144  # the value routed with `with` reached main(v)
    assert res.results["done_each"]["squares"] == [1, 25, 144]
    assert res.results["report"] == {"total": 170}


def test_v1_workbook_task_reads_the_callers_values_through_args():
    r, doc = migrate(
        y("""
        apiVersion: noetl.io/v1
        kind: Playbook
        metadata: {name: d, path: d}
        workflow:
          - step: start
            type: workbook
            task: post
            with: {city: "{{ workload.city }}"}
        workbooks:
          - name: post
            type: http
            method: POST
            endpoint: "http://x/{{ city }}"
            payload: {name: "{{ city }}", run: "{{ execution_id }}"}
        """)
    )
    tool = doc["workbook"][0]["tool"]
    assert tool["endpoint"] == "http://x/{{ args.city }}"
    assert tool["payload"] == {"name": "{{ args.city }}", "run": "{{ execution_id }}"}
    assert_valid(r.text)


def test_v1_task_name_results_become_step_results():
    r, doc = migrate(
        y("""
        apiVersion: noetl.io/v1
        kind: Playbook
        metadata: {name: d, path: d}
        workflow:
          - step: start
            type: workbook
            task: compute
            next:
              - when: "{{ compute.ok }}"
                then: [{step: end, with: {r: "{{ compute }}"}}]
          - {step: end, desc: x}
        workbooks:
          - {name: compute, type: python, code: "result = {'ok': True}"}
        """)
    )
    arc = step(doc, "start")["next"]["arcs"][0]
    assert arc["when"] == "{{ event.name != 'call.error' and start.ok }}"
    assert arc["set"] == {"step.r": "{{ start }}"}  # arc args, renamed (issue 32.5)


def test_legacy_postgres_statement_results_keep_their_shape_where_the_file_reads_it():
    r, doc = migrate(
        V2_HEAD
        + y("""
        workflow:
          - step: q
            tool: {kind: postgres, auth: pg_local, command: "SELECT 1 AS one"}
            vars:
              res: "{{ result }}"
            next: [{step: use}]
          - step: use
            tool:
              kind: python
              args: {rows: "{{ q.command_0.rows }}", res: "{{ vars.res }}"}
              code: "result = res['command_0']['rows']"
        """)
    )
    assert step(doc, "q")["set"] == {"ctx.res": "{{ {'command_0': q} }}"}
    assert step(doc, "use")["tool"]["input"]["rows"] == "{{ q.rows }}"
    assert any(n.rule == "postgres-result" for n in r.notes)


def test_comments_key_order_and_quotes_survive():
    src = y("""
        # header comment
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata:
          name: t   # trailing
          path: 't'
        workflow:
          # before the first step
          - step: start
            desc: 'single-quoted'
            tool: {kind: noop}
            next:
              - step: end   # go on

          - step: end
            tool: {kind: noop}
        """)
    r = migrate_text(src, "c.yaml")
    assert r.text.startswith("# header comment\napiVersion: noetl.io/v2")
    assert "name: t   # trailing" in r.text and "path: 't'" in r.text
    assert "# before the first step" in r.text and "desc: 'single-quoted'" in r.text
    assert "\n\n  - step: end" in r.text  # the blank line between steps is kept
    assert_valid(r.text)


def test_migrated_files_have_no_legacy_construct_left():
    for text in (V1_LOOP,):
        r = migrate_text(text, "x.yaml")
        assert find_legacy_constructs(yaml.safe_load(r.text)) == []


def test_sink_to_a_table_storage_kind_names_the_resource_and_writes_one_record():
    r, doc = migrate(
        V2_HEAD
        + y("""
        workflow:
          - step: fetch
            tool: {kind: http, url: "http://x"}
            sink:
              tool: {kind: iceberg, table: orders, mode: append}
              args: {id: "{{ response.data.id }}"}
        """)
    )
    sink = step(doc, "fetch")["tool"][1]
    assert sink == {"name": "fetch_sink", "kind": "iceberg", "resource": "orders",
                    "data": [{"id": "{{ results.fetch.data.id }}"}]}  # fmt: skip
    assert_valid(r.text)
