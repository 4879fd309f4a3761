"""Tool kinds are plugins: the ``noetl_dagster.tools`` entry point, typed config models, broken plugins.

A third-party plugin here is a real installed distribution as Python sees one: a ``*.dist-info``
directory with ``entry_points.txt`` on ``PYTHONPATH``, used by a fresh ``noetl-dagster`` process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from noetl_dagster.dsl import kinds as catalogue
from noetl_dagster.tools.registry import ToolConfig, all_kinds, builtin_kinds, get_tool

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

PLUGIN = """
from noetl_dagster.tools.registry import ToolConfig, ToolError, register_tool

class EchoConfig(ToolConfig):
    message: str
    times: int = 1

@register_tool("echo3p", config=EchoConfig, description="Echo a message (third-party test plugin)")
def echo(inputs, ctx):
    if inputs["message"] == "boom":
        raise ToolError("echo3p refused boom", kind="echo_refused")
    return {"echo": inputs["message"] * int(inputs.get("times", 1))}
"""


def _install_plugin(tmp_path: Path, entries: dict[str, str], module: str | None = PLUGIN) -> dict[str, str]:
    site = tmp_path / "site"
    dist = site / "thirdparty_kinds-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-kinds\nVersion: 0.1\n")
    lines = "\n".join(f"{k} = {v}" for k, v in entries.items())
    (dist / "entry_points.txt").write_text(f"[noetl_dagster.tools]\n{lines}\n")
    if module is not None:
        (site / "thirdparty_kinds.py").write_text(module)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    env["NOETL_DAGSTER_HOME"] = str(tmp_path / "home")
    return env


def _cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def _playbook(tmp_path: Path, tool: dict) -> Path:
    pb = {
        "apiVersion": "noetl.io/v2",
        "kind": "Playbook",
        "metadata": {"name": "plug", "path": "tests/plug"},
        "workflow": [{"step": "start", "tool": tool}],
    }
    path = tmp_path / "plug.yaml"
    path.write_text(json.dumps(pb))
    return path


def test_every_builtin_kind_registers_through_the_entry_point_with_a_typed_config():
    declared = set()
    in_section = False
    for line in PYPROJECT.read_text().splitlines():
        if line.startswith("["):
            in_section = line.strip() == '[project.entry-points."noetl_dagster.tools"]'
            continue
        if in_section and "=" in line and not line.startswith("#"):
            declared.add(line.split("=")[0].strip())
    assert declared == builtin_kinds(), (
        "pyproject entry points and the installed metadata differ: pip install -e ."
    )
    assert {"noop", "python", "http", "postgres", "duckdb", "playbook"} <= declared
    for name in sorted(declared):
        tk = get_tool(name)
        assert tk is not None and tk.error is None, name
        assert tk.distribution == "noetl-dagster" and ":" in tk.source, name
        assert tk.config is not None and issubclass(tk.config, ToolConfig), (
            f"{name} has no typed config model"
        )
        assert tk.config_schema()["type"] == "object"
        # the validation hint (no import) agrees with what the kind registers
        if name in catalogue._RAW_KEY_HINTS:
            assert catalogue._RAW_KEY_HINTS[name] == tk.raw_keys, name


def test_builtin_table_is_pyproject_and_the_installed_entry_points():
    """dsl/kinds.BUILTIN_KINDS answers built-in names without the entry-point scan (issue 35): it must
    be exactly what pyproject declares and what the installed distribution's entry points say."""
    from importlib.metadata import distribution

    declared = {}
    in_section = False
    for line in PYPROJECT.read_text().splitlines():
        if line.startswith("["):
            in_section = line.strip() == '[project.entry-points."noetl_dagster.tools"]'
            continue
        if in_section and "=" in line and not line.startswith("#"):
            name, _, value = line.partition("=")
            declared[name.strip()] = value.strip().strip('"')
    assert catalogue.BUILTIN_KINDS == declared
    installed = {
        ep.name: ep.value
        for ep in distribution("noetl-dagster").entry_points
        if ep.group == "noetl_dagster.tools"
    }
    assert installed == declared, "pyproject entry points and the installed metadata differ: pip install -e ."


def test_a_plugin_kind_is_still_found_by_a_fresh_process(tmp_path):
    """Built-in names skip the scan; any other name still finds a third-party entry point."""
    env = _install_plugin(tmp_path, {"echo3p": "thirdparty_kinds:echo"})
    pb = _playbook(tmp_path, {"kind": "echo3p", "message": "hi"})
    out = _cli("run", "--json", str(pb), env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["results"]["start"] == {"echo": "hi"}


def test_config_model_rejects_a_mistyped_config_with_a_config_error(tmp_path):
    from noetl_dagster.dsl import load_playbook_dict
    from noetl_dagster.runners.local import run_playbook

    pb = load_playbook_dict({
        "apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "t", "path": "tests/t"},
        "workflow": [{"step": "start", "tool": {"kind": "http", "url": "http://127.0.0.1:9", "headers": ["not", "a", "map"]}}],
    })  # fmt: skip
    res = run_playbook(pb, data_dir=tmp_path)
    assert res.status == "failed"
    err = res.results["start"]["error"] if "start" in (res.results or {}) else None
    text = json.dumps(res.to_json() if hasattr(res, "to_json") else str(err), default=str)
    assert "config_error" in text and "invalid config" in text and "headers" in text


def test_third_party_kind_is_listed_with_its_schema_and_runs(tmp_path):
    env = _install_plugin(tmp_path, {"echo3p": "thirdparty_kinds:echo"})
    out = _cli("tools", "list", "--json", env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    kinds = json.loads(out.stdout)["kinds"]
    echo = kinds["echo3p"]
    assert echo["distribution"] == "thirdparty-kinds" and echo["status"] == "ok"
    assert echo["config_schema"]["required"] == ["message"]
    assert echo["config_schema"]["properties"]["times"]["type"] == "integer"
    assert kinds["postgres"]["status"] == "ok"  # the built-ins are still there

    text = _cli("tools", "list", env=env, cwd=tmp_path)
    assert "echo3p" in text.stdout and "EchoConfig(message, times)" in text.stdout

    pb = _playbook(tmp_path, {"kind": "echo3p", "message": "hi", "times": 2})
    assert _cli("validate", str(pb), env=env, cwd=tmp_path).returncode == 0
    run = _cli("run", str(pb), "--json", "-q", env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "hihi" in run.stdout

    # validate reads the model: a required key that is not written is an error before anything runs
    bad = _playbook(tmp_path, {"kind": "echo3p", "times": 2})
    val = _cli("validate", str(bad), env=env, cwd=tmp_path)
    assert val.returncode == 1
    assert "tool-config: workflow[0].tool.kind: kind 'echo3p' needs `message`" in val.stdout
    # at run time the model checks the rendered values: `times` must render to an integer
    bad = _playbook(tmp_path, {"kind": "echo3p", "message": "hi", "times": "{{ 'x' }}"})
    run = _cli("run", str(bad), "--json", "-q", env=env, cwd=tmp_path)
    assert run.returncode == 1
    assert "kind 'echo3p': invalid config: times: Input should be a valid integer" in run.stdout


@pytest.mark.parametrize(
    "entries,module,cause",
    [
        ({"broken3p": "thirdparty_missing_module:tool"}, None, "ModuleNotFoundError"),
        ({"broken3p": "thirdparty_kinds:no_such_attr"}, PLUGIN, "AttributeError"),
        (
            {"broken3p": "thirdparty_kinds:boom"},
            "raise RuntimeError('plugin import failed')\n",
            "RuntimeError: plugin import failed",
        ),
    ],
)
def test_a_broken_plugin_is_reported_and_the_other_kinds_still_load(tmp_path, entries, module, cause):
    env = _install_plugin(tmp_path, entries, module)
    out = _cli("tools", "list", "--json", env=env, cwd=tmp_path)
    assert out.returncode == 1
    kinds = json.loads(out.stdout)["kinds"]
    assert kinds["broken3p"]["status"] == "error"
    assert cause in kinds["broken3p"]["error"] and entries["broken3p"] in kinds["broken3p"]["error"]
    assert all(v["status"] == "ok" for k, v in kinds.items() if k != "broken3p")
    assert "Traceback" not in out.stderr
    assert (
        f"error: tool kind 'broken3p' failed to load from entry point {entries['broken3p']!r}" in out.stderr
    )

    # a playbook using another kind runs; one using the broken kind fails with the plugin error
    ok = _playbook(tmp_path, {"kind": "python", "code": "result = {'x': 1}"})
    assert _cli("run", str(ok), "-q", env=env, cwd=tmp_path).returncode == 0
    bad = _playbook(tmp_path, {"kind": "broken3p"})
    run = _cli("run", str(bad), "--json", "-q", env=env, cwd=tmp_path)
    assert run.returncode == 1 and "plugin_error" in run.stdout and cause in run.stdout
    assert "Traceback" not in run.stderr


def test_all_kinds_in_process_have_no_errors():
    assert [k.name for k in all_kinds() if k.error] == []
