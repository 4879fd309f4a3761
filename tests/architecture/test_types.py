"""The public API type-checks with a clean baseline ([tool.mypy] in pyproject.toml lists the files)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_public_api_type_checks():
    out = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=REPO, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert out.stdout.startswith("Success: no issues found in ")
