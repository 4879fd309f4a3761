"""Cursor loops on a real PostgreSQL queue table (issue 17.2): frames claimed with
``FOR UPDATE SKIP LOCKED``, executions sharing one queue, and resume after SIGKILL without losing or
double-processing a claimed row (killed inside the body, and after the row was recorded but before
its ack)."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from noetl_dagster.storage.event_stores import open_event_store
from tests.tools.cursor_common import cli, resume_last, wait

DSN = "postgresql://postgres@127.0.0.1:5432/test"


def _playbook(table: str, marker_dir: Path, *, slots: int = 1, max_rows: int = 2, lease: float = 60) -> str:
    # the claim takes pending rows, rows this slot (cursor.owner) still holds, and rows whose lease ran out
    return f"""\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: cursor_pg, path: tests/cursor_pg}}
workflow:
  - step: start
    loop:
      cursor:
        kind: postgres
        auth: "{DSN}"
        claim: |
          UPDATE {table} SET status = 'claimed', owner = '{{{{ cursor.owner }}}}',
                 lease_until = now() + make_interval(secs => {{{{ cursor.lease_seconds }}}})
          WHERE id IN (SELECT id FROM {table}
                       WHERE status = 'pending'
                          OR (status = 'claimed' AND (owner = '{{{{ cursor.owner }}}}' OR lease_until < now()))
                       ORDER BY id LIMIT {{{{ cursor.max_rows }}}} FOR UPDATE SKIP LOCKED)
          RETURNING id, payload
        options:
          key: id
          ack: "SELECT {table}_ack(%(id)s)"
          heartbeat: "UPDATE {table} SET lease_until = now() + interval '60 seconds' WHERE id = ANY(%(keys)s)"
      iterator: job
      spec:
        mode: cursor
        max_in_flight: {slots}
        frame: {{max_rows: {max_rows}, lease_seconds: {lease}, heartbeat_seconds: 0.5}}
    tool:
      - maybe_slow:
          kind: python
          input: {{jid: "{{{{ job.id }}}}"}}
          code: |
            import os, pathlib, time
            pathlib.Path("{marker_dir}", f"started-{{jid}}").touch()
            if os.environ.get("CURSOR_SLOW_ID") == str(jid):
                time.sleep(120)
            time.sleep(float(os.environ.get("CURSOR_DELAY", "0")))  # lets a second execution start in time
            result = {{"jid": jid}}
      - record:
          kind: postgres
          auth: "{DSN}"
          command: "INSERT INTO {table}_done (id, owner) VALUES ({{{{ job.id }}}}, '{{{{ execution_id }}}}')"
      - ret:
          kind: python
          input: {{jid: "{{{{ job.id }}}}"}}
          code: "result = {{'jid': jid}}"
"""


@pytest.fixture
def queue(tmp_path):
    table = f"cq_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, payload text, status text NOT NULL DEFAULT 'pending', "
                     "owner text, lease_until timestamptz)")  # fmt: skip
        conn.execute(f"CREATE TABLE {table}_done (id int, owner text)")  # no key: a second insert must show
        conn.execute(f"CREATE TABLE {table}_ctl (slow_ack int)")
        conn.execute(f"INSERT INTO {table}_ctl VALUES (NULL)")
        # the ack: marks the row done; sleeps first for the row named in _ctl (the kill-before-ack window)
        conn.execute(f"""CREATE FUNCTION {table}_ack(i int) RETURNS void LANGUAGE plpgsql AS $$
            BEGIN
              IF (SELECT slow_ack FROM {table}_ctl) = i THEN PERFORM pg_sleep(120); END IF;
              UPDATE {table} SET status = 'done' WHERE id = i;
            END $$""")
    yield table
    with psycopg.connect(DSN, autocommit=True) as conn:
        # a killed client's ack may still sleep on the server (it ends only when it next writes to the socket)
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                     "AND query LIKE %s", (f"%{table}_ack%",))  # fmt: skip
        conn.execute(f"DROP TABLE IF EXISTS {table}, {table}_done, {table}_ctl")
        conn.execute(f"DROP FUNCTION IF EXISTS {table}_ack(int)")


def _fill(table: str, n: int) -> None:
    with psycopg.connect(DSN, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {table} (id, payload) VALUES (%s, %s)", [(i, f"p{i}") for i in range(1, n + 1)]
            )


def _sql(q: str) -> list[tuple]:
    with psycopg.connect(DSN, autocommit=True) as conn:
        return conn.execute(q).fetchall()


def _exactly_once(table: str, n: int) -> None:
    done = _sql(f"SELECT id, count(*) FROM {table}_done GROUP BY id ORDER BY id")
    assert done == [(i, 1) for i in range(1, n + 1)], done
    assert _sql(f"SELECT count(*) FROM {table} WHERE status <> 'done'") == [(0,)]


def test_cursor_loop_claims_frames_and_acks_every_row(queue, tmp_path):
    from noetl_dagster.dsl import load_playbook
    from noetl_dagster.runners.local import run_playbook

    _fill(queue, 5)
    pb_file = tmp_path / "pb.yaml"
    pb_file.write_text(_playbook(queue, tmp_path))
    res = run_playbook(load_playbook(pb_file), data_dir=tmp_path / "d")
    assert res.status == "completed", res.results
    agg = res.results["start"]
    assert agg["stats"] == {"total": 5, "ok": 5, "failed": 0}
    assert sorted(r["jid"] for r in agg["results"]) == [1, 2, 3, 4, 5]
    _exactly_once(queue, 5)
    store = open_event_store(None, data_dir=tmp_path / "d")
    try:
        events = store.read(res.execution_id)
    finally:
        store.close()
    frames = [e.data for e in events if e.name == "loop.frame.claimed"]
    assert [f["count"] for f in frames] == [2, 2, 1]  # frame.max_rows 2
    assert sorted(e.data["cursor_key"] for e in events if e.name == "loop.iteration.done") == [
        "1",
        "2",
        "3",
        "4",
        "5",
    ]
    started = next(e for e in events if e.name == "loop.started")
    assert started.data["mode"] == "cursor" and started.data["frame"]["max_rows"] == 2


@pytest.mark.slow
def test_two_executions_share_one_queue_without_double_processing(queue, tmp_path):
    n = 40
    _fill(queue, n)
    pb_file = tmp_path / "pb.yaml"
    pb_file.write_text(_playbook(queue, tmp_path, slots=2, max_rows=3))
    env = {**os.environ, "CURSOR_DELAY": "0.1"}
    runs = [
        cli("run", str(pb_file), "--data-dir", str(tmp_path / f"d{k}"), "--json", "-q", env=env)
        for k in range(2)
    ]
    outs = [r.communicate(timeout=240) for r in runs]
    for r, (out, err) in zip(runs, outs, strict=True):
        assert r.returncode == 0, out + err
    _exactly_once(queue, n)
    per_exec = [json.loads(out)["results"]["start"]["stats"]["ok"] for out, _ in outs]
    assert sum(per_exec) == n and all(k > 0 for k in per_exec), per_exec  # both took rows, none twice


@pytest.mark.slow
@pytest.mark.parametrize("where", ["body", "before_ack"])
def test_resume_after_sigkill_loses_and_repeats_no_row(queue, tmp_path, where):
    n = 6
    _fill(queue, n)
    pb_file = tmp_path / "pb.yaml"
    pb_file.write_text(_playbook(queue, tmp_path, max_rows=2))
    data = tmp_path / "d"
    env = dict(os.environ)
    if where == "body":
        env["CURSOR_SLOW_ID"] = "3"  # row 3's body sleeps: killed inside it
    else:
        _sql(
            f"UPDATE {queue}_ctl SET slow_ack = 3 RETURNING 1"
        )  # row 3 recorded, its ack sleeps: killed there
    run = cli("run", str(pb_file), "--data-dir", str(data), "-q", env=env)
    if where == "body":
        wait(lambda: (tmp_path / "started-3").exists())
    else:
        wait(lambda: _sql(f"SELECT count(*) FROM {queue}_done WHERE id = 3") == [(1,)])
    time.sleep(0.5)
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=30)
    assert run.returncode == -signal.SIGKILL
    # row 3 (and its frame mate 4) stay claimed by the dead slot; nothing is lost meanwhile
    assert _sql(f"SELECT id, status FROM {queue} WHERE status = 'claimed' ORDER BY id") == [
        (3, "claimed"),
        (4, "claimed"),
    ]
    _sql(f"UPDATE {queue}_ctl SET slow_ack = NULL RETURNING 1")

    out = resume_last(data)
    eid = out["execution_id"]
    assert out["status"] == "completed"
    _exactly_once(queue, n)
    agg = out["results"]["start"]
    assert agg["stats"] == {"total": n, "ok": n, "failed": 0}
    assert sorted(r["jid"] for r in agg["results"]) == list(range(1, n + 1))
    store = open_event_store(None, data_dir=data)
    try:
        keys = [e.data["cursor_key"] for e in store.read(eid) if e.name == "loop.iteration.done"]
    finally:
        store.close()
    assert sorted(keys) == [str(i) for i in range(1, n + 1)]  # each row finished exactly once in the log


@pytest.mark.parametrize("with_fail", [False, True])
def test_a_failing_row_is_bounded_by_max_attempts_or_moved_by_fail(queue, tmp_path, with_fail):
    """Without a `fail` statement the owner clause hands a failed row straight back: frame.max_attempts
    (NoETL's FramePolicy) bounds it and the slot stops, leaving the row claimed and the rest pending (none
    lost, for another run or the operator). With `fail` moving it out of the queue the loop goes on."""
    from noetl_dagster.dsl import load_playbook
    from noetl_dagster.runners.local import run_playbook
    from noetl_dagster.storage.event_stores import open_event_store

    _fill(queue, 4)
    text = (
        _playbook(queue, tmp_path, max_rows=1)
        .replace(
            'result = {"jid": jid}\n      - record:',
            "assert jid != 2, 'row 2 is poison'\n            result = {\"jid\": jid}\n      - record:",
        )
        .replace("heartbeat_seconds: 0.5}", "heartbeat_seconds: 0.5, max_attempts: 3}")
    )
    if with_fail:
        text = text.replace(
            "          key: id\n",
            f"          key: id\n          fail: \"UPDATE {queue} SET status = 'failed' WHERE id = %(id)s\"\n",
        )
    assert "row 2 is poison" in text and "max_attempts: 3" in text
    pb = tmp_path / "pb.yaml"
    pb.write_text(text)
    res = run_playbook(load_playbook(pb), data_dir=tmp_path / "d")
    assert res.status == "failed"  # a failed iteration fails the loop step
    store = open_event_store(None, data_dir=tmp_path / "d")
    try:
        failed = [
            e.data["cursor_key"] for e in store.read(res.execution_id) if e.name == "loop.iteration.failed"
        ]
    finally:
        store.close()
    rows = _sql(f"SELECT id, status FROM {queue} ORDER BY id")
    if with_fail:
        assert failed == ["2"]
        assert res.results["start"]["stats"] == {"total": 4, "ok": 3, "failed": 1}
        assert rows == [(1, "done"), (2, "failed"), (3, "done"), (4, "done")]
    else:
        assert failed == ["2", "2", "2"]
        assert res.results["start"]["stats"] == {"total": 4, "ok": 1, "failed": 3}
        assert rows == [(1, "done"), (2, "claimed"), (3, "pending"), (4, "pending")]
