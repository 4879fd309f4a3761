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
        segs, in_segs = c.execute("SELECT COUNT(*), SUM(gid_last - gid_first + 1) FROM noetl_event_segment").fetchone()
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
