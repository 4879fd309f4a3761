"""Issue 42: a code-server load of the example project warns nothing (it printed two BetaWarnings:
Dagster's rebuild of the router sensor around re-bound jobs, and of asset checks a defs folder hands
back as assets). Loaded as the code server does (definitions, repository, its snapshot) with every
warning an error, in a fresh process: Dagster warns once per process."""

from __future__ import annotations

import os
import subprocess
import sys

from dagster_helpers import REPO

LOAD = """
import example_project.definitions as d
from dagster._core.remote_representation.external_data import RepositorySnap
repo = d.defs().get_repository_def()
repo.get_all_jobs()
RepositorySnap.from_def(repo)
print("loaded", len(repo.sensor_defs), "sensors")
"""


def test_the_example_project_loads_without_a_warning(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "NOETL_DAGSTER_HOME": str(tmp_path / "noetl")}
    # every warning an error but DeprecationWarning: the snapshot reads Dagster's own deprecated
    # ScheduleDefinition.environment_vars (the code server does so with Dagster's warnings off)
    out = subprocess.run([sys.executable, "-W", "error", "-W", "ignore::DeprecationWarning", "-c", LOAD],
                         cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "loaded" in out.stdout and "Warning" not in out.stderr, out.stderr[-3000:]


USER_LOAD = """
from pathlib import Path
import dagster as dg
from dagster._core.remote_representation.external_data import RepositorySnap
repo = dg.load_from_defs_folder(path_within_project=Path("userproj").resolve()).get_repository_def()
RepositorySnap.from_def(repo)
print("loaded", len(repo.asset_checks_defs_by_key), "checks")
"""


def test_a_users_project_with_declared_checks_loads_without_the_execution_type_beta_warning(tmp_path):
    """A project of a user (no filter of its own): the component's asset checks, copied by Dagster's
    defs-folder loader, no longer print the ``execution_type`` BetaWarning at every code-server load."""
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "userproj"\nversion = "0"\n\n[tool.dg]\ndirectory_type = "project"\n\n'
        '[tool.dg.project]\nroot_module = "userproj"\n'
    )
    defs_dir = tmp_path / "userproj" / "defs" / "playbooks"
    (defs_dir / "playbooks").mkdir(parents=True)
    for d in (tmp_path / "userproj", tmp_path / "userproj" / "defs"):
        (d / "__init__.py").write_text("")
    (defs_dir / "defs.yaml").write_text(
        "type: noetl_dagster.NoetlPlaybooksComponent\nattributes:\n  playbooks_dir: playbooks\n"
        f"  data_dir: {tmp_path / 'noetl'}\n"
    )
    (defs_dir / "playbooks" / "sales.yaml").write_text(
        (REPO / "example_project/playbooks/sales_tables.yaml").read_text()
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    out = subprocess.run([sys.executable, "-W", "error", "-W", "ignore::DeprecationWarning", "-c", USER_LOAD],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "loaded" in out.stdout and " 0 checks" not in out.stdout, out.stdout
    assert "Warning" not in out.stderr, out.stderr[-3000:]
