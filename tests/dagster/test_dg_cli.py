"""``dg`` end to end (issue 22.3), as subprocesses of the real CLI: example_project is a dg
project, the component is registered (``dg list components``), and
``dg scaffold defs noetl_dagster.NoetlPlaybooksComponent my_playbooks`` gives a project
that ``dg check defs`` accepts with a job for the sample playbook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster_helpers import REPO, dagster_dev_server

BIN = Path(sys.executable).parent


def _dg(args: list[str], cwd: Path, env_extra: dict[str, str] | None = None) -> str:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **(env_extra or {})}
    env.pop("DAGSTER_HOME", None)
    out = subprocess.run(
        [str(BIN / "dg"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, (
        f"dg {' '.join(args)} exited {out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    )
    return out.stdout


def _pythonpath(root: Path) -> str:
    """The project, then whatever the test runs with (a worktree's checkout before the installed one)."""
    return os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)


def _project_files(root: Path) -> None:
    """A dg project ``myproj`` as `create-dagster project` lays it out (the defs folder must exist)."""
    (root / "myproj" / "__init__.py").write_text("")
    (root / "myproj" / "defs" / "__init__.py").write_text("")
    (root / "myproj" / "definitions.py").write_text(  # as `create-dagster project` writes it
        "from pathlib import Path\n\nimport dagster as dg\n\n\n@dg.definitions\ndef defs():\n"
        "    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)\n"
    )
    (root / "pyproject.toml").write_text(
        '[project]\nname = "myproj"\nversion = "0"\n\n[tool.dg]\ndirectory_type = "project"\n\n'
        '[tool.dg.project]\nroot_module = "myproj"\n'
    )


@pytest.mark.slow
def test_the_example_project_works_from_a_fresh_clone_after_make_setup(tmp_path):
    """Issue 42: `cd example_project && dg list defs` failed with No module named 'example_project'
    (only `dg check defs` passed). `make setup` installs it into the environment; run as a user
    does, without the checkout on PYTHONPATH: dg check defs, dg list defs, dg dev (/server_info)."""
    project = REPO / "example_project"
    installed = subprocess.run([str(BIN / "python"), "-c", "import example_project"], cwd=tmp_path,
                               env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})  # fmt: skip
    assert installed.returncode == 0, "example_project is not installed in the environment: run `make setup`"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DAGSTER_HOME")}
    env.update(
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", NOETL_DAGSTER_HOME=str(tmp_path / "noetl")
    )
    for args in (["check", "defs"], ["list", "defs", "--json"]):
        out = subprocess.run([str(BIN / "dg"), *args], cwd=project, env=env, capture_output=True, text=True,
                             timeout=300)  # fmt: skip
        assert out.returncode == 0, f"dg {' '.join(args)}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    assert "hello_dagster" in {j["name"] for j in json.loads(out.stdout)["jobs"]}
    env["DAGSTER_HOME"] = str(tmp_path / "dagster_home")
    (tmp_path / "dagster_home").mkdir()
    with dagster_dev_server(None, cwd=project, env=env, log_path=tmp_path / "dg_dev.log") as (url, _):
        import httpx  # noqa: PLC0415

        assert httpx.get(f"{url}/server_info", timeout=10).status_code == 200
    assert "No module named" not in (tmp_path / "dg_dev.log").read_text()


@pytest.mark.slow
def test_dg_checks_and_lists_the_example_project(tmp_path):
    project = REPO / "example_project"
    env = {"NOETL_DAGSTER_HOME": str(tmp_path / "noetl")}
    assert "successfully" in _dg(["check", "yaml"], project, env)
    assert "successfully" in _dg(["check", "defs"], project, env)
    defs = json.loads(_dg(["list", "defs", "--json"], project, env))
    jobs = {j["name"] for j in defs["jobs"]}
    assert {"hello_dagster", "countdown_cycle", "per_step_pipeline__step__combine"} <= jobs
    assert "noetl_router" in {s["name"] for s in defs["sensors"]}
    comps = _dg(["list", "components", "--json"], project, env)
    assert "noetl_dagster.NoetlPlaybooksComponent" in {c["key"] for c in json.loads(comps)["items"]}


@pytest.mark.slow
def test_dg_scaffold_defs_gives_a_working_component(tmp_path):
    root = tmp_path / "proj"
    (root / "myproj" / "defs").mkdir(parents=True)
    _project_files(root)
    env = {"PYTHONPATH": _pythonpath(root), "NOETL_DAGSTER_HOME": str(tmp_path / "noetl")}
    _dg(["scaffold", "defs", "noetl_dagster.NoetlPlaybooksComponent", "my_playbooks"], root, env)
    folder = root / "myproj" / "defs" / "my_playbooks"
    defs_yaml = (folder / "defs.yaml").read_text()
    assert (
        "type: noetl_dagster.NoetlPlaybooksComponent" in defs_yaml and "playbooks_dir: playbooks" in defs_yaml
    )
    assert "tenant: demo" in defs_yaml and "project: examples" in defs_yaml  # the scope of the sample's table
    assert (folder / "playbooks" / "hello_noetl.yaml").is_file()
    _dg(["check", "yaml"], root, env)
    assert "registry-scope" not in _dg(["check", "defs"], root, env)
    listed = json.loads(_dg(["list", "defs", "--json"], root, env))
    assert "hello_noetl" in {j["name"] for j in listed["jobs"]}
    assert "scaffold/greetings" in {a["asset_key"] for a in listed["assets"]}  # an asset at once


@pytest.mark.slow
def test_on_error_raise_fails_the_load_with_file_line_rule_lines_not_a_traceback(tmp_path):
    root = tmp_path / "proj"
    (root / "myproj" / "defs" / "pbs" / "playbooks").mkdir(parents=True)
    _project_files(root)
    pbs = root / "myproj" / "defs" / "pbs"
    (pbs / "defs.yaml").write_text("type: noetl_dagster.NoetlPlaybooksComponent\nattributes:\n"
                                   "  playbooks_dir: playbooks\n  on_error: raise\n")  # fmt: skip
    for name in ("bad", "worse"):
        (pbs / "playbooks" / f"{name}.yaml").write_text(
            "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: b, path: t/b}\nworkflow:\n"
            "  - step: start\n    tool: [{a: {kind: teleport}}]\n"
        )
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": _pythonpath(root),
           "NOETL_DAGSTER_HOME": str(tmp_path / "noetl"), "DAGSTER_HOME": str(tmp_path / "dh")}  # fmt: skip
    (tmp_path / "dh").mkdir()
    (tmp_path / "dh" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    out = subprocess.run([str(BIN / "dg"), "check", "defs"], cwd=root, env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    text = out.stdout + out.stderr
    assert out.returncode != 0
    for name in ("bad", "worse"):  # every broken file, FILE:LINE: RULE
        assert f"{pbs / 'playbooks' / name}.yaml:6: unknown-tool-kind:" in text
    assert "compile_playbooks" not in text and len(text.splitlines()) < 40, (
        text
    )  # Dagster's own frame: ~30 lines


def _run_dg(args: list[str], root: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "dg"), *args], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_ci_gates_broken_playbooks_and_yaml_typos_fail_the_checks(tmp_path):
    """Issue 31: ``dg check defs`` exits non-zero on a broken playbook even with ``on_error: report``;
    ``dg check yaml`` rejects bad enum values at their key's line and names a typo inside ``translation``."""
    root = tmp_path / "proj"
    pbs = root / "myproj" / "defs" / "pbs"
    (pbs / "playbooks").mkdir(parents=True)
    _project_files(root)
    (pbs / "playbooks" / "bad.yaml").write_text(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: b, path: t/b}\nworkflow:\n"
        "  - step: start\n    tool: [{a: {kind: teleport}}]\n"
    )
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": _pythonpath(root),
           "NOETL_DAGSTER_HOME": str(tmp_path / "noetl"), "DAGSTER_HOME": str(tmp_path / "dh")}  # fmt: skip
    (tmp_path / "dh").mkdir()
    (tmp_path / "dh" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    head = "type: noetl_dagster.NoetlPlaybooksComponent\nattributes:\n  playbooks_dir: playbooks\n"
    (pbs / "defs.yaml").write_text(head + "  on_error: report\n")
    out = _run_dg(["check", "defs"], root, env)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "All definitions loaded successfully" not in text
    assert f"{pbs / 'playbooks' / 'bad.yaml'}:6: unknown-tool-kind:" in text
    assert text.count("noetl: invalid playbook") <= 1  # each warning once (Dagster builds the location twice)

    (pbs / "defs.yaml").write_text(
        head + "  mode: defualt\n  on_error: reprot\n  translation:\n    op_tgas: {a: b}\n"
    )
    out = _run_dg(["check", "yaml"], root, env)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "defs.yaml:4 - " in text and "'defualt' is not one of ['default', 'per_step']" in text
    assert "defs.yaml:5 - " in text and "'reprot' is not one of ['report', 'skip', 'raise']" in text
    assert "'op_tgas' is not one of [" in text
