"""`noetl-dagster migrate FILE... [-o OUT | --in-place] [--check]` and its exit codes."""

from __future__ import annotations

import shutil

import yaml
from click.testing import CliRunner

from noetl_dagster.commands.main import cli
from tests.dsl.migrate.conftest import EARLY_V2, LABELMAP_V2, WEATHER_V1

REFUSING = """apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: t}
workflow:
  - step: start
    tool: {kind: http, url: "http://x", retry: {max_attempts: 2, max_delay: 9}}
    next: [{step: end}]
  - {step: end, tool: {kind: noop}}
"""


def run(*args: str):
    return CliRunner().invoke(cli, ["migrate", *args])


def test_one_file_to_stdout():
    r = run(str(LABELMAP_V2))
    assert r.exit_code == 0, r.output
    assert yaml.safe_load(r.stdout)["workflow"][2]["tool"][0]["transform"]["input"] == {"item": "{{ item }}"}


def test_check_exits_1_for_legacy_files_and_0_for_migrated_ones(tmp_path):
    r = run("--check", str(WEATHER_V1), str(EARLY_V2))
    assert r.exit_code == 1
    assert f"{WEATHER_V1}: needs migration" in r.stderr and f"{EARLY_V2}: needs migration" in r.stderr
    out = tmp_path / "out"
    assert run("-o", str(out), str(WEATHER_V1), str(EARLY_V2), str(LABELMAP_V2)).exit_code == 0
    migrated = sorted(out.iterdir())
    assert len(migrated) == 3
    r = run("--check", *map(str, migrated))
    assert r.exit_code == 0, r.stderr
    assert "needs migration" not in r.stderr


def test_output_file_and_in_place(tmp_path):
    target = tmp_path / "one.yaml"
    assert run("-o", str(target), str(LABELMAP_V2)).exit_code == 0
    assert "input:" in target.read_text()
    copy = tmp_path / "copy.yaml"
    shutil.copy(EARLY_V2, copy)
    r = run("--in-place", str(copy))
    assert r.exit_code == 0 and f"{copy}: migrated" in r.stderr
    first = copy.read_text()
    assert "case:" not in first
    r = run("--in-place", str(copy))  # nothing left to do: the file is not rewritten
    assert r.exit_code == 0 and "migrated" not in r.stderr and copy.read_text() == first


def test_refusals_exit_1_with_file_and_line(tmp_path):
    f = tmp_path / "refusing.yaml"
    f.write_text(REFUSING)
    r = run(str(f))
    assert r.exit_code == 1
    assert f"{f}:6: refused: retry:" in r.stderr
    # the rest was migrated, the refused block kept; the validator still points at it
    assert "retry: {max_attempts: 2, max_delay: 9}" in r.stdout
    assert "legacy-construct" in r.stderr


def test_bad_input_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("workflow: [\n")
    assert run(str(bad)).exit_code == 2
    assert run(str(tmp_path / "missing.yaml")).exit_code == 2
    not_pb = tmp_path / "not.yaml"
    not_pb.write_text("kind: Other\n")
    r = run(str(not_pb))
    assert r.exit_code == 2 and "not-a-playbook" in r.stderr
    assert run("--check", "--in-place", str(LABELMAP_V2)).exit_code == 2
    assert run(str(LABELMAP_V2), str(EARLY_V2)).exit_code == 2  # several files need -o/--in-place/--check
