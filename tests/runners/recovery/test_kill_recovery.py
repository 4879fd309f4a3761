"""kill -9 at many points of a run with a loop, retries and a cycle; resume must
finish with the state of an uninterrupted run, run no finished step twice, and
lose or duplicate no event."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sqlite3
import time
from collections import Counter
from pathlib import Path

import pytest

from noetl_dagster.runners.local import resume_execution, run_playbook
from noetl_dagster.storage.events import SqliteEventStore

PROBE = Path(__file__).with_name("probe.yaml")
KILL_POINTS = 20


def _run_child(data_dir: str, execution_id: str) -> None:
    run_playbook(PROBE, data_dir=data_dir, execution_id=execution_id)
    os._exit(0)


def _durable_events(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=5) as c:
            return c.execute("SELECT COUNT(*) FROM noetl_event").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def _comparable(result) -> dict:
    j = result.to_json()
    j.pop("execution_id")
    return j


def _check_log(store: SqliteEventStore, execution_id: str, runs: dict[str, int]) -> None:
    events = store.read(execution_id)
    seqs = [e.sequence for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), "sequence must stay gap-free"
    assert len({e.event_id for e in events}) == len(events), "no duplicated event"
    done = Counter(e.step for e in events if e.name == "step.done")
    assert dict(done) == runs, "each step run finished exactly once"
    scheduled = Counter(e.step for e in events if e.name == "step.scheduled")
    assert dict(scheduled) == runs, "a resumed step run keeps its step_run_id: it is not scheduled twice"
    assert [e.name for e in events][-2:] == ["workflow.finished", "playbook.processed"]


@pytest.mark.slow
def test_kill_nine_at_many_points_then_resume(tmp_path):
    baseline_dir = tmp_path / "baseline"
    baseline = run_playbook(PROBE, data_dir=baseline_dir)
    assert baseline.status == "completed"
    expected = _comparable(baseline)
    assert expected["runs"] == {"start": 1, "fan": 1, "count": 3, "end": 1}
    total = _durable_events(baseline_dir / "events.db")
    assert total > 60

    ctx = mp.get_context("fork")
    targets = sorted({max(1, round(total * (i + 0.5) / KILL_POINTS)) for i in range(KILL_POINTS)})
    killed_at: list[int] = []
    real_kills = 0
    for n, target in enumerate(targets):
        d = tmp_path / f"kill{n}"
        eid = f"01a1f000-0000-7000-8000-{n:012d}"
        proc = ctx.Process(target=_run_child, args=(str(d), eid))
        proc.start()
        db = d / "events.db"
        deadline = time.monotonic() + 30
        while _durable_events(db) < target and proc.is_alive() and time.monotonic() < deadline:
            time.sleep(0.002)
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        real_kills += proc.exitcode == -signal.SIGKILL
        killed_at.append(_durable_events(db))
        resumed = resume_execution(eid, playbook=PROBE, data_dir=d)
        assert _comparable(resumed) == expected, f"kill point {n} (after {killed_at[-1]} events)"
        _check_log(SqliteEventStore(db), eid, expected["runs"])
    # the kills landed at many distinct places of the run, not all at the end
    assert real_kills >= KILL_POINTS * 3 // 4, f"only {real_kills} runs were killed before finishing"
    assert len(set(killed_at)) >= KILL_POINTS // 3
    assert min(killed_at) < total // 4


def test_resume_of_a_finished_execution_changes_nothing(tmp_path):
    r = run_playbook(PROBE, data_dir=tmp_path)
    store = SqliteEventStore(tmp_path / "events.db")
    before = len(store.read(r.execution_id))
    again = resume_execution(r.execution_id, data_dir=tmp_path)
    assert _comparable(again) == _comparable(r)
    assert len(store.read(r.execution_id)) == before


def test_resume_unknown_execution_is_a_clear_error(tmp_path):
    with pytest.raises(KeyError, match="no events"):
        resume_execution("nope", data_dir=tmp_path)


def test_resume_command_errors_and_success(tmp_path):
    import json

    from click.testing import CliRunner

    from noetl_dagster.commands.main import cli

    res = CliRunner().invoke(cli, ["resume", "no-such-execution", "--data-dir", str(tmp_path)])
    assert res.exit_code == 2 and "no events" in res.output and "Traceback" not in res.output
    done = run_playbook(PROBE, data_dir=tmp_path)
    res = CliRunner().invoke(cli, ["resume", done.execution_id, "--data-dir", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["runs"] == done.runs
    res = CliRunner().invoke(
        cli,
        [
            "resume",
            done.execution_id,
            "--data-dir",
            str(tmp_path),
            "--playbook",
            str(tmp_path / "missing.yaml"),
        ],
    )
    assert res.exit_code == 2 and "Traceback" not in res.output
