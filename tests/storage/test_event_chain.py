"""Issue 41 part 3: a tamper-evident event log. Each event chains the previous one's hash; `verify`,
`replay`, `resume` and archive restore refuse an altered log naming its first bad event. The
attacks are real: SQLite with its append-only triggers dropped, Postgres edited as superuser with
its triggers disabled, archive files rewritten with fresh checksums."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from urllib.parse import unquote

import psycopg
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from noetl_dagster.engine.chain import ChainBroken, check_chain
from noetl_dagster.engine.events import Event
from noetl_dagster.engine.replay import replay, verify_chain
from noetl_dagster.engine.state import fold
from noetl_dagster.runners.local import resume_execution
from noetl_dagster.storage.archive import archive_execution, read_archive_events
from noetl_dagster.storage.archive_signing import SignatureInvalid
from noetl_dagster.storage.events import SQLITE_MIGRATIONS, SqliteEventStore
from noetl_dagster.storage.postgres_events import PostgresEventStore

PG = "postgresql://postgres@127.0.0.1:5432/test"

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: chain_probe
  path: tests/chain_probe
workflow:
  - step: start
    tool:
      kind: python
      code: |
        result = {"amount": 4141}
    next:
      arcs:
        - step: end
  - step: end
    tool:
      kind: noop
"""


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NOETL_DAGSTER_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "noetl_dagster.commands.main", *args],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _error_line(p: subprocess.CompletedProcess) -> str:
    errors = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and p.stderr.splitlines()[-1] == errors[0], p.stderr
    return errors[0]


def _run(tmp_path, home: Path, *store: str) -> str:
    """A run in its own process: the suite's replay-after-each-test (conftest) never sees the edit."""
    pb = tmp_path / "pb.yaml"
    pb.write_text(PLAYBOOK)
    # --durable: these tests edit the stored log itself (the local files: tests/storage/test_local_mode.py)
    p = _cli("run", str(pb), "--json", "--durable", *store, home=home)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["status"] == "completed"
    return out["execution_id"]


@pytest.fixture
def sqlite_run(tmp_path):
    home = tmp_path / "home"
    return _run(tmp_path, home), home, home / "events.db"


def _result_seq(c, eid: str) -> int:
    return c.execute(
        "SELECT MIN(sequence) FROM noetl_event WHERE execution_id = ? AND body LIKE '%4141%'", (eid,)
    ).fetchone()[0]


def test_sqlite_edit_with_triggers_dropped_is_refused(sqlite_run):
    """The issue's attack: drop the triggers, change a result, replay. It showed the edited value, exit 0."""
    eid, home, db = sqlite_run
    ok = _cli("verify", eid, home=home)
    assert ok.returncode == 0 and ok.stdout.startswith(f"OK: execution {eid}:") and " head " in ok.stdout
    with sqlite3.connect(db) as c:
        seq = _result_seq(c, eid)
        c.execute("DROP TRIGGER noetl_event_no_update")
        c.execute(
            "UPDATE noetl_event SET body = replace(body, '4141', '9999') WHERE execution_id = ?", (eid,)
        )
    for cmd in (["replay", eid], ["verify", eid], ["resume", eid]):
        p = _cli(*cmd, home=home)
        assert p.returncode == 1, (cmd, p.stdout, p.stderr)
        assert f"altered at sequence {seq} (hash mismatch)" in _error_line(p), cmd
        assert "9999" not in p.stdout
    p = _cli("verify", eid, "--json", home=home)
    assert p.returncode == 1 and json.loads(p.stdout)["sequence"] == seq
    store = SqliteEventStore(db)
    with pytest.raises(ChainBroken) as e:
        resume_execution(eid, event_store=store, data_dir=home)
    assert e.value.sequence == seq


def test_sqlite_deleted_and_reordered_events_are_refused(sqlite_run, tmp_path):
    eid, home, db = sqlite_run
    copy = tmp_path / "copy.db"
    with sqlite3.connect(db) as c, sqlite3.connect(copy) as out:
        c.backup(out)
    with sqlite3.connect(db) as c:  # delete event 4: event 5 is the first whose predecessor is gone
        c.execute("DROP TRIGGER noetl_event_no_delete")
        c.execute("DELETE FROM noetl_event WHERE execution_id = ? AND sequence = 4", (eid,))
    with pytest.raises(ChainBroken, match="altered at sequence 5 .sequence 4 is missing"):
        replay(SqliteEventStore(db), eid)
    with sqlite3.connect(copy) as c:  # swap events 3 and 4 (their sequence numbers)
        c.execute("DROP TRIGGER noetl_event_no_update")
        c.execute("UPDATE noetl_event SET sequence = -1 WHERE execution_id = ? AND sequence = 3", (eid,))
        c.execute("UPDATE noetl_event SET sequence = 3 WHERE execution_id = ? AND sequence = 4", (eid,))
        c.execute("UPDATE noetl_event SET sequence = 4 WHERE execution_id = ? AND sequence = -1", (eid,))
    with pytest.raises(ChainBroken, match="altered at sequence 3 "):
        replay(SqliteEventStore(copy), eid)


def _segment_store(tmp_path, n: int = 40) -> tuple[SqliteEventStore, str]:
    store = SqliteEventStore(tmp_path / "seg.db")
    store.segment_min = 8
    eid = "seg-" + uuid.uuid4().hex[:8]
    store.append([Event(name="playbook.execution.requested", execution_id=eid, data={"playbook": "p"})])
    store.append([Event(name="step.started", execution_id=eid, step="s", data={"i": i}) for i in range(n)])
    store.append([Event(name="step.started", execution_id=eid, step="after")])
    return store, eid


def test_segment_edit_names_the_event(tmp_path):
    """A loop's events in one compressed segment row: rewriting the segment (recompressed, valid) is
    refused at the edited event, not only at the segment."""
    store, eid = _segment_store(tmp_path)
    assert verify_chain(store, eid)[0].status == "ok"
    path = store.path
    store.close()
    with sqlite3.connect(path) as c:
        body = c.execute("SELECT body FROM noetl_event_segment WHERE execution_id = ?", (eid,)).fetchone()[0]
        doc = json.loads(zstandard.ZstdDecompressor().decompress(body))
        doc["c"]["data"][17] = {"i": 1700}
        c.execute("DROP TRIGGER noetl_event_segment_no_update")
        c.execute("UPDATE noetl_event_segment SET body = ? WHERE execution_id = ?",
                  (zstandard.ZstdCompressor().compress(json.dumps(doc).encode()), eid))  # fmt: skip
    report, _ = verify_chain(SqliteEventStore(path), eid)
    assert (report.status, report.sequence, report.reason) == ("broken", 2 + 17, "hash mismatch")


def test_existing_database_migrates_and_old_executions_are_unchained(tmp_path):
    """A file written before the chain (schema 4): opening it adds the columns; its executions verify
    as unchained (not broken) and replay; appending to one chains it from there on."""
    db = tmp_path / "old.db"
    with sqlite3.connect(db, isolation_level=None) as c:
        c.execute("CREATE TABLE noetl_schema_version (version INTEGER NOT NULL)")
        for v, stmts in enumerate(SQLITE_MIGRATIONS[:4], start=1):
            for s in stmts:
                c.execute(s)
            c.execute("INSERT INTO noetl_schema_version VALUES (?)", (v,))
        for seq, name in enumerate(["playbook.execution.requested", "workflow.started"], start=1):
            ev = Event(name=name, execution_id="old", data={"playbook": "p"}, sequence=seq)
            c.execute(
                "INSERT INTO noetl_event (gid, event_id, execution_id, sequence, name, ts, body) VALUES (?,?,?,?,?,?,?)",
                (seq, ev.event_id, "old", seq, name, ev.timestamp, json.dumps(ev.to_stored())),
            )
    store = SqliteEventStore(db)
    report, events = verify_chain(store, "old")
    assert (report.status, report.events) == ("unchained", 2)
    assert replay(store, "old").status == "running"
    p = _cli("verify", "old", "--event-store", str(db), home=tmp_path)
    assert p.returncode == 0 and p.stdout.startswith("unchained:"), p.stderr
    store.append([Event(name="step.started", execution_id="old", step="a")])
    report, _ = verify_chain(SqliteEventStore(db), "old")
    assert (report.status, report.chained_from, report.events) == ("ok", 3, 3)


@pytest.fixture
def pg_url():
    schema = "chain_" + uuid.uuid4().hex[:8]
    yield f"{PG}?schema={schema}"
    with psycopg.connect(PG, autocommit=True) as c:
        c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_postgres_existing_schema_migrates_and_old_executions_are_unchained(pg_url):
    """A schema written before the chain (version 2): opening it adds the columns; its execution is
    unchained (and replays); the next append (the one-statement path) chains it from there on."""
    from psycopg import sql

    from noetl_dagster.storage.postgres_events import MIGRATIONS

    schema = pg_url.split("schema=")[1]
    with psycopg.connect(PG, autocommit=True) as c:
        c.execute(f'CREATE SCHEMA "{schema}"')
        c.execute(f'CREATE TABLE "{schema}".noetl_schema_version (version INTEGER PRIMARY KEY,'
                  " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")  # fmt: skip
        for v, stmts in enumerate(MIGRATIONS[:2], start=1):
            for stmt in stmts:
                c.execute(sql.SQL(stmt).format(schema=sql.Identifier(schema)))
            c.execute(f'INSERT INTO "{schema}".noetl_schema_version (version) VALUES (%s)', (v,))
        for seq, name in enumerate(["playbook.execution.requested", "workflow.started"], start=1):
            ev = Event(name=name, execution_id="old", data={"playbook": "p"}, sequence=seq)
            c.execute(f'INSERT INTO "{schema}".noetl_event (event_id, execution_id, sequence, name, ts, body)'
                      " VALUES (%s, 'old', %s, %s, %s, %s::json)",
                      (ev.event_id, seq, name, ev.timestamp, json.dumps(ev.to_stored())))  # fmt: skip
        c.execute(
            f"INSERT INTO \"{schema}\".noetl_execution (execution_id, status, last_sequence) VALUES ('old', 'running', 2)"
        )
    store = PostgresEventStore(pg_url)
    try:
        report, _ = verify_chain(store, "old")
        assert (report.status, report.events) == ("unchained", 2)
        assert replay(store, "old").status == "running"
        store.append([Event(name="step.started", execution_id="old", step="a")])
        store.append([Event(name="step.started", execution_id="old", step="b")])
        report, _ = verify_chain(store, "old")
        assert (report.status, report.chained_from, report.events) == ("ok", 3, 4)
    finally:
        store.close()


def test_postgres_superuser_update_is_refused(tmp_path, pg_url):
    eid = _run(tmp_path, tmp_path, "--event-store", pg_url)
    schema = pg_url.split("schema=")[1]
    with psycopg.connect(PG, autocommit=True) as c:
        seq = c.execute(f'SELECT MIN(sequence) FROM "{schema}".noetl_event WHERE execution_id = %s'
                        " AND body::text LIKE '%%4141%%'", (eid,)).fetchone()[0]  # fmt: skip
        c.execute("SET session_replication_role = replica")  # superuser: the append-only triggers do not fire
        c.execute(f'UPDATE "{schema}".noetl_event SET body = replace(body::text, \'4141\', \'9999\')::json'
                  " WHERE execution_id = %s", (eid,))  # fmt: skip
    p = _cli("replay", eid, "--event-store", pg_url, home=tmp_path)
    assert p.returncode == 1 and f"altered at sequence {seq} (hash mismatch)" in _error_line(p)
    p = _cli("verify", eid, "--event-store", pg_url, home=tmp_path)
    assert p.returncode == 1 and f"altered at sequence {seq}" in _error_line(p)


def test_postgres_chain_holds_across_writers(pg_url):
    """Two stores (as two processes) and their threads append to one execution: the chain is
    computed where the sequence is decided, so it verifies whatever the interleaving."""
    a, b = PostgresEventStore(pg_url), PostgresEventStore(pg_url, group_commit=False)
    eid = "shared-" + uuid.uuid4().hex[:8]
    try:
        a.append([Event(name="playbook.execution.requested", execution_id=eid, data={"playbook": "p"})])

        def write(store, k):
            for i in range(15):
                store.append([Event(name="step.started", execution_id=eid, step=f"{k}-{i}", data={"i": i})])

        threads = [threading.Thread(target=write, args=(s, k)) for k, s in enumerate([a, a, b, b])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        report, events = verify_chain(a, eid)
        assert (report.status, report.events, report.chained_from) == ("ok", 61, 1)
        assert [e.sequence for e in events] == list(range(1, 62))
    finally:
        a.close()
        b.close()


# -- archives ---------------------------------------------------------------------------------------


def _rewrite_segment(root: Path, edit) -> None:
    """Change the events of segment 1 and update every checksum (sidecar, manifest): only the
    chain (and the signature) can tell."""
    seg = root / "events/segment-000001.jsonl.zst"
    lines = zstandard.ZstdDecompressor().decompress(seg.read_bytes()).decode().splitlines()
    blob = zstandard.ZstdCompressor().compress(("\n".join(edit(lines)) + "\n").encode())
    seg.write_bytes(blob)
    h = hashlib.sha256(blob).hexdigest()
    (root / "events/segment-000001.sha256").write_text(f"{h}  segment-000001.jsonl.zst\n")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"]["events/segment-000001.jsonl.zst"] = "sha256:" + h
    manifest["segments"][0]["sha256"] = "sha256:" + h
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))


def _archive(sqlite_run, tmp_path) -> tuple[str, Path, str]:
    eid, home, db = sqlite_run
    m = archive_execution(eid, SqliteEventStore(db), str(tmp_path / "archive"))
    assert m["chain"][eid]["status"] == "ok"
    return m["uri"], Path(unquote(m["uri"].removeprefix("file://"))), eid


def test_edited_archive_segment_is_refused(sqlite_run, tmp_path):
    uri, root, eid = _archive(sqlite_run, tmp_path)
    head = json.loads((root / "manifest.json").read_text())["chain"][eid]["head"]
    ok = _cli("verify", "--archive", uri, home=tmp_path)
    assert ok.returncode == 0 and head in ok.stdout, ok.stderr
    with sqlite3.connect(sqlite_run[2]) as c:
        seq = _result_seq(c, eid)
    _rewrite_segment(root, lambda lines: [x.replace("4141", "9999") for x in lines])
    for cmd in (["replay", "--from-archive", uri], ["verify", "--archive", uri]):
        p = _cli(*cmd, home=tmp_path)
        assert p.returncode == 1 and f"altered at sequence {seq} (hash mismatch)" in _error_line(p), cmd


def test_archive_rewritten_whole_is_caught_by_the_manifest_head(sqlite_run, tmp_path):
    """An attacker recomputing every hash of the edited archive still differs from the manifest's head;
    one who also edits the head is caught by the signature (next test)."""
    uri, root, eid = _archive(sqlite_run, tmp_path)

    def rechain(lines):
        from noetl_dagster.engine.chain import GENESIS, event_hash

        prev, out = GENESIS, []
        for x in lines:
            d = json.loads(x.replace("4141", "9999"))
            prev = event_hash(prev, Event.from_dict(d))
            out.append(json.dumps({**d, "hash": prev.hex()}))
        return out

    _rewrite_segment(root, rechain)
    with pytest.raises(ChainBroken, match="head differs"):
        read_archive_events(uri)
    manifest = json.loads((root / "manifest.json").read_text())  # edit the head too: unsigned, it passes
    last = json.loads(rechain(zstandard.ZstdDecompressor().decompress(
        (root / "events/segment-000001.jsonl.zst").read_bytes()).decode().splitlines())[-1])  # fmt: skip
    manifest["chain"][eid]["head"] = last["hash"]
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    assert read_archive_events(uri)[1]


def _ed25519_pair(tmp_path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    priv, pub = tmp_path / "archive.key", tmp_path / "archive.pub"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))  # fmt: skip
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    return priv, pub


@pytest.mark.parametrize("kind", ["ed25519", "hmac"])
def test_signed_manifest(sqlite_run, tmp_path, monkeypatch, kind):
    """A signed bundle verifies; an edited manifest (a head changed), a bad or missing signature is
    refused once a verify key is set."""
    if kind == "ed25519":
        priv, pub = _ed25519_pair(tmp_path)
        sign_key, verify_key = str(priv), str(pub)
    else:
        sign_key = verify_key = "hmac:" + uuid.uuid4().hex
    monkeypatch.setenv("NOETL_ARCHIVE_SIGNING_KEY", sign_key)
    uri, root, eid = _archive(sqlite_run, tmp_path)
    assert (root / "signatures/manifest.sig").is_file()
    monkeypatch.setenv("NOETL_ARCHIVE_VERIFY_KEY", verify_key)
    env_home = tmp_path  # the CLI inherits the keys from this environment
    p = _cli("verify", "--archive", uri, "--json", home=env_home)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["signature"] == kind.replace("hmac", "hmac-sha256")

    manifest = (root / "manifest.json").read_bytes()
    edited = json.loads(manifest)
    edited["chain"][eid]["head"] = "00" * 32
    (root / "manifest.json").write_text(json.dumps(edited, indent=2, sort_keys=True))
    with pytest.raises(SignatureInvalid, match="does not verify"):
        read_archive_events(uri)
    p = _cli("replay", "--from-archive", uri, home=env_home)
    assert p.returncode == 1 and "signature does not verify" in _error_line(p)

    (root / "manifest.json").write_bytes(manifest)
    sig = json.loads((root / "signatures/manifest.sig").read_text())
    sig["signature"] = (
        "A" + sig["signature"][1:] if sig["signature"][0] != "A" else "B" + sig["signature"][1:]
    )
    (root / "signatures/manifest.sig").write_text(json.dumps(sig))
    with pytest.raises(SignatureInvalid):
        read_archive_events(uri)
    (root / "signatures/manifest.sig").unlink()
    with pytest.raises(SignatureInvalid, match="not signed"):
        read_archive_events(uri)
    monkeypatch.delenv("NOETL_ARCHIVE_VERIFY_KEY")
    assert read_archive_events(uri)[1]  # no verify key: the chain and checksums still hold


def test_a_broken_log_is_not_archived(sqlite_run, tmp_path):
    eid, home, db = sqlite_run
    with sqlite3.connect(db) as c:
        c.execute("DROP TRIGGER noetl_event_no_update")
        c.execute(
            "UPDATE noetl_event SET body = replace(body, '4141', '9999') WHERE execution_id = ?", (eid,)
        )
    p = _cli("archive", eid, "--to", str(tmp_path / "a"), "--no-registry", home=home)
    assert p.returncode == 1 and "altered at sequence" in _error_line(p)
    assert check_chain(eid, SqliteEventStore(db).read_chained(eid)).status == "broken"


# -- the property ---------------------------------------------------------------------------------

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_NAMES = ["step.started", "task.done", "step.done", "next.evaluated", "loop.iteration.done"]


@st.composite
def _execution_and_edit(draw):
    n = draw(st.integers(2, 25))
    events = [(draw(st.sampled_from(_NAMES)), draw(st.dictionaries(st.text(max_size=5), _JSON, max_size=3)))
              for _ in range(n)]  # fmt: skip
    kind = draw(st.sampled_from(["change", "delete", "insert", "swap"]))
    k = draw(st.integers(1, n + 1 if kind == "insert" else n - 1 if kind in ("delete", "swap") else n))
    return events, kind, k, draw(st.sampled_from([None, b"\x00" * 32, b"\x01" * 32]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_execution_and_edit(), batch=st.integers(1, 7))
def test_property_verify_names_the_first_altered_event(tmp_path_factory, case, batch):
    """Random executions, appended in random batches; untouched, the log verifies and replays to the
    state of what was appended; after one random edit made in the file (change, delete, insert,
    swap), verify names exactly the first affected sequence."""
    (spec, kind, k, forged) = case
    db = tmp_path_factory.mktemp("prop") / "events.db"
    store = SqliteEventStore(db)
    store.segment_min = None  # one row per event: the attacker's unit of edit
    eid = "prop-" + uuid.uuid4().hex[:8]
    appended = [Event(name="playbook.execution.requested", execution_id=eid, data={"playbook": "p"})]
    appended += [Event(name=name, execution_id=eid, step="s", data=data) for name, data in spec]
    for i in range(0, len(appended), batch):
        store.append(appended[i : i + batch])
    report, events = verify_chain(store, eid)
    assert (report.status, report.events) == ("ok", len(appended))
    live = fold([Event.from_dict(json.loads(json.dumps(e.to_dict(), default=str))) for e in appended])
    assert replay(store, eid).snapshot() == live.snapshot()
    store.close()
    n = len(appended)
    k = min(
        k + 1, n + 1 if kind == "insert" else n - 1 if kind in ("delete", "swap") else n
    )  # seq 1 is the request
    with sqlite3.connect(db, isolation_level=None) as c:
        c.execute("DROP TRIGGER noetl_event_no_update")
        c.execute("DROP TRIGGER noetl_event_no_delete")
        if kind == "change":
            body = json.loads(c.execute("SELECT body FROM noetl_event WHERE execution_id = ? AND sequence = ?",
                                        (eid, k)).fetchone()[0])  # fmt: skip
            body["data"] = {**body.get("data", {}), "edited": True}
            c.execute("UPDATE noetl_event SET body = ? WHERE execution_id = ? AND sequence = ?",
                      (json.dumps(body), eid, k))  # fmt: skip
            want = k
        elif kind == "delete":
            c.execute("DELETE FROM noetl_event WHERE execution_id = ? AND sequence = ?", (eid, k))
            want = k + 1
        elif kind == "insert":
            c.execute(
                "UPDATE noetl_event SET sequence = -sequence WHERE execution_id = ? AND sequence >= ?",
                (eid, k),
            )
            c.execute(
                "UPDATE noetl_event SET sequence = 1 - sequence WHERE execution_id = ? AND sequence < 0",
                (eid,),
            )
            c.execute("INSERT INTO noetl_event (event_id, execution_id, sequence, name, ts, body, hash)"
                      " VALUES (?,?,?,?,?,?,?)",
                      (uuid.uuid4().hex, eid, k, "step.started", "2026-01-01T00:00:00+00:00", "{}", forged))  # fmt: skip
            want = k
        else:
            c.execute(
                "UPDATE noetl_event SET sequence = -1 WHERE execution_id = ? AND sequence = ?", (eid, k)
            )
            c.execute(
                "UPDATE noetl_event SET sequence = ? WHERE execution_id = ? AND sequence = ?", (k, eid, k + 1)
            )
            c.execute(
                "UPDATE noetl_event SET sequence = ? WHERE execution_id = ? AND sequence = -1", (k + 1, eid)
            )
            want = k
    report, _ = verify_chain(SqliteEventStore(db), eid)
    assert (report.status, report.sequence) == ("broken", want), (kind, k, report)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_execution_and_edit(), batch=st.integers(1, 12))
def test_property_segments_name_the_first_altered_event(tmp_path_factory, case, batch):
    """The same edits on a log stored partly in segments (an 8-byte mark per event, the full hash at
    a segment's end): the edit is made on what the store reads back, position by position, as a
    rewrite of the segment's columns would present it."""
    (spec, kind, k, forged) = case
    store = SqliteEventStore(tmp_path_factory.mktemp("seg") / "events.db")
    store.segment_min = 4
    eid = "segprop-" + uuid.uuid4().hex[:8]
    appended = [Event(name="playbook.execution.requested", execution_id=eid, data={"playbook": "p"})]
    appended += [Event(name=name, execution_id=eid, step="s", data=data) for name, data in spec]
    for i in range(0, len(appended), batch):
        store.append(appended[i : i + batch])
    entries = store.read_chained(eid)
    store.close()
    assert check_chain(eid, entries).status == "ok"
    n = len(entries)
    k = min(k + 1, n + 1 if kind == "insert" else n - 1 if kind in ("delete", "swap") else n)

    def at(pos: int, entry):  # an entry as the store would number it at position ``pos``
        return (pos, dataclasses.replace(entry[1], sequence=pos), entry[2])

    if kind == "change":
        seq, ev, h = entries[k - 1]
        entries[k - 1] = (seq, dataclasses.replace(ev, data={**ev.data, "edited": True}), h)
        want = k
    elif kind == "delete":
        del entries[k - 1]
        want = k + 1
    elif kind == "insert":
        extra = (k, Event(name="step.started", execution_id=eid, sequence=k), forged and forged[:8])
        entries = entries[: k - 1] + [extra] + [at(e[0] + 1, e) for e in entries[k - 1 :]]
        want = k
    else:
        entries[k - 1], entries[k] = at(k, entries[k]), at(k + 1, entries[k - 1])
        want = k
    report = check_chain(eid, entries)
    assert (report.status, report.sequence) == ("broken", want), (kind, k, report)


def test_the_bytes_path_hashes_what_the_text_path_hashes():
    """Stores hash ``canonical_bytes`` (the encoder's bytes); the chain is defined on ``canonical_text``:
    the same hash for plain bodies and for the encoder's fallbacks (a lone surrogate, an int past 64 bits)."""
    from noetl_dagster.engine.chain import GENESIS, canonical_bytes, canonical_text, event_link, link

    bodies = [{}, {"result": {"a": [1, 2.5, None, True]}, "ünï": "cödé ✓"}, {"s": "lone \ud800 surrogate"},
              {"big": 2**70, "neg": -(2**65)}, {1: "a non-string key"}]  # fmt: skip
    for i, data in enumerate(bodies, start=1):
        ev = Event("step.done", "x1", data, step="a", step_run_id="r1", sequence=i)
        assert canonical_bytes(ev) == canonical_text(ev).encode("utf-8", "surrogatepass")
        assert event_link(GENESIS, i, ev) == link(GENESIS, i, canonical_text(ev))
