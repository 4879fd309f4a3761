"""kill -9 with pure steps grouped between durability barriers (issue 46): the effect of a step run
the log shows finished never runs again on resume, a step run in flight at the kill runs again
(at-least-once), the log stays gap-free with no duplicated event, and the resumed execution ends as an
uninterrupted one. The effect appends one line per step run to a file; kill points are taken after
each effect line, at several delays (inside the effect, in the pure steps after it, at routing).
SQLite and Postgres, a forked process per run."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from noetl_dagster.engine import events as E
from noetl_dagster.runners.local import resume_execution, run_playbook
from noetl_dagster.storage.event_stores import open_event_store

PG = os.environ.get("NOETL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
ROUNDS = 3
PLAYBOOK = f"""
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: kill_boundary, path: tests/kill_boundary}}
workload: {{mark: "", rounds: {ROUNDS}}}
workflow:
  - step: start
    tool: {{kind: rhai, code: "let s = 0; for i in 0..200 {{ s += i; }} s"}}
    set: {{ctx.round: 0}}
    next: {{arcs: [{{step: think}}]}}
  - step: think
    tool:
      kind: python
      pure: true
      input: {{r: "{{{{ ctx.round }}}}"}}
      code: |
        import time
        time.sleep(0.01)
        result = {{"r": r}}
    next: {{arcs: [{{step: effect}}]}}
  - step: effect
    tool:
      kind: python
      input: {{r: "{{{{ ctx.round }}}}", mark: "{{{{ workload.mark }}}}"}}
      code: |
        import time
        with open(mark, "a") as f:
            f.write(f"effect:{{r}}\\n")
        time.sleep(0.01)
        result = {{"round": r}}
    set: {{ctx.round: "{{{{ effect.round + 1 }}}}"}}
    next: {{arcs: [{{step: tally}}]}}
  - step: tally
    tool: {{kind: rhai, code: "let t = 0; for i in 0..300 {{ t += i; }} t"}}
    next:
      arcs:
        - {{step: think, when: "{{{{ ctx.round < workload.rounds }}}}"}}
        - {{step: end, when: "{{{{ ctx.round >= workload.rounds }}}}"}}
  - step: end
    tool:
      kind: python
      input: {{mark: "{{{{ workload.mark }}}}"}}
      code: |
        with open(mark, "a") as f:
            f.write("end\\n")
        result = {{"done": True}}
"""


@pytest.fixture(params=["sqlite", "postgres"], scope="module")  # outlives the replay check (conftest)
def store_url(request):
    if request.param == "sqlite":
        yield None  # the data dir's events.db
        return
    schema = "killb_" + uuid.uuid4().hex[:8]
    yield f"{PG}?schema={schema}"
    with psycopg.connect(PG, autocommit=True) as c:
        c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _child(path: str, mark: str, data_dir: str, url: str | None, eid: str) -> None:
    run_playbook(path, {"mark": mark}, event_store=url, data_dir=data_dir, execution_id=eid)
    os._exit(0)


def _lines(mark: Path) -> list[str]:
    return mark.read_text().splitlines() if mark.exists() else []


def _finished_effects(url: str | None, data_dir: Path, eid: str) -> list[int] | None:
    """The rounds whose effect step run the durable log shows finished (None: no event is durable)."""
    store = open_event_store(url, data_dir=data_dir)
    try:
        evs = store.read(eid)
    finally:
        store.close()
    if not evs:
        return None
    return [e.data["result"]["round"] for e in evs if e.name == E.STEP_DONE and e.step == "effect"]


@pytest.mark.slow
def test_kill_nine_between_barriers_then_resume(tmp_path, store_url):
    path = tmp_path / "pb.yaml"
    path.write_text(PLAYBOOK)
    base_mark = tmp_path / "base.mark"
    base = run_playbook(path, {"mark": str(base_mark)}, event_store=store_url, data_dir=tmp_path / "base")
    assert base.status == "completed" and base.ctx["round"] == ROUNDS
    assert _lines(base_mark) == [f"effect:{r}" for r in range(ROUNDS)] + ["end"]

    ctx = mp.get_context("fork")
    # before the first effect, then after each effect line (inside it, in the pure steps after it, ...)
    points = [(0, 0.01), (0, 0.03)] + [
        (k, d) for k in range(1, ROUNDS + 1) for d in (0.0, 0.004, 0.012, 0.03)
    ]
    killed = 0
    for n, (after_lines, delay) in enumerate(points):
        d, mark = tmp_path / f"k{n}", tmp_path / f"k{n}.mark"
        eid = str(uuid.uuid4())
        proc = ctx.Process(target=_child, args=(str(path), str(mark), str(d), store_url, eid))
        proc.start()
        deadline = time.monotonic() + 30
        while len(_lines(mark)) < after_lines and proc.is_alive() and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(delay)
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        killed += proc.exitcode == -signal.SIGKILL
        finished = _finished_effects(store_url, d, eid)
        ran = Counter(_lines(mark))
        if finished is None:  # killed before its request was durable: it never existed, nothing ran
            assert not ran, (n, ran)
            continue
        # what the log shows finished had its effect exactly once so far
        assert all(ran[f"effect:{r}"] == 1 for r in finished), (n, finished, ran)

        resumed = resume_execution(eid, playbook=path, event_store=store_url, data_dir=d)
        assert resumed.status == "completed" and resumed.ctx == base.ctx and resumed.runs == base.runs, n
        after = Counter(_lines(mark))
        for r in finished:  # never run again by the resume
            assert after[f"effect:{r}"] == 1, (n, r, after)
        # at most the step run in flight at the kill ran twice
        assert sum(c - 1 for c in after.values()) <= 1, (n, after)
        assert set(after) == set(_lines(base_mark)), n

        store = open_event_store(store_url, data_dir=d)
        try:
            evs = store.read(eid)
        finally:
            store.close()
        assert [e.sequence for e in evs] == list(range(1, len(evs) + 1)), "gap-free"
        assert len({e.event_id for e in evs}) == len(evs), "no event twice"
        assert Counter(e.step for e in evs if e.name == E.STEP_DONE) == Counter(base.runs)
        assert [e.name for e in evs][-2:] == [E.WORKFLOW_FINISHED, E.PLAYBOOK_PROCESSED]
    assert killed >= len(points) * 2 // 3, f"only {killed} of {len(points)} runs were killed before finishing"
