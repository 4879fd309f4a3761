"""kind: shell / script against real processes (/bin/sh, this Python), in and out of the engine."""

from __future__ import annotations

import time

import pytest

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.dsl.kinds import ToolConfigError, get_tool
from noetl_dagster.engine.ports import ToolError
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.payload import ResultRef
from noetl_dagster.tools.shell import script_tool, shell_tool


def test_shell_runs_commands_with_env_in_the_work_directory(make_ctx, tmp_path, monkeypatch):
    monkeypatch.setenv("NOETL_SECRET_FROM_WORKER", "must-not-leak")
    ctx = make_ctx()
    out = shell_tool(
        {
            "cmds": ["echo hello $GREETING; pwd", 'echo err >&2; echo -n "[$NOETL_SECRET_FROM_WORKER]"'],
            "env": {"GREETING": "world"},
        },
        ctx,
    )
    work = tmp_path / "data" / "work" / "exec-test"
    assert out["returncode"] == 0
    assert out["stdout"] == f"hello world\n{work.resolve()}\n[]"
    assert out["stderr"] == "err\n"
    assert [c["returncode"] for c in out["commands"]] == [0, 0]
    assert out["cwd"] == str(work.resolve())


def test_nonzero_exit_is_an_error_with_the_exit_code_and_stops(make_ctx):
    with pytest.raises(ToolError) as ei:
        shell_tool({"cmds": ["echo first", "echo boom >&2; exit 3", "echo never"]}, make_ctx())
    e = ei.value
    assert e.kind == "exit_code" and e.code == 3 and not e.retryable
    assert "exited with code 3" in e.message and "boom" in e.message
    assert e.result["stdout"] == "first\n" and len(e.result["commands"]) == 2


def test_timeout_kills_the_process_group(make_ctx):
    t0 = time.monotonic()
    with pytest.raises(ToolError) as ei:
        shell_tool({"cmd": "sleep 30 & sleep 30; echo late", "timeout_seconds": 0.5}, make_ctx())
    assert time.monotonic() - t0 < 10
    assert ei.value.kind == "timeout" and ei.value.retryable
    assert ei.value.result["returncode"] == -1


def test_cwd_is_confined_to_the_work_directory(make_ctx, tmp_path):
    ctx = make_ctx()
    out = shell_tool({"cmd": "pwd > here.txt; cat here.txt", "cwd": "sub/dir"}, ctx)
    assert out["stdout"].strip().endswith("work/exec-test/sub/dir")
    for bad in ("/tmp", "../..", "sub/../../x"):
        with pytest.raises(ToolError) as ei:
            shell_tool({"cmd": "true", "cwd": bad}, ctx)
        assert (
            ei.value.kind == "config_error" and "outside the execution's work directory" in ei.value.message
        )
    # turned off explicitly: any directory, the worker's environment
    out = shell_tool({"cmd": "pwd", "cwd": str(tmp_path), "sandbox": False}, ctx)
    assert out["stdout"].strip() == str(tmp_path)


def test_generated_playbooks_cannot_turn_the_sandbox_off(make_ctx):
    ctx = make_ctx()
    ctx.restricted = True
    with pytest.raises(ToolError, match="cannot turn the sandbox off"):
        shell_tool({"cmd": "true", "sandbox": False}, ctx)


def test_large_output_is_capped_and_stored_by_reference(make_ctx):
    ctx = make_ctx()
    out = shell_tool({"cmd": "yes abcdefghij | head -c 300000", "max_output_bytes": 1000}, ctx)
    assert len(out["stdout"]) == 1000 and out["stdout_truncated"] and out["stdout_bytes"] == 300000
    ref = ResultRef.from_dict(out["stdout_ref"]["$ref"])
    data = ctx.payload_store.get_verified(ref)
    assert len(data) == 300000 and data.startswith(b"abcdefghij\n")
    assert "stderr_ref" not in out


def test_script_runs_inline_python_and_files_with_args(make_ctx, tmp_path):
    ctx = make_ctx()
    out = script_tool(
        {
            "code": "import sys, os; print(sys.argv[1:], os.getcwd().endswith('exec-test'))",
            "interpreter": "python",
            "args": ["a", 2],
        },
        ctx,
    )
    assert out["stdout"] == "['a', '2'] True\n"
    f = tmp_path / "job.sh"
    f.write_text("echo from-file $1\nexit 4\n")
    with pytest.raises(ToolError) as ei:
        script_tool({"script": {"path": str(f)}, "args": ["x"]}, ctx)
    assert ei.value.code == 4 and ei.value.result["stdout"] == "from-file x\n"
    with pytest.raises(ToolError, match="cannot read"):
        script_tool({"script": str(tmp_path / "missing.sh")}, ctx)


def test_bad_config_is_a_one_line_validation_error():
    tk = get_tool("shell")
    with pytest.raises(ToolConfigError) as ei:
        tk.check_config({"cmds": [{"not": "a string"}], "timeout_seconds": -1})
    msg = str(ei.value)
    assert "kind 'shell': invalid config" in msg and "timeout_seconds" in msg and "\n" not in msg


def _pb(workflow):
    return load_playbook_dict(
        {
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": {"name": "sh", "path": "tests/sh"},
            "workflow": workflow,
        }
    )


def test_shell_in_a_playbook_success_and_error_outcome(tmp_path):
    pb = _pb(
        [
            {
                "step": "start",
                "tool": {"kind": "shell", "cmds": ["echo -n {{ workload.word }}"]},
                "next": {"arcs": [{"step": "fail"}]},
            },
            {
                "step": "fail",
                "tool": {
                    "kind": "shell",
                    "cmd": "exit 7",
                    "spec": {
                        "policy": {
                            "rules": [
                                {
                                    "when": "{{ output.status == 'error' and output.error.code == 7 }}",
                                    "then": {"do": "continue"},
                                }
                            ]
                        }
                    },
                },
                "next": {"arcs": [{"step": "end"}]},
            },
            {
                "step": "end",
                "tool": {
                    "kind": "python",
                    "input": {"w": "{{ start.stdout }}", "rc": "{{ fail.returncode }}"},
                    "code": "result = {'w': w, 'rc': rc}",
                },
            },
        ]
    )
    res = run_playbook(pb, workload={"word": "hi"}, data_dir=tmp_path)
    assert res.status == "completed", res
    assert res.results["end"] == {"w": "hi", "rc": 7}
    pb2 = _pb([{"step": "start", "tool": {"kind": "shell", "cmd": "exit 5"}}])
    res2 = run_playbook(pb2, data_dir=tmp_path)
    assert res2.status == "failed"
