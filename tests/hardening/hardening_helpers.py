"""Shared helpers for the hardening tests: run a public command and check it
ended cleanly (no traceback, an exit code in {0, 1, 2}, one-line errors)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from noetl_dagster.commands.main import cli
from noetl_registry.cli import cli as registry_cli

HEAD = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: t, path: tests/hardening/t}\n"


def write(tmp: Path, name: str, text: str | bytes) -> str:
    p = tmp / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return str(p)


def invoke(args: list[str], *, registry: bool = False, env: dict[str, str] | None = None) -> Any:
    """Run a command in-process (executions are replayed by tests/conftest.py); assert a clean end."""
    runner = CliRunner()
    r = runner.invoke(registry_cli if registry else cli, args, env=env, catch_exceptions=True)
    assert_clean(r.exit_code, r.output, r.exception, args)
    return r


def assert_clean(code: int, output: str, exception: BaseException | None, args: Any) -> None:
    assert "Traceback" not in output, f"traceback from {args}:\n{output[-2000:]}"
    if exception is not None and not isinstance(exception, SystemExit):
        raise AssertionError(f"{args} raised {type(exception).__name__}: {exception}") from exception
    assert code in (0, 1, 2), f"{args} exited {code}:\n{output[-2000:]}"


def run_subprocess(
    args: list[str], timeout: float = 60, registry: bool = False, env: dict | None = None
) -> tuple[int, str, float]:
    """Run the real console script (what a user sees); returns (exit code, stdout+stderr, seconds)."""
    exe = Path(sys.executable).parent / ("noetl-registry" if registry else "noetl-dagster")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})  # fmt: skip
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{args} did not finish within {timeout} s") from None
    out = proc.stdout + proc.stderr
    assert_clean(proc.returncode, out, None, args)
    return proc.returncode, out, time.perf_counter() - t0
