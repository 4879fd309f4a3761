"""Cursor loops on DuckDB (a queue table in a database file) and on NATS JetStream (the local server
at 127.0.0.1:4222, a durable pull consumer): every row once, and resume after SIGKILL (issue 17.2)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.tools.cursor_common import cli, resume_last, wait

NATS_URL = "nats://127.0.0.1:4222"

BODY = """\
    tool:
      - work:
          kind: python
          input: {{jid: "{{{{ {key} }}}}"}}
          code: |
            import os, pathlib, time
            pathlib.Path("{marks}", f"started-{{jid}}").touch()
            if os.environ.get("CURSOR_SLOW_ID") == str(jid):
                time.sleep(120)
            time.sleep(float(os.environ.get("CURSOR_DELAY", "0")))  # lets a second execution start in time
            with open("{marks}/processed.log", "a") as f:
                f.write(f"{{jid}}\\n")
            result = {{"jid": jid}}
"""


def _duckdb_playbook(db: Path, marks: Path) -> str:
    return f"""\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: cursor_duck, path: tests/cursor_duck}}
workflow:
  - step: start
    loop:
      cursor:
        kind: duckdb
        claim: |
          UPDATE q SET status = 'claimed', owner = '{{{{ cursor.owner }}}}'
          WHERE id IN (SELECT id FROM q WHERE status = 'pending'
                          OR (status = 'claimed' AND owner = '{{{{ cursor.owner }}}}')
                       ORDER BY id LIMIT {{{{ cursor.max_rows }}}})
          RETURNING id, payload
        options: {{database: "{db}", ack: "UPDATE q SET status = 'done' WHERE id = $id"}}
      iterator: job
      spec: {{mode: cursor, frame: {{max_rows: 2}}}}
{BODY.format(key="job.id", marks=marks)}"""


def _nats_playbook(stream: str, subject: str, marks: Path, lease: float) -> str:
    return f"""\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: cursor_nats, path: tests/cursor_nats}}
workflow:
  - step: start
    loop:
      cursor:
        kind: nats_stream
        auth: "{NATS_URL}"
        claim: "{subject}"
        options: {{stream: {stream}, durable: {stream}_workers, fetch_timeout: 0.5}}
      iterator: msg
      spec: {{mode: cursor, frame: {{max_rows: 2, lease_seconds: {lease}, heartbeat_seconds: 0.5}}}}
{BODY.format(key="msg.n", marks=marks)}"""


def _processed(marks: Path) -> Counter:
    log = marks / "processed.log"
    return Counter(int(x) for x in log.read_text().split()) if log.exists() else Counter()


def _kill_and_resume(pb: Path, data: Path, marks: Path) -> dict:
    run = cli("run", str(pb), "--data-dir", str(data), "-q", env={**os.environ, "CURSOR_SLOW_ID": "3"})
    wait(lambda: (marks / "started-3").exists())
    time.sleep(0.3)
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=30)
    assert run.returncode == -signal.SIGKILL
    assert _processed(marks) == Counter({1: 1, 2: 1})
    return resume_last(data)


def _duck_queue(tmp_path: Path, n: int) -> Path:
    import duckdb

    db = tmp_path / "queue.duckdb"
    with duckdb.connect(str(db)) as conn:
        conn.execute(
            "CREATE TABLE q (id INTEGER PRIMARY KEY, payload VARCHAR, status VARCHAR DEFAULT 'pending', owner VARCHAR)"
        )
        conn.executemany("INSERT INTO q (id, payload) VALUES (?, ?)", [(i, f"p{i}") for i in range(1, n + 1)])
    return db


def _duck_status(db: Path) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(db), read_only=True) as conn:
        return conn.execute("SELECT status, count(*) FROM q GROUP BY status").fetchall()


def test_duckdb_cursor_loop_processes_every_row_once(tmp_path):
    from noetl_dagster.dsl import load_playbook
    from noetl_dagster.runners.local import run_playbook

    db = _duck_queue(tmp_path, 5)
    pb = tmp_path / "pb.yaml"
    pb.write_text(_duckdb_playbook(db, tmp_path))
    res = run_playbook(load_playbook(pb), data_dir=tmp_path / "d")
    assert res.status == "completed", res.results
    assert res.results["start"]["stats"] == {"total": 5, "ok": 5, "failed": 0}
    assert _processed(tmp_path) == Counter({i: 1 for i in range(1, 6)})
    assert _duck_status(db) == [("done", 5)]


@pytest.mark.slow
def test_duckdb_cursor_loop_resumes_after_sigkill(tmp_path):
    db = _duck_queue(tmp_path, 6)
    pb = tmp_path / "pb.yaml"
    pb.write_text(_duckdb_playbook(db, tmp_path))
    out = _kill_and_resume(pb, tmp_path / "d", tmp_path)
    assert out["status"] == "completed"
    assert _processed(tmp_path) == Counter({i: 1 for i in range(1, 7)})
    assert out["results"]["start"]["stats"] == {"total": 6, "ok": 6, "failed": 0}
    assert _duck_status(db) == [("done", 6)]


async def _nats_setup(stream: str, subject: str, n: int) -> None:
    import nats

    nc = await nats.connect(NATS_URL)
    js = nc.jetstream()
    await js.add_stream(name=stream, subjects=[subject])
    for i in range(1, n + 1):
        await js.publish(subject, json.dumps({"n": i}).encode())
    await nc.close()


async def _nats_pending(stream: str) -> tuple[int, int]:
    import nats

    nc = await nats.connect(NATS_URL)
    info = await nc.jetstream().consumer_info(stream, f"{stream}_workers")
    await nc.close()
    return info.num_pending, info.num_ack_pending


async def _nats_drop(stream: str) -> None:
    import nats

    nc = await nats.connect(NATS_URL)
    try:
        await nc.jetstream().delete_stream(stream)
    finally:
        await nc.close()


@pytest.fixture
def nats_stream():
    stream = f"CQ{uuid.uuid4().hex[:8]}"
    yield stream, f"cq.{stream}.jobs"
    asyncio.run(_nats_drop(stream))


def test_nats_stream_cursor_loop_consumes_every_message_once(tmp_path, nats_stream):
    from noetl_dagster.dsl import load_playbook
    from noetl_dagster.runners.local import run_playbook

    stream, subject = nats_stream
    asyncio.run(_nats_setup(stream, subject, 5))
    pb = tmp_path / "pb.yaml"
    pb.write_text(_nats_playbook(stream, subject, tmp_path, lease=30))
    res = run_playbook(load_playbook(pb), data_dir=tmp_path / "d")
    assert res.status == "completed", res.results
    assert res.results["start"]["stats"] == {"total": 5, "ok": 5, "failed": 0}
    assert _processed(tmp_path) == Counter({i: 1 for i in range(1, 6)})
    assert asyncio.run(_nats_pending(stream)) == (0, 0)  # every message acknowledged


@pytest.mark.slow
def test_nats_stream_cursor_loop_resumes_after_sigkill(tmp_path, nats_stream):
    stream, subject = nats_stream
    asyncio.run(_nats_setup(stream, subject, 6))
    pb = tmp_path / "pb.yaml"
    pb.write_text(
        _nats_playbook(stream, subject, tmp_path, lease=2)
    )  # ack_wait 2 s: redelivered after the kill
    out = _kill_and_resume(pb, tmp_path / "d", tmp_path)
    assert out["status"] == "completed"
    assert _processed(tmp_path) == Counter({i: 1 for i in range(1, 7)})
    assert out["results"]["start"]["stats"] == {"total": 6, "ok": 6, "failed": 0}
    assert asyncio.run(_nats_pending(stream)) == (0, 0)


@pytest.mark.slow
def test_dagster_runner_gives_the_same_cursor_loop_trace(tmp_path):
    """The Dagster runner runs the cursor loop inside its step op: same summary, same events per step."""
    import dagster as dg

    from noetl_dagster.runners.local import run_playbook
    from noetl_dagster.storage.event_stores import open_event_store
    from noetl_dagster.translator.runner import run_playbook_dagster

    def names(data: Path, eid: str) -> list[tuple]:
        store = open_event_store(None, data_dir=data)
        try:
            return [(e.step, e.iteration, e.name, (e.data or {}).get("cursor_key")) for e in store.read(eid)]
        finally:
            store.close()

    runs = {}
    for runner in ("local", "dagster"):
        d = tmp_path / runner
        d.mkdir()
        db = _duck_queue(d, 4)
        pb = d / "pb.yaml"
        pb.write_text(_duckdb_playbook(db, d))
        if runner == "local":
            res = run_playbook(pb, data_dir=d / "data")
        else:
            inst = dg.DagsterInstance.ephemeral()
            try:
                res = run_playbook_dagster(pb, None, data_dir=d / "data", instance=inst, mode="default")
            finally:
                inst.dispose()
        assert res.status == "completed", res.results
        assert _processed(d) == Counter({i: 1 for i in range(1, 5)})
        runs[runner] = (res.to_json()["results"], names(d / "data", res.execution_id))
    assert runs["dagster"][0] == runs["local"][0]
    local_trace = [t for t in runs["local"][1] if t[2].startswith(("loop.", "task.", "step."))]
    dag_trace = [t for t in runs["dagster"][1] if t[2].startswith(("loop.", "task.", "step."))]
    assert dag_trace == local_trace


def test_templated_frame_policy_and_noetl_claim_names(tmp_path):
    """NoETL's fixtures template the frame policy and read ``__frame_max_rows`` in the claim."""
    from noetl_dagster.dsl import load_playbook
    from noetl_dagster.runners.local import run_playbook
    from noetl_dagster.storage.event_stores import open_event_store

    db = _duck_queue(tmp_path, 5)
    text = _duckdb_playbook(db, tmp_path).replace(
        "LIMIT {{ cursor.max_rows }}", "LIMIT {{ __frame_max_rows | default(1) | int }}"
    )
    text = text.replace("frame: {max_rows: 2}", 'frame: {max_rows: "{{ workload.rows }}"}')
    text = text.replace("workflow:", "workload: {rows: 3}\nworkflow:", 1)
    pb = tmp_path / "pb.yaml"
    pb.write_text(text)
    res = run_playbook(load_playbook(pb), data_dir=tmp_path / "d")
    assert res.status == "completed", res.results
    store = open_event_store(None, data_dir=tmp_path / "d")
    try:
        counts = [e.data["count"] for e in store.read(res.execution_id) if e.name == "loop.frame.claimed"]
    finally:
        store.close()
    assert counts == [3, 2]
    bad = run_playbook(load_playbook(pb), {"rows": 0}, data_dir=tmp_path / "d2")
    assert bad.status == "failed"
    assert "loop.spec.frame: Input should be greater than or equal to 1" in json.dumps(bad.to_json())


@pytest.mark.slow
def test_two_executions_share_one_nats_durable_without_double_processing(tmp_path, nats_stream):
    stream, subject = nats_stream
    n = 30
    asyncio.run(_nats_setup(stream, subject, n))
    pb = tmp_path / "pb.yaml"
    pb.write_text(_nats_playbook(stream, subject, tmp_path, lease=30))
    env = {**os.environ, "CURSOR_DELAY": "0.1"}
    runs = [
        cli("run", str(pb), "--data-dir", str(tmp_path / f"d{k}"), "--json", "-q", env=env) for k in range(2)
    ]
    outs = [r.communicate(timeout=240) for r in runs]
    for r, (out, err) in zip(runs, outs, strict=True):
        assert r.returncode == 0, out + err
    assert _processed(tmp_path) == Counter({i: 1 for i in range(1, n + 1)})
    per_exec = [json.loads(out)["results"]["start"]["stats"]["ok"] for out, _ in outs]
    assert sum(per_exec) == n and all(k > 0 for k in per_exec), per_exec
    assert asyncio.run(_nats_pending(stream)) == (0, 0)
