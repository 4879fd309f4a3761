"""`run`'s console output: the progress lines are written without a rich render per line but
look exactly as rich printed them, and the summary table of a long run collapses its middle
into "... N more steps" rows (failed steps always shown)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from noetl_dagster.commands import core


@pytest.mark.parametrize("color", [True, False])
@pytest.mark.parametrize("ok", [True, False])
def test_progress_line_is_what_rich_printed(monkeypatch, capsys, color, ok):
    monkeypatch.delenv("NO_COLOR", raising=False)
    if color:
        monkeypatch.setenv("FORCE_COLOR", "1")
    else:
        monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setattr(core.time, "perf_counter", lambda: 100.0)
    progress = core._Progress(enabled=True)
    monkeypatch.setattr(core.time, "perf_counter", lambda: 112.25)
    run = SimpleNamespace(step="load_rows", ok=ok)
    progress.on_step(run)
    progress.on_step(run)
    ours = capsys.readouterr().err

    from rich.console import Console

    console = Console(stderr=True)  # the former on_step: one console.print per line
    mark = "[green]ok[/]" if ok else "[red]failed[/]"
    for count in (1, 2):
        console.print(f"  {count:>4}  {run.step:<32} {mark}  [dim]{12.25:6.2f}s[/]", highlight=False)
    assert ours == capsys.readouterr().err
    assert ("\x1b[" in ours) is color


def test_quiet_progress_prints_nothing(capsys):
    progress = core._Progress(enabled=False)
    progress.on_step(SimpleNamespace(step="a", ok=True))
    assert progress.count == 1
    assert capsys.readouterr().err == ""


def _result(n: int, errors: dict[int, str] = {}) -> SimpleNamespace:  # noqa: B006 - read only
    runs = {f"s{i}": 1 + (i == 3) for i in range(n)}
    results = {
        f"s{i}": {"status": "error", "error": errors[i]} if i in errors else {"i": i} for i in range(n)
    }
    return SimpleNamespace(runs=runs, results=results, status="failed" if errors else "completed",
                           playbook="tests/chain", execution_id="x-1", event_store_url="sqlite:///e.db")  # fmt: skip


def _steps_shown(out: str) -> list[str]:
    return re.findall(r"^│ (\S+(?: \d+ more steps)?) +│ +(\d+) │", out, re.M)


def test_summary_of_a_long_run_collapses_its_middle(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    core._print_summary(_result(1000, errors={500: "boom"}))
    out = capsys.readouterr().out
    rows = _steps_shown(out)
    head = [(f"s{i}", "2" if i == 3 else "1") for i in range(20)]
    tail = [(f"s{i}", "1") for i in range(980, 1000)]
    assert rows == [*head, ("... 480 more steps", "480"), ("s500", "1"), ("... 479 more steps", "479"), *tail]
    assert '"error":"boom"' in out  # a failed step in the hidden middle is still shown
    assert "event log: sqlite:///e.db  (noetl-dagster events x-1)" in out


def test_summary_of_a_short_run_shows_every_step(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    core._print_summary(_result(core.SUMMARY_MAX_ROWS))
    rows = _steps_shown(capsys.readouterr().out)
    assert [s for s, _ in rows] == [f"s{i}" for i in range(core.SUMMARY_MAX_ROWS)]


def test_run_of_a_long_chain_end_to_end(tmp_path):
    n = 120
    lines = [
        "apiVersion: noetl.io/v2",
        "kind: Playbook",
        "metadata: {name: chain, path: tests/chain}",
        "workflow:",
    ]
    for i in range(n):
        lines += [f"  - step: s{i}", "    tool: {kind: noop}"]
        if i + 1 < n:
            lines.append(f"    next: {{arcs: [{{step: s{i + 1}}}]}}")
    p = tmp_path / "chain.yaml"
    p.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "NOETL_DAGSTER_HOME": str(tmp_path / "home"), "NO_COLOR": "1", "COLUMNS": "200"}
    r = subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", "run", str(p)],
                       capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    progress = r.stderr.splitlines()
    assert len(progress) == n
    assert all(re.fullmatch(rf" +{i + 1}  s{i} +ok +\d+\.\d\ds", ln) for i, ln in enumerate(progress)), (
        progress[:3]
    )
    rows = _steps_shown(r.stdout)
    assert len(rows) == 2 * core.SUMMARY_EDGE + 1
    assert rows[core.SUMMARY_EDGE] == (
        f"... {n - 2 * core.SUMMARY_EDGE} more steps",
        str(n - 2 * core.SUMMARY_EDGE),
    )
