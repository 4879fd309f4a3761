"""The local mode (issue 46, seed 004 H.11): Arrow batches under <data dir>/local/<execution_id>/,
read by every command as a stored execution, pushed to SQLite or Postgres in one transaction."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from noetl_dagster.engine.chain import check_chain
from noetl_dagster.engine.events import Event
from noetl_dagster.storage.events import SqliteEventStore
from noetl_dagster.storage.feather_events import EVENTS_FILE, FeatherEventStore
from noetl_dagster.storage.local_mode import PushRefused, push

ROOT = Path(__file__).resolve().parents[2]
ENV_PATH = os.pathsep.join(str(ROOT / p) for p in ("", "analytics", "lineage", "registry_service"))

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: local_probe, path: tests/local_probe}
workload: {n: 3}
workflow:
  - step: start
    tool: {kind: noop, result: "{{ workload.n * 2 }}"}
    next: {arcs: [{step: add}]}
  - step: add
    tool: {kind: python, input: {x: "{{ start }}"}, code: "result = x + 1"}
"""


def _events(execution_id: str, n: int, first: int = 0) -> list[Event]:
    return [Event("step.scheduled" if i % 2 else "task.done", execution_id, {"i": i, "pad": "x" * 40},
                  step=f"s{i}", step_run_id=f"r{i}") for i in range(first, first + n)]  # fmt: skip


def cli(
    *args: str, home: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHONPATH": ENV_PATH, "NOETL_DAGSTER_HOME": str(home), **(env or {})}
    e.pop("NOETL_EVENT_STORE_URL", None)
    return subprocess.run([sys.executable, "-m", "noetl_dagster.commands.main", *args], capture_output=True,
                          text=True, env=e, timeout=timeout)  # fmt: skip


def test_events_read_back_as_appended_and_pyarrow_reads_the_file(tmp_path):
    store = FeatherEventStore(tmp_path)
    evs = _events("x1", 5)
    store.append(evs)
    store.barrier(durable=False)  # written through to the OS
    extra = _events("x1", 3, first=5)
    store.append(extra)
    assert [e.sequence for e in store.read("x1")] == list(range(1, 9))  # the buffered tail too
    store.close()
    again = FeatherEventStore(tmp_path)
    assert again.read("x1") == evs + extra  # every field, as appended
    assert check_chain("x1", again.read_chained("x1")).status == "ok"
    table = pa.ipc.open_stream((tmp_path / "x1" / EVENTS_FILE).read_bytes()).read_all()
    assert table.num_rows == 8 and table.column("sequence").to_pylist() == list(range(1, 9))
    assert str(table.schema.field("created_at").type) == "timestamp[us, tz=UTC]"
    commands = pa.ipc.open_stream((tmp_path / "x1" / "commands.feather").read_bytes()).read_all()
    assert commands.column("step").to_pylist() == ["s1", "s3", "s5", "s7"]
    meta = json.loads((tmp_path / "x1" / "metadata.json").read_text())
    assert meta["execution_id"] == "x1" and meta["events"] == 8


def test_a_batch_cut_by_a_kill_is_dropped_and_the_next_append_continues_the_chain(tmp_path):
    store = FeatherEventStore(tmp_path)
    store.append(_events("x1", 4))
    store.barrier()
    store.append(_events("x1", 4, first=4))
    store.close()
    path = tmp_path / "x1" / EVENTS_FILE
    raw = path.read_bytes()
    path.write_bytes(raw[:-7])  # the last batch half written, as a kill -9 inside write() leaves it
    cut = FeatherEventStore(tmp_path)
    assert [e.sequence for e in cut.read("x1")] == [1, 2, 3, 4]
    cut.append(_events("x1", 2, first=100))  # resume appends after the last whole batch
    cut.close()
    again = FeatherEventStore(tmp_path)
    assert [e.sequence for e in again.read("x1")] == [1, 2, 3, 4, 5, 6]
    assert check_chain("x1", again.read_chained("x1")).status == "ok"


def test_appending_an_event_twice_keeps_one(tmp_path):
    store = FeatherEventStore(tmp_path)
    evs = _events("x1", 3)
    store.append(evs)
    store.close()
    again = FeatherEventStore(tmp_path)
    copies = [Event.from_dict({**e.to_dict(), "sequence": None}) for e in evs]
    again.append(copies)
    assert [c.sequence for c in copies] == [1, 2, 3] and len(again.read("x1")) == 3


def _push_targets(tmp_path, pg_url):
    yield SqliteEventStore(tmp_path / "events.db")
    from noetl_dagster.storage.postgres_events import PostgresEventStore

    yield PostgresEventStore(pg_url)


@pytest.fixture
def pg_url():
    import psycopg

    name = "local_feather_test"
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {name}")
    return f"postgresql://postgres@127.0.0.1:5432/{name}"


def test_push_is_one_append_idempotent_and_keeps_the_chain(tmp_path, pg_url):
    local = FeatherEventStore(tmp_path / "local")
    evs = _events("x1", 6) + _events("x2", 2)
    local.append(evs)
    local.close()
    local = FeatherEventStore(tmp_path / "local")
    for target in _push_targets(tmp_path, pg_url):
        try:
            assert push(local, ["x1", "x2"], target) == 8
            assert push(local, ["x1", "x2"], target) == 8  # twice: nothing added
            assert target.read("x1") == local.read("x1") and len(target.read("x2")) == 2
            assert (
                check_chain("x1", target.read_chained("x1")).head
                == check_chain("x1", local.read_chained("x1")).head
            )
            assert local.metadata("x1")["pushed_to"] == target.url
        finally:
            target.close()


def test_push_of_an_altered_local_log_is_refused_and_writes_nothing(tmp_path):
    local = FeatherEventStore(tmp_path / "local")
    local.append(_events("x1", 3))
    local.close()
    path = tmp_path / "local" / "x1" / EVENTS_FILE
    table = pa.ipc.open_stream(path.read_bytes()).read_all()
    data = table.to_pydict()
    data["body"][1] = data["body"][1].replace(b'"i":1', b'"i":7')
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(pa.table(data, schema=table.schema))
    path.write_bytes(sink.getvalue().to_pybytes())
    target = SqliteEventStore(tmp_path / "events.db")
    # the files keep one hash per batch: the edit shows at the first event that hash covers
    with pytest.raises(Exception, match=r"altered at sequence 1 \(hash mismatch\)"):
        push(FeatherEventStore(tmp_path / "local"), ["x1"], target)
    assert target.read("x1") == []
    with pytest.raises(PushRefused):
        push(FeatherEventStore(tmp_path / "local"), ["nope"], target)


def test_run_defaults_to_local_and_every_reader_sees_the_execution(tmp_path):
    pb = tmp_path / "pb.yaml"
    pb.write_text(PLAYBOOK)
    home = tmp_path / "home"
    r = cli("run", str(pb), "--json", home=home)
    assert r.returncode == 0, r.stderr
    eid = json.loads(r.stdout)["execution_id"]
    assert sorted(p.name for p in (home / "local" / eid).iterdir()) == [
        "commands.feather", "events.feather", "lease", "metadata.json"]  # fmt: skip
    assert not (home / "events.db").exists()  # a local run opens no SQLite
    ev = cli("events", eid, home=home)
    assert ev.returncode == 0 and "workflow.finished" in ev.stdout
    rp = cli("replay", eid, "--json", home=home)
    assert rp.returncode == 0 and json.loads(rp.stdout)["results"] == {"start": 6, "add": 7}
    assert cli("verify", eid, home=home).stdout.startswith(f"OK: execution {eid}: 18 events")
    assert "completed" in cli("explain", eid, home=home).stdout
    assert eid in cli("executions", home=home).stdout
    assert not (home / "events.db").exists()  # reading local executions creates no SQLite (a full disk)
    assert cli("archive", eid, "--to", str(tmp_path / "arch"), "--no-registry", home=home).returncode == 0
    pushed = cli("push", eid, home=home)
    assert pushed.returncode == 0 and "18 events" in pushed.stdout, pushed.stderr
    assert len(SqliteEventStore(home / "events.db").read(eid)) == 18
    assert cli("push", eid, home=home).returncode == 0  # idempotent


def test_run_pushes_at_exit_to_a_configured_store_unless_offline(tmp_path):
    pb = tmp_path / "pb.yaml"
    pb.write_text(PLAYBOOK)
    home = tmp_path / "home"
    url = f"sqlite:///{tmp_path / 'remote.db'}"
    r = cli("run", str(pb), "--json", "--event-store", url, home=home)
    assert r.returncode == 0, r.stderr
    eid = json.loads(r.stdout)["execution_id"]
    assert [e.sequence for e in SqliteEventStore(tmp_path / "remote.db").read(eid)] == list(range(1, 19))
    off = cli("run", str(pb), "--json", "--offline", "--event-store", url, home=home)
    eid2 = json.loads(off.stdout)["execution_id"]
    assert SqliteEventStore(tmp_path / "remote.db").read(eid2) == []
    assert (home / "local" / eid2 / EVENTS_FILE).exists()


def test_push_errors_are_one_line(tmp_path):
    home = tmp_path / "home"
    r = cli("push", "01a1f000-0000-7000-8000-000000000001", home=home)
    assert (
        r.returncode == 2 and r.stderr.startswith("error: no local execution") and "Traceback" not in r.stderr
    )
    pb = tmp_path / "pb.yaml"
    pb.write_text(PLAYBOOK)
    eid = json.loads(cli("run", str(pb), "--json", home=home).stdout)["execution_id"]
    bad = cli("push", eid, "--event-store", "mysql://x", home=home)
    assert (
        bad.returncode == 2 and "unsupported event store URL" in bad.stderr and "Traceback" not in bad.stderr
    )


def test_resume_of_a_running_local_execution_is_refused(tmp_path):
    release = tmp_path / "release"  # `add` waits for it: the run is alive while resume is tried
    code = "import os, time\\nwhile not os.path.exists(r): time.sleep(0.02)\\nresult = x + 1"
    slow = PLAYBOOK.replace('input: {x: "{{ start }}"}, code: "result = x + 1"',
                            f'input: {{x: "{{{{ start }}}}", r: "{release}"}}, code: "{code}"')  # fmt: skip
    assert slow != PLAYBOOK
    pb = tmp_path / "pb.yaml"
    pb.write_text(slow)
    home = tmp_path / "home"
    env = {**os.environ, "PYTHONPATH": ENV_PATH, "NOETL_DAGSTER_HOME": str(home)}
    run = subprocess.Popen([sys.executable, "-m", "noetl_dagster.commands.main", "run", str(pb), "--quiet"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list((home / "local").glob("*/events.feather")):
            time.sleep(0.05)
        eid = next((home / "local").glob("*/events.feather")).parent.name  # written before `add` runs
        r = cli("resume", eid, home=home)
        assert r.returncode == 2 and "another process" in r.stderr, r.stderr
    finally:
        release.touch()
        out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err


def test_only_each_batchs_last_hash_is_kept_and_an_edit_inside_a_batch_still_breaks_the_chain(tmp_path):
    """Issue 46 footprint: a per-event mark was 8 random bytes an event; the files keep each batch's
    last hash in full and an empty one elsewhere, which check_chain verifies at the batch's end."""
    store = FeatherEventStore(tmp_path)
    store.append(_events("x1", 4))
    store.barrier(durable=False)
    store.append(_events("x1", 3, first=4))
    store.close()
    table = pa.ipc.open_stream((tmp_path / "x1" / EVENTS_FILE).read_bytes()).read_all()
    assert [len(h) for h in table.column("hash").to_pylist()] == [0, 0, 0, 32, 0, 0, 32]
    entries = FeatherEventStore(tmp_path).read_chained("x1")
    assert check_chain("x1", entries).status == "ok"
    seq, ev, h = entries[1]
    edited = Event.from_dict({**ev.to_dict(), "data": {"i": 99}})
    report = check_chain("x1", [*entries[:1], (seq, edited, h), *entries[2:]])
    assert report.status == "broken" and report.sequence == 1 and report.reason == "hash mismatch"
    report = check_chain("x1", entries[:6])  # cut after a batch's last full hash: nothing vouches for 5, 6
    assert report.status == "broken" and report.sequence == 5 and report.reason == "hash missing"


def test_event_ids_are_kept_as_16_bytes_and_any_other_id_as_given(tmp_path):
    """Issue 46 footprint: a uuid event id is its 16 bytes in a FixedSizeBinary column (36 bytes of
    text and an offset before); an id that is not lowercase uuid text reads back exactly as given."""
    upper = "01A23729-63BA-758E-B7E1-0BCE0E9BB6A3"
    evs = _events("x1", 4)
    evs[1].event_id, evs[2].event_id = "evt-1", upper
    store = FeatherEventStore(tmp_path)
    store.append(evs)
    store.close()
    table = pa.ipc.open_stream((tmp_path / "x1" / EVENTS_FILE).read_bytes()).read_all()
    assert str(table.schema.field("event_id").type) == "fixed_size_binary[16]"
    raw = table.column("event_id").to_pylist()
    assert raw[0] == bytes.fromhex(evs[0].event_id.replace("-", "")) and raw[1] is None and raw[2] is None
    assert table.column("event_id_text").to_pylist() == [None, "evt-1", upper, None]
    again = FeatherEventStore(tmp_path)
    assert [e.event_id for e in again.read("x1")] == [e.event_id for e in evs]
    again.append([Event.from_dict({**evs[1].to_dict(), "sequence": None})])  # still idempotent by its id
    assert len(again.read("x1")) == 4


def test_a_folder_of_the_earlier_layout_reads_back_and_is_not_appended_to(tmp_path):
    """Files written before the 16-byte ids (utf8 event_id, no event_id_text) still read; a batch of
    the new layout after their schema would be unreadable, so an append is refused, the file unchanged."""
    store = FeatherEventStore(tmp_path)
    evs = _events("x1", 3)
    store.append(evs)
    store.close()
    path = tmp_path / "x1" / EVENTS_FILE
    table = pa.ipc.open_stream(path.read_bytes()).read_all()
    ids = pa.array([e.event_id for e in evs], pa.utf8())
    earlier = table.drop_columns(["event_id", "event_id_text"]).add_column(1, "event_id", ids)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, earlier.schema) as w:
        w.write_table(earlier)
    path.write_bytes(before := sink.getvalue().to_pybytes())
    again = FeatherEventStore(tmp_path)
    assert again.read("x1") == evs
    with pytest.raises(ValueError, match="earlier column layout"):
        again.append(_events("x1", 1, first=3))
    assert path.read_bytes() == before
    again._execs.clear()  # the refused row stays buffered; the test drops it rather than flush at exit
