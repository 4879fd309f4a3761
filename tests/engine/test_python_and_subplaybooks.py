"""SEMANTICS §6: the python tool's conventions (incl. process isolation with a
timeout), noop, workbook, and sub-playbooks by catalog path and relative path."""

from __future__ import annotations

import base64

import pytest

HEAD = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: py, path: tests/py}
"""


def _py(run_pb, tool: str, workload=None, extra: str = ""):
    return run_pb(HEAD + "workflow:\n  - step: start\n    tool:\n" + tool + extra, workload)


# -- python conventions -------------------------------------------------------------


def test_python_result_global(run_pb):
    r = _py(
        run_pb,
        """
      kind: python
      input: {a: 2}
      code: "result = a * 21"
""",
    )
    assert r.results["start"] == 42


def test_python_main_kwargs_bound_by_name(run_pb):
    r = _py(
        run_pb,
        """
      kind: python
      input: {a: 1, b: 2, unused: 3}
      code: |
        def main(b, a, input_data, context):
            return {"a": a, "b": b, "keys": sorted(input_data), "exec": context["execution_id"] is not None}
""",
    )
    assert r.results["start"] == {"a": 1, "b": 2, "keys": ["a", "b", "unused"], "exec": True}


def test_python_main_with_defaults_and_kwargs(run_pb):
    r = _py(
        run_pb,
        """
      kind: python
      input: {a: 1, extra: x}
      code: |
        def main(a, missing=5, **kw):
            return [a, missing, kw]
""",
    )
    assert r.results["start"] == [1, 5, {"extra": "x"}]


def test_python_top_level_return(run_pb):
    r = _py(
        run_pb,
        """
      kind: python
      input: {v: 3}
      code: |
        if v > 2:
            return {"big": True}
        return {"big": False}
""",
    )
    assert r.results["start"] == {"big": True}


def test_python_input_data_and_json_looking_strings_are_parsed(run_pb):
    r = _py(
        run_pb,
        """
      kind: python
      input:
        obj: '{"k": [1, 2]}'
        arr: "[1, 2, 3]"
        text: "{not json"
        rendered: "{{ workload.payload | tojson }}"
      code: |
        result = {"obj": obj["k"], "arr": sum(arr), "text": text, "rendered": rendered["z"], "n": len(input_data)}
""",
        {"payload": {"z": 1}},
    )
    assert r.results["start"] == {"obj": [1, 2], "arr": 6, "text": "{not json", "rendered": 1, "n": 4}


def test_python_keys_beside_code_are_inputs(run_pb):
    r = _py(
        run_pb,
        """
      kind: python
      greeting: "hi {{ workload.who }}"
      code: "result = greeting"
""",
        {"who": "bob"},
    )
    assert r.results["start"] == "hi bob"


def test_python_code_b64(run_pb):
    code = base64.b64encode(b"result = 'from b64'").decode()
    r = _py(
        run_pb,
        f"""
      kind: python
      code_b64: {code}
""",
    )
    assert r.results["start"] == "from b64"


def test_python_script_relative_to_the_playbook(run_pb, write_pb):
    write_pb("def main(x):\n    return x + 1\n", "scripts/inc.py")
    r = _py(
        run_pb,
        """
      kind: python
      script: scripts/inc.py
      input: {x: 1}
""",
    )
    assert r.results["start"] == 2


def test_python_code_is_not_rendered_as_a_template(run_pb):
    r = _py(
        run_pb,
        """
      kind: python
      code: "result = '{{ not rendered }}'"
""",
    )
    assert r.results["start"] == "{{ not rendered }}"


def test_python_exception_is_an_error_outcome_with_exception_type(run_pb):
    r = _py(
        run_pb,
        """
      kind: python
      code: |
        def main():
            raise ZeroDivisionError("nope")
""",
    )
    assert r.status == "failed"
    out = r.task_done("start")[0].data["outcome"]
    assert out["error"]["kind"] == "python_exception"
    assert out["py"]["exception_type"] == "ZeroDivisionError"
    assert "ZeroDivisionError" in out["py"]["traceback"]


def test_python_syntax_error_is_an_error_outcome(run_pb):
    r = _py(
        run_pb,
        """
      kind: python
      code: "def broken(:"
""",
    )
    out = r.task_done("start")[0].data["outcome"]
    assert r.status == "failed"
    assert out["error"]["kind"] == "python_syntax"
    assert out["py"]["exception_type"] == "SyntaxError"


def test_python_result_with_status_error_is_an_error_outcome(run_pb):
    r = _py(
        run_pb,
        """
      kind: python
      code: "result = {'status': 'error', 'message': 'told to fail'}"
""",
    )
    assert r.status == "failed"
    out = r.task_done("start")[0].data["outcome"]
    assert out["status"] == "error" and out["error"]["message"] == "told to fail"
    assert out["result"] == {"status": "error", "message": "told to fail"}


def test_python_result_with_status_ok_is_ok(run_pb):
    r = _py(
        run_pb,
        """
      kind: python
      code: "result = {'status': 'success', 'v': 1}"
""",
    )
    assert r.status == "completed"


def test_python_print_does_not_break_the_run(run_pb, capsys):
    r = _py(
        run_pb,
        """
      kind: python
      code: |
        print("hello from the step")
        result = 1
""",
    )
    assert r.status == "completed"
    assert "hello from the step" not in capsys.readouterr().out


def test_python_isolation_process(run_pb):
    r = _py(
        run_pb,
        """
      kind: python
      spec: {isolation: process, timeout: 20}
      input: {a: 2}
      code: |
        import os
        def main(a, context):
            return {"pid": os.getpid(), "a": a, "wl": context["workload"]["w"]}
""",
        {"w": "x"},
    )
    import os

    res = r.results["start"]
    assert res["a"] == 2 and res["wl"] == "x"
    assert res["pid"] != os.getpid()


def test_python_isolation_process_exception(run_pb):
    r = _py(
        run_pb,
        """
      kind: python
      spec: {isolation: process, timeout: 20}
      code: "raise KeyError('k')"
""",
    )
    out = r.task_done("start")[0].data["outcome"]
    assert r.status == "failed" and out["py"]["exception_type"] == "KeyError"


def test_python_isolation_process_timeout(run_pb):
    r = _py(
        run_pb,
        """
      kind: python
      spec: {isolation: process, timeout: 0.5}
      code: |
        import time
        time.sleep(30)
""",
    )
    out = r.task_done("start")[0].data["outcome"]
    assert r.status == "failed"
    assert out["error"]["kind"] == "timeout" and out["error"]["retryable"] is True
    assert out["meta"]["duration_ms"] < 10_000


# -- noop and workbook --------------------------------------------------------------


def test_noop_result(run_pb):
    r = _py(
        run_pb,
        """
      - a: {kind: noop}
      - b: {kind: noop, result: "{{ _prev }}"}
""",
    )
    assert r.results["start"] == {"status": "noop"}


WORKBOOK = (
    HEAD
    + """
workbook:
  - name: double
    tool:
      kind: python
      input: {x: 0, factor: 2}
      code: "result = {'v': x * factor}"
workflow:
  - step: start
    tool:
      kind: workbook
      name: double
      input: {x: "{{ workload.x }}"}
"""
)


def test_workbook_runs_the_entry_with_merged_input(run_pb):
    r = run_pb(WORKBOOK, {"x": 21})
    assert r.results["start"] == {"v": 42}


def test_workbook_entry_failure_is_an_error_outcome(run_pb):
    r = run_pb(WORKBOOK.replace("x * factor", "x / factor"), {"x": "a"})
    assert r.status == "failed"
    out = r.task_done("start")[0].data["outcome"]
    assert out["py"]["exception_type"] == "TypeError"


# -- sub-playbooks ------------------------------------------------------------------

CHILD = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: child, path: catalog/tests/child}
workload: {n: 1}
workflow:
  - step: start
    tool: {kind: noop, result: {doubled: "{{ workload.n * 2 }}"}}
    next: {arcs: [{step: last}]}
  - step: last
    tool: {kind: noop, result: {last: "{{ start.doubled + 1 }}"}}
"""

PARENT = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: parent, path: tests/parent}
workflow:
  - step: start
    tool:
      kind: playbook
      path: PATH
      input: {n: 5}
      RETURN
"""


def _parent(path: str, return_step: str | None = None) -> str:
    return PARENT.replace("PATH", path).replace(
        "RETURN", f"return_step: {return_step}" if return_step else ""
    )


@pytest.mark.parametrize("ref", ["catalog/tests/child", "tests/child", "./sub/child.yaml", "sub/child"])
def test_sub_playbook_by_catalog_path_or_relative_path(run_pb, write_pb, ref):
    write_pb(CHILD, "sub/child.yaml")
    r = run_pb(_parent(ref))
    assert r.status == "completed", r.results
    res = r.results["start"]
    assert res["last"] == 11  # the child's last step result, with its execution id
    child_id = res["execution_id"]
    assert child_id != r.result.execution_id


def test_sub_playbook_return_step_and_child_events(run_pb, write_pb):
    from engine_helpers import read_events

    from noetl_dagster.runners.local import ExecutionResult

    write_pb(CHILD, "sub/child.yaml")
    r = run_pb(_parent("catalog/tests/child", "start"))
    res = r.results["start"]
    assert res["doubled"] == 10
    child = read_events(ExecutionResult(res["execution_id"], "", {}, {}, {}, r.result.event_store_url))
    assert child, "the child execution has its own event log"
    assert {e.parent_execution_id for e in child} == {r.result.execution_id}
    assert child[0].name == "playbook.execution.requested"
    assert child[0].data["parent_execution_id"] == r.result.execution_id
    assert child[0].data["workload"] == {"n": 5}
    assert child[-1].name == "playbook.processed"
    # the parent's own events carry no parent
    assert {e.parent_execution_id for e in r.events} == {None}
    # the child's log replays on its own (conftest only sees top-level executions)
    from noetl_dagster.engine.replay import replay
    from noetl_dagster.storage.event_stores import open_event_store

    with open_event_store(r.result.event_store_url) as store:
        state = replay(store, res["execution_id"])
    assert state.status == "completed" and state.parent_execution_id == r.result.execution_id
    assert state.results["start"] == {"doubled": 10} and state.runs == {"start": 1, "last": 1}


def test_sub_playbook_from_catalog_dir(run_pb, write_pb, tmp_path):
    other = tmp_path / "elsewhere"
    write_pb(CHILD, "child.yaml", base=other)
    parent = write_pb(_parent("catalog/tests/child"), "p/parent.yaml")
    r = run_pb(parent)  # not found next to the parent
    assert r.status == "failed"
    assert r.task_done("start")[0].data["outcome"]["error"]["kind"] == "playbook_not_found"
    r = run_pb(parent, catalog_dirs=[other])
    assert r.status == "completed" and r.results["start"]["last"] == 11


def test_failing_sub_playbook_is_an_error_outcome(run_pb, write_pb):
    write_pb(
        CHILD.replace(
            '{kind: noop, result: {last: "{{ start.doubled + 1 }}"}}',
            "{kind: python, code: \"raise RuntimeError('child broke')\"}",
        ),
        "sub/child.yaml",
    )
    r = run_pb(_parent("catalog/tests/child"))
    assert r.status == "failed"
    out = r.task_done("start")[0].data["outcome"]
    assert out["error"]["kind"] == "playbook_failed"
    assert out["result"]["status"] == "failed"
    assert "child broke" in out["error"]["message"]


def test_sub_playbook_in_a_loop(run_pb, write_pb):
    write_pb(CHILD, "sub/child.yaml")
    r = run_pb(
        HEAD
        + """
workflow:
  - step: start
    loop: {in: "{{ [1, 2, 3] }}", iterator: n}
    tool:
      kind: playbook
      path: ./sub/child.yaml
      input: {n: "{{ iter.n }}"}
"""
    )
    assert [x["last"] for x in r.results["start"]["results"]] == [3, 5, 7]
    assert len({x["execution_id"] for x in r.results["start"]["results"]}) == 3


def test_invalid_sub_playbook_is_an_error_outcome(run_pb, write_pb):
    write_pb(CHILD.replace("workload: {n: 1}", "vars: {n: 1}"), "sub/child.yaml")
    r = run_pb(_parent("./sub/child.yaml"))
    assert r.status == "failed"
    out = r.task_done("start")[0].data["outcome"]
    assert out["status"] == "error" and "root-vars" in out["error"]["message"]
