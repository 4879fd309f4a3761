"""`noetl-dagster schema` (issue 32.6): a draft-07 JSON Schema editors map to playbooks. Every example
and corpus playbook gets the same verdict from the schema as from `validate`, and so does a set of
broken files (each a different structural mistake)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from noetl_dagster.dsl.files import check_file
from noetl_dagster.dsl.jsonschema import playbook_schema
from noetl_dagster.dsl.parse import parse_playbook

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "example_project"
CORPUS = Path(os.environ.get("NOETL_SHARED", "/work/shared")) / "conformance"
FILES = sorted(CORPUS.rglob("*.yaml")) + sorted((EXAMPLE / "playbooks").rglob("*.yaml"))


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    schema = playbook_schema()
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def test_cli_writes_the_schema_the_example_project_maps(tmp_path):
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", "schema", "-o", str(out)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    written = json.loads(out.read_text())
    # (not compared with this process's playbook_schema(): kinds other tests register in this
    # worker join it; the CLI's fresh process and the committed file are the contract)
    committed = EXAMPLE / ".vscode" / "playbook.schema.json"
    assert json.loads(committed.read_text()) == written, "regenerate: noetl-dagster schema -o " + str(
        committed
    )
    settings = json.loads((EXAMPLE / ".vscode" / "settings.json").read_text())
    assert settings["yaml.schemas"]["./.vscode/playbook.schema.json"][0] == "playbooks/**/*.yaml"
    # each kind's typed config comes from its model: artifact's action enum, transfer's nested source
    defs = written["definitions"]
    assert defs["config.artifact"]["properties"]["action"]["anyOf"][0]["enum"] == ["get", "put"]
    assert "transfer.TransferSource" in defs and "gateway" not in defs["task"]["properties"]["kind"]["enum"]


def test_every_example_and_corpus_playbook_gets_the_validate_verdict(validator):
    assert len(FILES) > 150
    valid = disagree = 0
    for f in FILES:
        _, issues = check_file(f)
        data = yaml.safe_load(f.read_text())
        errors = list(validator.iter_errors(data))
        if bool(errors) != bool(issues):
            disagree += 1
            print(f, [i.rule for i in issues][:3], [e.message[:120] for e in errors[:3]])
        valid += not issues
    assert disagree == 0
    assert valid >= 150  # 153 corpus + 16 examples at the time of writing


BASE = {
    "apiVersion": "noetl.io/v2",
    "kind": "Playbook",
    "metadata": {"name": "b", "path": "tests/b"},
    "workload": {"n": 2},
    "workflow": [
        {"step": "start", "tool": {"kind": "noop"}, "next": {"spec": {"mode": "exclusive"}, "arcs": [{"step": "b"}]}},
        {"step": "b", "tool": [{"t": {"kind": "transfer", "chunk_size": "{{ workload.n }}",
                                      "source": {"type": "duckdb", "query": "select 1"},
                                      "target": {"type": "duckdb", "table": "t"}}}]},
    ],
}  # fmt: skip


def _mut(fn):
    doc = copy.deepcopy(BASE)
    fn(doc)
    return doc


BROKEN = {
    "no metadata.path": lambda d: d["metadata"].pop("path"),
    "apiVersion v1": lambda d: d.update(apiVersion="noetl.io/v1"),
    "not a Playbook": lambda d: d.update(kind="ConfigMap"),
    "empty workflow": lambda d: d.update(workflow=[]),
    "unknown kind": lambda d: d["workflow"][0]["tool"].update(kind="no_such_kind"),
    "unoffered kind": lambda d: d["workflow"][0]["tool"].update(kind="gateway"),
    "next as a list": lambda d: d["workflow"][0].update(next=[{"step": "b"}]),
    "arc without step": lambda d: d["workflow"][0]["next"]["arcs"].append({"when": "true"}),
    "next.spec key": lambda d: d["workflow"][0]["next"]["spec"].update(order="x"),
    "step without tool or next": lambda d: d["workflow"].append({"step": "end"}),
    "legacy case:": lambda d: d["workflow"][1].update(case=[]),
    "step when": lambda d: d["workflow"][1].update(when="{{ true }}"),
    "task retry block": lambda d: d["workflow"][0]["tool"].update(retry={"max_attempts": 3}),
    "required config key": lambda d: d["workflow"][1]["tool"][0]["t"].pop("source"),
    "task without kind": lambda d: d["workflow"][1]["tool"][0]["t"].pop("kind"),
    "set writes workload": lambda d: d["workflow"][1].update(set={"workload.n": 1}),
    "root vars": lambda d: d.update(vars={"a": 1}),
    "iterator without task": lambda d: d["workflow"][0].update(tool={"kind": "iterator", "collection": [1]}),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_file_is_refused_by_both(validator, name):
    doc = _mut(BROKEN[name])
    _, issues = parse_playbook(doc)
    assert issues, name
    assert list(validator.iter_errors(doc)), (name, [i.rule for i in issues])


def test_templates_and_every_pipeline_form_are_accepted_by_both(validator):
    assert not parse_playbook(BASE)[1] and not list(validator.iter_errors(BASE))
    forms = [
        {"kind": "noop"},
        [{"kind": "noop"}],
        [{"a": {"kind": "noop"}}, {"kind": "python", "code": "result = 1"}],
        {"a": {"kind": "noop"}},
        {"kind": "iterator", "collection": "{{ workload.n }}", "mode": "async", "task": {"kind": "noop"}},
        {"kind": "playbooks", "playbooks": ["a.yaml", {"path": "b.yaml", "input": {"x": 1}}]},
        {"kind": "artifact", "action": "{{ workload.action }}", "uri": "out.json", "data": {"a": 1}},
    ]
    for tool in forms:
        doc = _mut(lambda d, t=tool: d["workflow"][0].update(tool=t))
        assert not parse_playbook(doc)[1], tool
        assert not list(validator.iter_errors(doc)), (tool, [e.message for e in validator.iter_errors(doc)])
