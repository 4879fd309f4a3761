"""Event segments (issue 19): a big batch of one execution's events is one compressed row, and
every reader (read, tail, tail_last, replay) sees exactly what a one-row-per-event store holds."""

from __future__ import annotations

import sqlite3

import pytest

from noetl_dagster.engine import events as E
from noetl_dagster.engine.events import Event
from noetl_dagster.engine.replay import diff_snapshots, replay
from noetl_dagster.runners.local import FINISHED_HOOKS, run_playbook
from noetl_dagster.storage.events import SQLITE_MIGRATIONS, SqliteEventStore


def _events(eid: str, n: int, start: int = 0) -> list[Event]:
    out = []
    for i in range(start, start + n):
        data = {"result": {"i": i, "big": 2**70 + i, "s": "x\udcff" if i % 7 == 0 else "é"}} if i % 3 else {}
        out.append(Event(E.LOOP_ITERATION_DONE if i % 2 else E.TASK_DONE, eid, data, step="s", loop_id="L",
                         iteration=i, status="error" if i % 5 == 0 else "success", tenant_id="t"))  # fmt: skip
    return out


def _copy(evs: list[Event]) -> list[Event]:
    return [Event.from_dict(e.to_dict()) for e in evs]


def _plain(e: Event) -> dict:
    d = e.to_dict()
    if isinstance(d["data"].get("result"), dict):  # a lone surrogate reads back as U+FFFD
        d["data"]["result"]["s"] = d["data"]["result"]["s"].replace("\udcff", "\ufffd")
    return d


def _stores(tmp_path, batches):
    """The same batches into a segmenting store (segment_min 50) and a rows-only store."""
    seg, rows = SqliteEventStore(tmp_path / "seg.db"), SqliteEventStore(tmp_path / "rows.db")
    seg.segment_min, rows.segment_min = 50, None
    for b in batches:
        seg.append(_copy(b))
        rows.append(_copy(b))
    return seg, rows


def _segments(store: SqliteEventStore) -> int:
    return store._conn.execute("SELECT COUNT(*) FROM noetl_event_segment").fetchone()[0]


def test_readers_see_the_same_events_as_a_rows_only_store(tmp_path):
    a, b = _events("exec-a", 400), _events("exec-b", 120)
    batches = [a[:3], a[3:203], b[:5], a[203:260], b[5:120], a[260:263], a[263:400]]
    seg, rows = _stores(tmp_path, batches)
    try:
        assert _segments(seg) == 4 and _segments(rows) == 0
        for eid in ("exec-a", "exec-b"):
            got, want = [_plain(e) for e in seg.read(eid)], [_plain(e) for e in rows.read(eid)]
            assert got == want and [e["sequence"] for e in got] == list(range(1, len(got) + 1))
            for after in (0, 1, 3, 100, 202, 203, 399, 400):
                assert [_plain(e) for e in seg.read(eid, after)] == [_plain(e) for e in rows.read(eid, after)]
        assert [_plain(e) | {"sequence": None} for e in seg.read("exec-a")] == [_plain(e) for e in a]
        assert seg.tail_last() == rows.tail_last() == 520
        for after in (0, 2, 3, 150, 203, 208, 300, 519, 520):
            for limit in (1, 7, 100, 1000):
                got = [(s.gid, _plain(s.event)) for s in seg.tail(after, limit)]
                assert got == [(s.gid, _plain(s.event)) for s in rows.tail(after, limit)], (after, limit)
    finally:
        seg.close()
        rows.close()


def test_a_segment_is_much_smaller_than_its_rows(tmp_path):
    seg, rows = _stores(tmp_path, [_events("x", 2000)])
    seg.close()
    rows.close()
    # 4.4x here; it was over 5x while row bodies repeated their envelope columns (before issue 19's slim rows)
    assert (tmp_path / "seg.db").stat().st_size * 4 < (tmp_path / "rows.db").stat().st_size


def test_resent_events_are_not_duplicated(tmp_path):
    store = SqliteEventStore(tmp_path / "e.db")
    store.segment_min = 50
    try:
        evs = _events("x", 300)
        store.append(_copy(evs[:100]))  # a segment
        store.append(_copy(evs[100:110]))  # rows
        again = _copy(evs[:120])  # both re-sent, plus ten new
        store.append(again)
        assert [e.sequence for e in again] == list(range(1, 121))
        small = _copy(evs[:3])  # re-sent segment events in a small batch (the rows path)
        store.append(small)
        assert [e.sequence for e in small] == [1, 2, 3]
        store.append(_copy(evs[120:]))
        got = store.read("x")
        assert [e.event_id for e in got] == [e.event_id for e in evs]
        assert [e.sequence for e in got] == list(range(1, 301))
        assert [s.gid for s in store.tail(0, 10_000)] == list(range(1, 301))
        assert store.executions()[0].events == 300
    finally:
        store.close()


def test_segments_are_append_only(tmp_path):
    store = SqliteEventStore(tmp_path / "e.db")
    store.segment_min = 50
    store.append(_events("x", 60))
    store.close()
    c = sqlite3.connect(tmp_path / "e.db")
    try:
        for stmt in ("UPDATE noetl_event_segment SET seq_first = 9", "DELETE FROM noetl_event_segment"):
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                c.execute(stmt)
    finally:
        c.close()


def test_a_store_written_before_segments_is_migrated(tmp_path):
    """A version-2 store (full bodies, no key table) opens, reads, dedups its old events, and
    continues gids and sequences after them."""
    import json

    db = tmp_path / "old.db"
    c = sqlite3.connect(db, isolation_level=None)
    c.execute("CREATE TABLE noetl_schema_version (version INTEGER NOT NULL)")
    for v, stmts in enumerate(SQLITE_MIGRATIONS[:2], start=1):
        for s in stmts:
            c.execute(s)
        c.execute("INSERT INTO noetl_schema_version VALUES (?)", (v,))
    old = _events("x", 5)
    for i, e in enumerate(old, start=1):
        e.sequence = i
        c.execute("INSERT INTO noetl_event (event_id, execution_id, sequence, name, ts, body) VALUES (?,?,?,?,?,?)",
                  (e.event_id, "x", i, e.name, e.timestamp, json.dumps(e.to_dict())))  # fmt: skip
    c.close()
    store = SqliteEventStore(db)
    store.segment_min = 50
    try:
        resent_and_new = _copy(old) + _events("x", 100, start=5)
        store.append(resent_and_new)  # the old ones are recognised (keys backfilled)
        store.append(_events("x", 100, start=105))  # a segment after old rows
        got = store.read("x")
        assert [e.sequence for e in got] == list(range(1, 206))
        assert [_plain(e) for e in got[:5]] == [_plain(e) for e in old]  # full bodies read as before
        assert [s.gid for s in store.tail(0, 1000)] == list(range(1, 206))
        assert _segments(store) == 1
    finally:
        store.close()


def test_a_corrupt_segment_is_skipped_and_reported(tmp_path):
    store = SqliteEventStore(tmp_path / "e.db")
    store.segment_min = 50
    try:
        store.append(_events("x", 3))
        other = sqlite3.connect(tmp_path / "e.db", isolation_level=None)  # another writer, as append would
        other.execute(
            "INSERT INTO noetl_event_segment (gid_last, gid_first, execution_id, seq_first, seq_last, body)"
            " VALUES (100, 4, 'x', 4, 100, x'00ff')"
        )
        other.close()
        store.append(_events("x", 2, start=3))
        assert [e.sequence for e in store.read("x")] == [1, 2, 3, 101, 102]
        assert [s.gid for s in store.tail(0, 1000)] == [1, 2, 3, 101, 102]
        assert [s.gid for s in store.tail(3, 1)] == [101]
        assert any("segment" in where for where, _ in store.skipped)
    finally:
        store.close()


LOOP = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: seg, path: tests/seg}
workload: {n: 150}
workflow:
  - step: start
    loop: {in: "{{ range(workload.n) | list }}", iterator: x}
    tool:
      kind: python
      pure: true  # no barrier per iteration: the iterations go in one batch (segments)
      input: {x: "{{ iter.x }}"}
      code: "result = {'sq': x * x}"
    set: {ctx.total: "{{ start.stats.ok }}"}
    next: {arcs: [{step: end}]}
  - step: end
    tool: {kind: noop}
"""


def test_replay_equals_live_for_a_loop_stored_in_segments(tmp_path, monkeypatch):
    monkeypatch.setattr(SqliteEventStore, "segment_min", 64)
    p = tmp_path / "pb.yaml"
    p.write_text(LOOP)
    captured = []
    FINISHED_HOOKS.append(lambda eng: captured.append(eng.state.snapshot()))
    try:
        res = run_playbook(p, data_dir=tmp_path / "data")
    finally:
        FINISHED_HOOKS.pop()
    assert res.status == "completed"
    store = SqliteEventStore(tmp_path / "data" / "events.db")
    try:
        assert _segments(store) >= 1
        state = replay(store, res.execution_id)
        assert diff_snapshots(captured[-1], state.snapshot()) == []
        assert state.ctx == {"total": 150}
        evs = store.read(res.execution_id)
        assert [e.sequence for e in evs] == list(range(1, len(evs) + 1))
        assert sum(e.name == E.LOOP_ITERATION_DONE for e in evs) == 150
    finally:
        store.close()


def test_a_segment_written_as_a_list_of_stored_events_still_reads(tmp_path):
    """The first segment body format (a JSON list of stored forms) stays readable."""
    import zstandard

    from noetl_dagster.util.jsonutil import dumps

    store = SqliteEventStore(tmp_path / "e.db")
    try:
        evs = _events("x", 4)
        items = []
        for e in evs:
            d = e.to_stored()
            del d["execution_id"], d["sequence"]
            items.append(d)
        body = zstandard.ZstdCompressor().compress(dumps(items).encode("utf-8", "surrogatepass"))
        store._conn.execute(
            "INSERT INTO noetl_event_segment (gid_last, gid_first, execution_id, seq_first, seq_last, body)"
            " VALUES (4, 1, 'x', 1, 4, ?)",
            (body,),
        )
        got = store.read("x")
        assert [_plain(e) | {"sequence": None} for e in got] == [_plain(e) for e in evs]
        assert [e.sequence for e in got] == [1, 2, 3, 4]
    finally:
        store.close()


class _WriteBetween:
    """A connection proxy: after the reader's first SELECT on noetl_event, another process-like
    store commits a row and then a segment (the interleaving two SELECTs could see half of)."""

    def __init__(self, conn, write):
        self._c, self._write, self.done = conn, write, False

    def execute(self, q, *args):
        r = self._c.execute(q, *args)
        if not self.done and q.startswith("SELECT gid, body") and " FROM noetl_event WHERE" in q:
            self.done = True
            r = r.fetchall()
            self._write()
            return _Rows(r)
        return r

    def __getattr__(self, name):
        return getattr(self._c, name)


class _Rows(list):
    def fetchall(self):
        return list(self)


def test_tail_sees_rows_and_segments_as_of_one_commit(tmp_path):
    db = tmp_path / "e.db"
    reader, writer = SqliteEventStore(db), SqliteEventStore(db)
    writer.segment_min = 50
    try:
        reader.append(_events("x", 3))

        def write():
            writer.append(_events("y", 1))  # gid 4, a row
            writer.append(_events("z", 60))  # gids 5-64, a segment

        reader._conn = _WriteBetween(reader._conn, write)
        first = [s.gid for s in reader.tail(0, 1000)]
        assert first == [1, 2, 3]  # not [1, 2, 3, 5..64] with gid 4 skipped for ever
        assert [s.gid for s in reader.tail(3, 1000)] == list(range(4, 65))
    finally:
        reader._conn = reader._conn._c if isinstance(reader._conn, _WriteBetween) else reader._conn
        reader.close()
        writer.close()
