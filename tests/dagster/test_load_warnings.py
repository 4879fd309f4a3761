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
