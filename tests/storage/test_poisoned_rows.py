"""Issue 14.5: one execution cannot poison the store. A workload holding a lone
surrogate is stored safely (read back with U+FFFD); a corrupt row written into
the table directly is skipped and reported by every reader (read, tail,
iter_all), so events of the execution, replay of every other one and the lineage
export of every execution keep working (the execution's own replay is refused: rows written around
the store break its hash chain, issue 41). SQLite and Postgres, real databases."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid

import psycopg
import pytest

from noetl_dagster.engine.chain import ChainBroken
from noetl_dagster.engine.replay import replay
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: poison_probe
  path: tests/poison_probe
workload:
  x: "a"
workflow:
  - step: start
    tool:
      kind: python
      input:
        x: "{{ workload.x }}"
      code: |
        result = {"echo": x}
"""

PG = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'events.db'}"
        return
    schema = "poison_" + uuid.uuid4().hex[:8]
    yield f"{PG}?schema={schema}"  # left in place: the suite replays every execution after the test


def _insert_corrupt(url: str, tmp_path, execution_id: str) -> None:
    if url.startswith("sqlite"):
        with sqlite3.connect(tmp_path / "events.db") as c:
            c.execute(
                "INSERT INTO noetl_event (event_id, execution_id, sequence, name, ts, body) VALUES (?,?,?,?,?,?)",
                ("bad-1", execution_id, 1000, "x", "t", '{"name": '),
            )
            c.execute(
                "INSERT INTO noetl_event (event_id, execution_id, sequence, name, ts, body)"
                " VALUES (?,?,?,?,?,CAST(x'ff7b22' AS TEXT))",
                ("bad-2", execution_id, 1001, "x", "t"),
            )
            c.execute(
                "INSERT INTO noetl_event (event_id, execution_id, sequence, name, ts, body) VALUES (?,?,?,?,?,?)",
                # not an object: a body without the envelope fields is a valid row now (the columns fill
                # them in, issue 19), so the third bad row is one no reader can make an event of
                ("bad-3", execution_id, 1002, "x", "t", '"\\udcff"'),
            )
        return
    schema = url.split("schema=")[1]
    with psycopg.connect(PG, autocommit=True) as c:
        for i, body in enumerate(['{"name": 1}', '"\\udcff"', '{"data": "\\udcff"}']):
            c.execute(
                f'INSERT INTO "{schema}".noetl_event (event_id, execution_id, sequence, name, ts, body)'
                " VALUES (%s,%s,%s,%s,%s,%s::json)",
                (f"bad-{i}", execution_id, 1000 + i, "x", "t", body),
            )


def _cli(*args: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NOETL_DAGSTER_HOME": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "noetl_dagster.commands.main", *args],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_surrogate_workload_and_corrupt_rows_do_not_poison_the_store(tmp_path, store_url):
    pb = tmp_path / "pb.yaml"
    pb.write_text(PLAYBOOK)
    # the surrogate run in its own process (exit 0, as reported): the live state keeps "\udcff" while the
    # store gives back U+FFFD, so the suite's live-vs-replay check must not see it
    code = (
        "import sys; from noetl_dagster.runners.local import run_playbook;"
        "r = run_playbook(sys.argv[1], {'x': '\\udcff'}, event_store=sys.argv[2], data_dir=sys.argv[3]);"
        "print(r.execution_id, r.status)"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(pb), store_url, str(tmp_path)], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr[-2000:]
    bad_id, bad_status = p.stdout.split()
    good = run_playbook(pb, {"x": "fine"}, event_store=store_url, data_dir=tmp_path)
    assert bad_status == good.status == "completed"

    class bad:  # noqa: N801
        execution_id = bad_id

    _insert_corrupt(store_url, tmp_path, bad.execution_id)

    store = open_event_store(store_url, data_dir=tmp_path)
    try:
        events = store.read(bad.execution_id)
        assert events[-1].name == "playbook.processed"
        text = json.dumps([e.to_dict() for e in events], ensure_ascii=False)
        text.encode("utf-8")  # nothing undecodable comes back
        assert "\ufffd" in text
        assert len(store.skipped) >= 2, "bad rows are reported"
        all_ids = {s.event.execution_id for s in store.iter_all(batch=1)}
        assert {bad.execution_id, good.execution_id} <= all_ids, "tail goes on past bad rows"
        # rows written around the store break the execution's hash chain (issue 41): its replay is
        # refused at the first of them, every other reader and execution goes on
        with pytest.raises(ChainBroken) as refused:
            replay(store, bad.execution_id)
        assert refused.value.sequence == 1000
        assert replay(store, good.execution_id).status == "completed"
    finally:
        store.close()

    common = ["--event-store", store_url, "--data-dir", str(tmp_path)]
    r = _cli("events", bad.execution_id, "--json", *common, tmp_path=tmp_path)
    assert r.returncode == 0, (r.stdout[-500:], r.stderr[-2000:])
    r = _cli("replay", bad.execution_id, "--json", *common, tmp_path=tmp_path)
    assert r.returncode == 1 and "altered at sequence 1000" in r.stderr, r.stderr[-2000:]
    assert [x for x in r.stderr.splitlines() if x.startswith("error:")] == r.stderr.splitlines()[-1:]
    r = _cli("replay", good.execution_id, "--json", *common, tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = tmp_path / "lineage.jsonl"
    r = _cli(
        "lineage",
        "export",
        "--events",
        store_url,
        "--data-dir",
        str(tmp_path),
        "--out",
        str(out),
        tmp_path=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    runs = {json.loads(line)["run"]["runId"] for line in out.read_text().splitlines()}
    assert len(runs) >= 2
