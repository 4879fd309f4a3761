"""The repository is ruff-formatted and lint-clean: the same checks as pre-commit, run by CI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


def test_repository_is_ruff_formatted():
    out = _ruff("format", "--check", ".")
    assert out.returncode == 0, "run `ruff format .`:\n" + out.stdout[-4000:] + out.stderr[-2000:]


def test_repository_passes_ruff_check():
    out = _ruff("check", ".")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
