"""Every tool kind of NoETL's schema and Rust worker is recognized (issue 32.4): `iterator` and
`playbooks` run (as task loops, so the trust gate sees the real kinds), `snowflake_transfer` maps onto
`transfer`, and the kinds this runtime does not offer are refused by `validate` with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.dsl.kinds import UNOFFERED_KINDS
from noetl_dagster.dsl.parse import parse_playbook
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.tools.snowflake_transfer import transfer_config

SCHEMA = Path(__file__).resolve().parents[1] / "engine" / "data" / "noetl_playbook.schema.json"
# upstream's schema enum, plus the kinds only its Rust worker has
UPSTREAM_KINDS = [*json.loads(SCHEMA.read_text())["$defs"]["ToolSpec"]["properties"]["kind"]["enum"], "subscription", "wasm", "result_fetch"]  # fmt: skip


def cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "NOETL_DAGSTER_HOME": str(home), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", *args],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip


def doc(tool: dict, **extra) -> dict:
    return {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "k", "path": "tests/k"},
            "workflow": [{"step": "start", "tool": tool}], **extra}  # fmt: skip


def test_no_upstream_kind_is_merely_unrecognized():
    assert len(UPSTREAM_KINDS) >= 27
    for kind in UPSTREAM_KINDS:
        _, issues = parse_playbook(doc({"kind": kind}))
        rules = {i.rule for i in issues}
        assert "unknown-tool-kind" not in rules, (kind, issues)
        if kind in UNOFFERED_KINDS:
            (issue,) = [i for i in issues if i.rule == "unoffered-tool-kind"]
            assert issue.message.startswith(
                f"tool kind {kind!r} is NoETL's, but this runtime does not offer it: "
            )
            assert len(issue.message) > 90 and "\n" not in issue.message  # a reason, on one line
    assert {"gateway", "subscription", "wasm", "task_sequence"} <= set(UNOFFERED_KINDS)
    _, issues = parse_playbook(doc({"kind": "no_such_kind"}))
    assert [i.rule for i in issues] == ["unknown-tool-kind"]


def test_validate_cli_gives_the_reason_for_an_unoffered_kind(tmp_path):
    f = tmp_path / "sub.yaml"
    f.write_text(yaml.safe_dump(doc({"kind": "subscription", "source": {"type": "kafka"}})))
    r = cli("validate", str(f), home=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr + r.stdout
    assert f"{f}:" in r.stdout + r.stderr and "unoffered-tool-kind" in r.stdout + r.stderr
    assert "Kafka or Pub/Sub" in r.stdout + r.stderr


ITER = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: iter, path: tests/iter}
workload: {items: [1, 2, 3]}
workflow:
  - step: start
    tool:
      kind: iterator
      collection: "{{ workload.items }}"
      element: n
      mode: MODE
      task: {kind: python, input: {n: "{{ n }}"}, code: "result = {'sq': n * n}"}
    next: {arcs: [{step: subs}]}
  - step: subs
    tool:
      kind: playbooks
      mode: parallel
      playbooks:
        - child.yaml
        - {path: child.yaml, input: {x: 21}, return_step: start}
"""

CHILD = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: child, path: tests/child}
workload: {x: 1}
workflow:
  - step: start
    tool: {kind: python, input: {x: "{{ workload.x }}"}, code: "result = {'double': x * 2}"}
"""


@pytest.mark.parametrize("mode", ["sequential", "async"])
def test_iterator_and_playbooks_run_through_the_cli(tmp_path, mode):
    (tmp_path / "child.yaml").write_text(CHILD)
    f = tmp_path / "iter.yaml"
    f.write_text(ITER.replace("MODE", mode))
    assert cli("validate", str(f), home=tmp_path / "h").returncode == 0
    r = cli("run", str(f), "--json", "-q", home=tmp_path / "h")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["status"] == "completed", r.stdout + r.stderr
    assert [x["sq"] for x in out["results"]["start"]["results"]] == [1, 4, 9]
    subs = out["results"]["subs"]
    assert [x["double"] for x in subs["results"]] == [2, 42] and subs["stats"] == {
        "total": 2,
        "ok": 2,
        "failed": 0,
    }
    assert len({x["execution_id"] for x in subs["results"]}) == 2  # two child executions


@pytest.mark.parametrize(
    ("tool", "rule", "needle"),
    [
        ({"kind": "iterator", "collection": [1]}, "iterator-shape", "needs `task:`"),
        ({"kind": "iterator", "task": {"kind": "noop"}}, "iterator-shape", "needs `collection`"),
        (
            {"kind": "iterator", "collection": [1], "mode": "fast", "task": {"kind": "noop"}},
            "iterator-shape",
            "'fast'",
        ),
        ({"kind": "iterator", "collection": [1], "task": {"kind": "nope"}}, "unknown-tool-kind", "'nope'"),
        ({"kind": "playbooks"}, "playbooks-shape", "non-empty list"),
        ({"kind": "playbooks", "playbooks": [{"definition": {}}]}, "playbooks-shape", "kind: playbook"),
        ({"kind": "playbooks", "playbooks": [{"path": "a", "bogus": 1}]}, "playbooks-shape", "bogus"),
        (
            {"kind": "snowflake_transfer", "source": {"query": "x"}, "target": {"table": "t"}},
            "tool-config",
            "needs `direction`",
        ),
    ],
)
def test_bad_shapes_are_validate_errors(tool, rule, needle):
    _, issues = parse_playbook(doc(tool))
    assert [i.rule for i in issues] == [rule], issues
    assert needle in issues[0].message


def test_a_failing_sub_playbook_fails_the_playbooks_task(tmp_path):
    (tmp_path / "bad.yaml").write_text(CHILD.replace("x * 2", "x / 0"))
    (tmp_path / "child.yaml").write_text(CHILD)
    pb = load_playbook_dict(doc({"kind": "playbooks", "playbooks": ["child.yaml", "bad.yaml"]}))
    pb = pb.model_copy(update={"source_file": str(tmp_path / "p.yaml")})
    res = run_playbook(pb, data_dir=tmp_path / "h")
    assert res.status == "failed", res.results
    err = res.results["start"]["error"]
    assert err["kind"] == "playbook_failed" and "1 of 2 loop iterations failed" in err["message"]
    assert "sub-playbook 'bad.yaml'" in err["message"] and "ZeroDivisionError" in err["message"]


def test_generated_iterator_is_gated_as_its_inner_kind(tmp_path, monkeypatch):
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path / "home"))
    child = doc({"kind": "iterator", "collection": [1], "task": {"kind": "python", "code": "result = 1"}})
    parent = doc({"kind": "playbook", "definition": child},
                 executor={"spec": {"generated": {"allow_kinds": ["iterator"]}}})  # fmt: skip
    res = run_playbook(load_playbook_dict(parent), data_dir=tmp_path / "home")
    assert res.status == "failed"
    assert "tool kind 'python' is not allowed" in json.dumps(res.results["start"])


def test_snowflake_transfer_maps_onto_transfer_both_ways():
    cfg = {"direction": "sf_to_pg", "source": {"query": "SELECT 1"}, "target": {"table": "public.t"},
           "auth": {"sf": {"key": "sf_cred"}, "pg": "pg_cred"}, "chunk_size": 500, "mode": "replace"}  # fmt: skip
    assert transfer_config(cfg) == {
        "source": {"query": "SELECT 1", "type": "snowflake", "auth": "sf_cred"},
        "target": {"table": "public.t", "type": "postgres", "auth": "pg_cred"},
        "chunk_size": 500, "mode": "replace",
    }  # fmt: skip
    back = transfer_config({**cfg, "direction": "pg_to_sf", "auth": None, "credentials": cfg["auth"]})
    assert back["source"]["type"] == "postgres" and back["source"]["auth"] == "pg_cred"
    assert back["target"]["type"] == "snowflake" and back["target"]["auth"] == "sf_cred"


def test_snowflake_transfer_without_a_credential_is_one_config_error(tmp_path):
    f = tmp_path / "sf.yaml"
    f.write_text(
        textwrap.dedent("""\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: sf, path: tests/sf}
        workflow:
          - step: start
            tool:
              kind: snowflake_transfer
              direction: pg_to_sf
              source: {query: "SELECT 1 AS a"}
              target: {table: PUBLIC.T}
              auth: {pg: pg_local}
    """)
    )
    assert cli("validate", str(f), home=tmp_path / "h").returncode == 0
    r = cli("run", str(f), "--json", "-q", home=tmp_path / "h")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["status"] == "failed"
    err = out["results"]["start"]["error"]
    assert (
        err["kind"] == "config_error" and "auth.sf (the Snowflake credential) is required" in err["message"]
    )
