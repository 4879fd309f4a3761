"""`noetl-dagster run --runner dagster` on a fresh DAGSTER_HOME prints only our output: Dagster's
telemetry notice, "Welcome to Dagster!" and its missing-dagster.yaml warning go to the log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HELLO = REPO / "example_project" / "playbooks" / "hello_dagster.yaml"
CHATTER = ("Telemetry", "Welcome to Dagster", "dagster.yaml", "usage statistics", "slack")


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "fresh_dagster_home"),
           "NOETL_DAGSTER_HOME": str(tmp_path / "noetl")}  # fmt: skip
    env.pop("DAGSTER_TELEMETRY_DISABLED", None)
    return subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", "run", "--runner", "dagster",
                           *args, str(HELLO)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)  # fmt: skip


def test_fresh_dagster_home_prints_no_dagster_chatter(tmp_path):
    out = _run(tmp_path, "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["status"] == "completed"  # stdout is the JSON alone
    for text in CHATTER:
        assert text.lower() not in out.stderr.lower(), out.stderr
    # the next run on the same home is as quiet, and its summary is ours
    again = _run(tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "completed" in again.stdout and "hello_dagster" in again.stdout
    for text in CHATTER:
        assert text.lower() not in (again.stdout + again.stderr).lower()


def test_demo_on_a_fresh_home_prints_no_dagster_chatter(tmp_path):
    """The demo opens its instance through the same gate (its dagster.yaml also turns telemetry off)."""
    # a new user: no DAGSTER_HOME, so Dagster keeps its telemetry id under a fresh ~/.dagster
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "NOETL_DAGSTER_HOME")}
    env["HOME"] = str(tmp_path / "user")
    out = subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", "demo", "--only", "hello_dagster",
                          "--home", str(tmp_path / "home")], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "completed" in out.stdout
    for text in CHATTER:
        if text != "dagster.yaml":  # the demo prints where its instance lives
            assert text.lower() not in (out.stdout + out.stderr).lower(), text
