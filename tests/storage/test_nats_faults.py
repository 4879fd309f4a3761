"""Fault tests of the NATS tiers with real processes (issue 45 item 3): a projector killed with SIGKILL
mid-batch (inside its transaction, and after the commit before the ack) and restarted; a NATS server of
our own killed with SIGKILL and restarted under a running event store (the machine's shared server is
never touched)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
from nats_tier_fixtures import PG_DB, new_tier

from noetl_dagster.engine.chain import check_chain
from noetl_dagster.engine.events import Event
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage import nats_consumers as nc
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.storage.nats_projection import Projection

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "example_project" / "playbooks"
CLI = str(Path(sys.executable).with_name("noetl-dagster"))


@pytest.fixture(scope="module")
def _tiers():
    made = []
    yield made
    for t in made:
        t.cleanup()


def _env(**extra: str) -> dict[str, str]:
    paths = [str(REPO), *(str(REPO / d) for d in ("analytics", "lineage", "registry_service"))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}


def _stream_count(tier, p) -> int:
    from noetl_dagster.storage.nats_streams import connect  # noqa: PLC0415

    with connect(tier.nats_url) as client:
        return client.call(client.js.stream_info(p.events_stream)).state.messages


def _wait_idle_in_transaction(schema: str, timeout: float = 60) -> None:
    """Until the projector holds an open transaction that has written its batch (mid-batch)."""
    end = time.monotonic() + timeout
    with psycopg.connect(PG_DB, autocommit=True) as conn:
        while time.monotonic() < end:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'"
                " AND datname = current_database() AND query LIKE %s",
                (f'%"{schema}".projection_checkpoint%',),
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.1)
    raise AssertionError("the projector never reached the middle of a batch")


def _check_complete(tier, p, total: int) -> None:
    projection = Projection(tier.projection_url)
    try:
        events = projection.rows("event_projection")
        assert len(events) == total  # none missing, none twice
        by_exec: dict[str, list[int]] = {}
        for row in events:
            by_exec.setdefault(row[2], []).append(row[3])
        assert all(sorted(v) == list(range(1, len(v) + 1)) for v in by_exec.values())
        assert len(projection.rows("processed_event")) == total
        [cp] = projection.rows("projection_checkpoint")
        assert cp[4] == total
        live = projection.canonical_dump()
        nc.rebuild_from_stream(tier.url, p)
        assert projection.canonical_dump() == live  # what the restarted consumer built == a clean rebuild
    finally:
        projection.close()


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["in_txn", "before_ack"])
def test_projector_killed_mid_batch_restarts_without_duplicates_or_gaps(stage, tmp_path, _tiers):
    tier = new_tier(tmp_path)
    _tiers.append(tier)
    for name in ("hello_dagster", "fanout_join", "countdown_cycle"):
        run_playbook(EXAMPLES / f"{name}.yaml", data_dir=tmp_path / "d", event_store=tier.url)
    p = tier.placement()
    total = _stream_count(tier, p)
    args = [CLI, "projector", "--store", tier.url, "--shard", p.shard, "--batch", "16"]
    proc = subprocess.Popen(args, env=_env(NOETL_PROJECTOR_STALL=f"{stage}:60"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    try:
        if stage == "in_txn":
            _wait_idle_in_transaction(tier.schema)
        else:  # the first batch committed: its rows exist, its ack was never sent
            end = time.monotonic() + 60
            while time.monotonic() < end:
                try:
                    with psycopg.connect(PG_DB) as c:
                        n = c.execute(f'SELECT count(*) FROM "{tier.schema}".processed_event').fetchone()[0]
                except psycopg.errors.UndefinedTable:
                    n = 0
                if n:
                    break
                time.sleep(0.1)
            assert n == 16
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    with psycopg.connect(PG_DB) as c:
        n = c.execute(f'SELECT count(*) FROM "{tier.schema}".processed_event').fetchone()[0]
    assert n == (0 if stage == "in_txn" else 16)  # the killed transaction left nothing
    done = subprocess.run([*args, "--once"], env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    # the restarted consumer starts after the committed checkpoint (in_txn: 0; before_ack: the first batch)
    assert f"projected {total if stage == 'in_txn' else total - 16} events" in done.stdout
    _check_complete(tier, p, total)


@pytest.mark.slow
def test_archiver_killed_before_publishing_its_progress_archives_each_execution_once(tmp_path, _tiers):
    tier = new_tier(tmp_path)
    _tiers.append(tier)
    runs = [run_playbook(EXAMPLES / "hello_dagster.yaml", data_dir=tmp_path / "d", event_store=tier.url)
            for _ in range(3)]  # fmt: skip
    p = tier.placement()
    args = [CLI, "archiver", "--store", tier.url, "--shard", p.shard]
    proc = subprocess.Popen(args, env=_env(NOETL_PROJECTOR_STALL="archived:60"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    try:
        end = time.monotonic() + 60
        while not nc.archive_bundles("file://" + str(tier.payload)):
            assert time.monotonic() < end, "the archiver wrote no bundle"
            time.sleep(0.1)
        time.sleep(0.5)  # the batch's bundles are written; the process sleeps before its progress
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    from noetl_dagster.storage.nats_streams import connect  # noqa: PLC0415

    with connect(tier.nats_url) as client:
        assert nc.last_archive_ack(client, p) == {}  # killed before any progress was published
    done = subprocess.run([*args, "--once"], env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    bundles = nc.archive_bundles("file://" + str(tier.payload))
    assert sorted(b.rstrip("/").rsplit("%3D", 1)[1] for b in bundles) == sorted(r.execution_id for r in runs)
    assert '"archived_through":78' in done.stdout and '"status":"exists"' in done.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_nats(port: int, store_dir: Path) -> subprocess.Popen:
    binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
    proc = subprocess.Popen([binary, "-js", "-sd", str(store_dir), "-a", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    end = time.monotonic() + 20
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("nats-server did not start")


@pytest.mark.slow
def test_own_nats_server_killed_and_restarted_under_a_running_store(tmp_path, _tiers):
    port = _free_port()
    store_dir = tmp_path / "js"
    server = _start_nats(port, store_dir)
    tier = new_tier(tmp_path, nats_url=f"nats://127.0.0.1:{port}")
    stop = threading.Event()
    proj = None
    try:
        with open_event_store(tier.url) as store:
            first = [Event("ctx.patched", "ex-r", data={"i": i}) for i in range(20)]
            store.append(first)
            # a projector running through the outage, as its process would
            proj = nc.Projector(tier.url, [tier.placement()])
            runner = threading.Thread(target=proj.run, args=(stop.is_set,), daemon=True)
            runner.start()
            server.send_signal(signal.SIGKILL)
            server.wait(10)
            with pytest.raises(Exception):  # noqa: B017 - an append while the server is down fails, loses nothing silently
                store.append([Event("ctx.patched", "ex-r", data={"i": "down"})])
            server = _start_nats(port, store_dir)
            # the same store object reconnects; acknowledged events survived the kill
            deadline = time.monotonic() + 30
            while True:
                try:
                    store.append([Event("ctx.patched", "ex-r", data={"i": 20})])
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            evs = store.read("ex-r")
            # the failed append may or may not have reached the server before the kill: either way numbered once
            data = [e.data["i"] for e in evs]
            assert data[:20] == list(range(20)) and data[-1] == 20 and len(data) in (21, 22)
            assert [e.sequence for e in evs] == list(range(1, len(evs) + 1))
            assert check_chain("ex-r", store.read_chained("ex-r")).to_json()["status"] == "ok"
            # the projector caught up after the restart, by itself
            p = tier.placement()
            deadline = time.monotonic() + 60
            while proj.projection.checkpoint("state", p.region, p.shard, p.events_stream) < len(evs):
                assert time.monotonic() < deadline, "the projector did not resume after the server restart"
                time.sleep(0.2)
            assert [e.sequence for e in proj.projection.read("ex-r")] == list(range(1, len(evs) + 1))
    finally:
        stop.set()
        if proj is not None:
            runner.join(10)
            proj.close()
        server.send_signal(signal.SIGKILL)
        server.wait(10)
        with psycopg.connect(PG_DB, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{tier.schema}" CASCADE')
