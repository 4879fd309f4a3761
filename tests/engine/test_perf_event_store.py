"""Issue 19.1: a big loop's events, as the engine writes them by default, land in compressed
segments - a small event store - and replay of that store equals the live run."""

from __future__ import annotations

import sqlite3

from noetl_dagster.engine import events as E
from noetl_dagster.engine.replay import diff_snapshots, replay
from noetl_dagster.runners.local import FINISHED_HOOKS, run_playbook
from noetl_dagster.storage.events import SqliteEventStore

N = 600

LOOP = f"""
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: perf_loop, path: tests/perf_loop}}
workload: {{n: {N}}}
workflow:
  - step: start
    loop: {{in: "{{{{ range(workload.n) | list }}}}", iterator: x}}
    tool:
      kind: python
      pure: true  # no barrier per iteration: the loop's events go in one batch (one segment)
      input: {{x: "{{{{ iter.x }}}}"}}
      code: "result = x * 2"
"""


def test_a_loop_is_stored_in_segments_by_default_and_replays(tmp_path):
    p = tmp_path / "pb.yaml"
    p.write_text(LOOP)
    captured = []
    FINISHED_HOOKS.append(lambda eng: captured.append(eng.state.snapshot()))
    try:
        res = run_playbook(p, data_dir=tmp_path / "data")
    finally:
        FINISHED_HOOKS.pop()
    assert res.status == "completed" and res.results["start"]["stats"]["ok"] == N
    db = tmp_path / "data" / "events.db"
    c = sqlite3.connect(db)
    try:
        segs, in_segs = c.execute(
            "SELECT COUNT(*), SUM(gid_last - gid_first + 1) FROM noetl_event_segment"
        ).fetchone()
        rows = c.execute("SELECT COUNT(*) FROM noetl_event").fetchone()[0]
    finally:
        c.close()
    assert segs >= 1 and in_segs >= 4 * N - 300, (segs, in_segs, rows)  # the iterations' events
    # one row per event took ~720 bytes per event on disk (issue 19); segments + keys take < 100
    assert db.stat().st_size < 100 * (in_segs + rows) + 200_000
    store = SqliteEventStore(db)
    try:
        evs = store.read(res.execution_id)
        assert [e.sequence for e in evs] == list(range(1, len(evs) + 1))
        assert sum(e.name == E.TASK_DONE for e in evs) == N
        assert [s.gid for s in store.tail(0, 100_000)] == list(range(1, len(evs) + 1))
        assert diff_snapshots(captured[-1], replay(store, res.execution_id).snapshot()) == []
    finally:
        store.close()


def _run_child(pb: str, data_dir: str, execution_id: str) -> None:
    import os

    run_playbook(pb, data_dir=data_dir, execution_id=execution_id)
    os._exit(0)


def test_kill_nine_while_a_loop_writes_segments_then_resume(tmp_path):
    """SIGKILL after the first segment is durable: resume finishes the loop, the log stays
    gap-free with no duplicated event, and its state equals an uninterrupted run's."""
    import multiprocessing as mp
    import os
    import signal
    import time

    from noetl_dagster.runners.local import resume_execution

    p = tmp_path / "pb.yaml"
    # segments at 2,000 and 4,000 events, 6,000 in all; the iterations after the first segment
    # (index 550 on) take >= 2 ms each, so the kill lands inside the loop however fast the engine
    # is (the loop once finished before a loaded machine's poll saw the first segment)
    slow = 'code: "import time\\nif x >= 550: time.sleep(0.002)\\nresult = x * 2"'
    p.write_text(LOOP.replace(f"{{n: {N}}}", "{n: 1500}").replace('code: "result = x * 2"', slow))
    base = run_playbook(p, data_dir=tmp_path / "base")
    assert base.results["start"]["stats"]["ok"] == 1500
    d, eid = tmp_path / "killed", "01a1f000-0000-7000-8000-00000000beef"
    proc = mp.get_context("fork").Process(target=_run_child, args=(str(p), str(d), eid))
    proc.start()
    db, deadline, segs = d / "events.db", time.monotonic() + 60, 0
    while proc.is_alive() and time.monotonic() < deadline and not segs:
        time.sleep(0.005)
        try:
            c = sqlite3.connect(db, timeout=5)
            try:
                segs = c.execute("SELECT COUNT(*) FROM noetl_event_segment").fetchone()[0]
            finally:
                c.close()
        except sqlite3.OperationalError:  # not created yet
            pass
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    assert segs >= 1 and proc.exitcode == -signal.SIGKILL  # killed inside the loop, after a segment
    resumed = resume_execution(eid, playbook=p, data_dir=d)
    assert resumed.status == "completed"
    assert resumed.results["start"] == base.results["start"]
    store = SqliteEventStore(db)
    try:
        evs = store.read(eid)
        assert [e.sequence for e in evs] == list(range(1, len(evs) + 1))
        assert len({e.event_id for e in evs}) == len(evs)
        assert [e.name for e in evs][-2:] == ["workflow.finished", "playbook.processed"]
    finally:
        store.close()
