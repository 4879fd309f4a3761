"""SEMANTICS §8: `validate` and `run` as a stable interface; bad input is a
one-line error with exit 2 and never a traceback. The error paths run the real
command in a subprocess (what a user sees); the rest use click's runner."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from noetl_dagster.commands.main import cli

GOOD = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: cli_ok, path: tests/cli_ok}
workload: {n: 2}
workflow:
  - step: start
    tool: {kind: noop, result: "{{ workload.n * 2 }}"}
    set: {ctx.doubled: "{{ start }}"}
    next: {arcs: [{step: end}]}
  - step: end
    tool: {kind: noop}
"""

RAISES = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: cli_bad, path: tests/cli_bad}
workflow:
  - step: start
    tool:
      kind: python
      code: |
        def main():
            raise RuntimeError("tool blew up")
"""

INVALID = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: cli_invalid, path: tests/cli_invalid}
vars: {a: 1}
workflow:
  - step: start
    tool: {kind: teleport}
    next: {arcs: [{step: ghost}]}
"""


@pytest.fixture
def files(tmp_path):
    def _f(name: str, text: str):
        p = tmp_path / name
        p.write_text(textwrap.dedent(text).lstrip("\n"))
        return p

    return _f


def _cli(*args: str, env_home) -> subprocess.CompletedProcess:
    env = {**os.environ, "NOETL_DAGSTER_HOME": str(env_home), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=60)  # fmt: skip


def _assert_one_line_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0], lines[0]
    assert proc.stdout == ""


# -- bad input: subprocess, exactly what a user sees ------------------------------


def test_run_malformed_yaml(files, data_dir):
    p = files("broken.yaml", "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: x, path: [y}\n")
    _assert_one_line_error(_cli("run", p, env_home=data_dir), f"{p}:3: yaml-syntax:")


def test_run_non_playbook(files, data_dir):
    p = files("other.yaml", "apiVersion: v1\nkind: ConfigMap\ndata: {a: b}\n")
    _assert_one_line_error(_cli("run", p, env_home=data_dir), f"{p}:2: not-a-playbook:")


def test_run_missing_file(tmp_path, data_dir):
    p = tmp_path / "nope.yaml"
    _assert_one_line_error(_cli("run", p, env_home=data_dir), "no such playbook file")


def test_run_bad_workload_json(files, data_dir):
    p = files("good.yaml", GOOD)
    _assert_one_line_error(
        _cli("run", p, "--workload", "{n: 1", env_home=data_dir), "--workload is not valid JSON"
    )


# -- the rest in-process -------------------------------------------------------------


def _invoke(*args, data_dir):
    # wide terminal: rich must not wrap the summary lines
    return CliRunner().invoke(
        cli, [str(a) for a in args], env={"NOETL_DAGSTER_HOME": str(data_dir), "COLUMNS": "300"}
    )


def test_tool_exception_never_prints_a_traceback(files, data_dir):
    r = _invoke("run", files("raises.yaml", RAISES), data_dir=data_dir)
    assert r.exit_code == 1
    assert isinstance(r.exception, SystemExit)  # a clean exit, not an escaped exception
    assert "Traceback" not in r.stdout + r.stderr
    assert "failed" in r.stdout and "tool blew up" in r.stdout
    assert "event log:" in r.stdout


def test_validate_exits_1_with_file_line_rule_lines(files, data_dir):
    bad = files("invalid.yaml", INVALID)
    good = files("good.yaml", GOOD)
    r = _invoke("validate", good, bad, data_dir=data_dir)
    assert r.exit_code == 1
    lines = r.stdout.splitlines()
    parsed = [re.match(rf"^{re.escape(str(bad))}:(\d+): ([a-z-]+): (.+)$", line) for line in lines]
    assert all(parsed), lines  # one `FILE:LINE: RULE: message` line per error, none for the valid file
    assert {m.group(2): int(m.group(1)) for m in parsed} == {
        "root-vars": 4,
        "unknown-tool-kind": 7,
        "unknown-arc-target": 8,
    }
    assert "'ghost'" in lines[-1] and "'teleport'" in lines[1]
    assert "Traceback" not in r.stderr


def test_validate_ok(files, data_dir):
    r = _invoke("validate", files("good.yaml", GOOD), data_dir=data_dir)
    assert r.exit_code == 0 and r.stdout == ""


def test_validate_json(files, data_dir):
    r = _invoke("validate", "--json", files("invalid.yaml", INVALID), data_dir=data_dir)
    assert r.exit_code == 1
    issues = json.loads(r.stdout)
    assert {i["rule"] for i in issues} >= {"root-vars", "unknown-tool-kind", "unknown-arc-target"}
    assert all({"file", "line", "path", "rule", "message"} <= set(i) for i in issues)


def test_validate_missing_file_exits_2(tmp_path, data_dir):
    r = _invoke("validate", tmp_path / "absent.yaml", data_dir=data_dir)
    assert r.exit_code == 2


def test_run_invalid_playbook_exits_2_with_issue_lines(files, data_dir):
    r = _invoke("run", files("invalid.yaml", INVALID), data_dir=data_dir)
    assert r.exit_code == 2
    assert "unknown-arc-target" in r.stderr and r.stdout == ""


@pytest.mark.parametrize("workload", ["[1, 2]", "3", '"s"'])
def test_run_workload_must_be_an_object(files, data_dir, workload):
    r = _invoke("run", files("good.yaml", GOOD), "--workload", workload, data_dir=data_dir)
    assert r.exit_code == 2 and "JSON object" in r.stderr


def test_run_json_prints_exactly_the_contract(files, data_dir):
    r = _invoke("run", files("good.yaml", GOOD), "--json", "--workload", '{"n": 5}', data_dir=data_dir)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert list(out) == ["execution_id", "status", "ctx", "results", "runs"]
    assert out["status"] == "completed"
    assert out["ctx"] == {"doubled": 10}
    assert out["results"] == {"start": 10, "end": {"status": "noop"}}
    assert out["runs"] == {"start": 1, "end": 1}
    assert r.stdout.count("\n") == 1  # one JSON object, one line


def test_run_json_failed_exits_1(files, data_dir):
    r = _invoke("run", files("raises.yaml", RAISES), "--json", data_dir=data_dir)
    assert r.exit_code == 1
    out = json.loads(r.stdout)
    assert set(out) == {"execution_id", "status", "ctx", "results", "runs"}
    assert out["status"] == "failed"
    assert out["results"]["start"]["status"] == "error"
    assert "tool blew up" in out["results"]["start"]["error"]["message"]


def test_run_workload_from_file(files, data_dir, tmp_path):
    wl = tmp_path / "wl.json"
    wl.write_text('{"n": 7}')
    r = _invoke("run", files("good.yaml", GOOD), "--json", "--workload", f"@{wl}", data_dir=data_dir)
    assert json.loads(r.stdout)["results"]["start"] == 14


def test_events_replay_and_executions_commands(files, data_dir):
    r = _invoke("run", files("raises.yaml", RAISES), "--json", data_dir=data_dir)
    eid = json.loads(r.stdout)["execution_id"]
    ev = _invoke("events", eid, "--json", data_dir=data_dir)
    assert ev.exit_code == 0
    events = [json.loads(line) for line in ev.stdout.splitlines()]
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["name"] == "playbook.processed"
    rp = _invoke("replay", eid, "--json", data_dir=data_dir)
    assert rp.exit_code == 0
    state = json.loads(rp.stdout)
    assert state["status"] == "failed" and state["runs"] == {"start": 1} and state["pending_tokens"] == []
    ex = _invoke("executions", "--json", data_dir=data_dir)
    assert eid in {row["execution_id"] for row in json.loads(ex.stdout)}
    assert _invoke("events", "no-such-id", data_dir=data_dir).exit_code == 2
    assert _invoke("replay", "no-such-id", data_dir=data_dir).exit_code == 2


def test_run_summary_names_the_event_log(files, data_dir):
    r = _invoke("run", files("good.yaml", GOOD), "--quiet", data_dir=data_dir)
    assert r.exit_code == 0
    assert "completed" in r.stdout and "event log: local://" in r.stdout  # the local mode (issue 46)
    r = _invoke("run", files("good.yaml", GOOD), "--quiet", "--durable", data_dir=data_dir)
    assert r.exit_code == 0
    assert "completed" in r.stdout and "event log:" in r.stdout and "events.db" in r.stdout
