"""The execution summary the event stores keep beside the log (issue 36 item 4).

Appends write the summary rows their events changed (every WRITE_EVERY events and with the
execution's last ones; an execution that ends in fewer events has none until a reader folds its
log and writes it back), in their own transaction (SQLite) or statement (Postgres); the summary
must equal a fold of the log up to its last sequence at every point - after a run,
a failed run, a kill -9 and a resume, appends from two store connections in turn, a re-sent
batch - and a page must read the summary and a handful of events, not the log."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import sqlite3
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from conftest import PLAYBOOKS

from noetl_analytics.execution_view import ExecutionViews
from noetl_dagster.engine.explain import explain
from noetl_dagster.engine.explain_playbook import playbook_of
from noetl_dagster.engine.explain_summary import WRITE_EVERY, rebuild, state_rows
from noetl_dagster.runners.local import resume_execution, run_playbook
from noetl_dagster.storage.events import SqliteEventStore
from noetl_dagster.storage.postgres_events import PostgresEventStore

PG_URL = os.environ.get("NOETL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def _rows(store, execution_id):
    got = store.summary(execution_id)
    assert got is not None, "no summary was written"
    return got[0], sorted(got[1])


def _rebuilt(store, execution_id, upto=None):
    evs = store.read(execution_id)[:upto]
    return evs[-1].sequence, sorted(state_rows(rebuild(evs), everything=True))


@pytest.fixture(scope="module")
def pg_schemas():
    """Schemas dropped at the end (after the replay check of every execution, which reads them)."""
    made: list[str] = []
    yield made
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        for schema in made:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path, pg_schemas):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'events.db'}"
    pg_schemas.append("sum_" + uuid.uuid4().hex[:12])
    return f"{PG_URL}?schema={pg_schemas[-1]}"


def _open(url: str):
    return SqliteEventStore(url[len("sqlite:///") :]) if url.startswith("sqlite") else PostgresEventStore(url)


def test_the_summary_equals_a_rebuild_for_finished_and_failed_runs(store_url, home):
    ids = {
        "loop": run_playbook(
            PLAYBOOKS / "loop300.yaml",
            {"items": list(range(300)), "fail_at": 260},
            event_store=store_url,
            data_dir=home,
        ).execution_id,  # fmt: skip
        "failed": run_playbook(
            PLAYBOOKS / "explain_demo.yaml", {"route": "right"}, event_store=store_url, data_dir=home
        ).execution_id,  # fmt: skip
        "retries": run_playbook(
            PLAYBOOKS / "retries.yaml", {"fail_times": 1}, event_store=store_url, data_dir=home
        ).execution_id,  # fmt: skip
    }
    store = _open(store_url)
    try:
        assert _rows(store, ids["loop"]) == _rebuilt(store, ids["loop"])
        for short in ("failed", "retries"):  # fewer than WRITE_EVERY events: no summary, all tail
            assert len(store.read(ids[short])) < WRITE_EVERY and store.summary(ids[short]) is None
        # what the page shows from the summary is what a fold of the whole log shows
        views = ExecutionViews(store)
        for name, eid in ids.items():
            page = views.explain(eid)
            assert views.rebuilt == (0 if name == "loop" else 1 + (name == "retries"))
            assert _rows(store, eid) == _rebuilt(store, eid)  # the short ones: written back
            lines = {r["step"]: r["line"] for r in page["runs"]}
            whole = explain(store.read(eid), price=views._pricing(), lines=lines,  # noqa: SLF001
                      playbook=playbook_of(store.read(eid))[0]).data  # fmt: skip
            assert [page[k] for k in ("runs", "arcs", "totals", "steps")] == [
                whole[k] for k in ("runs", "arcs", "totals", "steps")
            ]
        loop = views.explain(ids["loop"])["runs"][0]["loop"]
        assert (loop["ok"], loop["failed"]) == (299, 1)
        assert next(i for i in loop["iterations"] if i["status"] == "error")[
            "sequence"
        ]  # the failure's event
        assert loop["durations"]["min_ms"] <= loop["durations"]["p50_ms"] <= loop["durations"]["max_ms"]
    finally:
        store.close()


def test_appends_from_two_connections_and_a_resent_batch_keep_it_equal(store_url, home):
    """Two store objects (two processes' connections) append one execution's events in turn,
    in uneven batches, one batch sent twice: each continues the summary the other wrote, or
    leaves it behind, and a reader folds the rest; never a summary that disagrees with the log."""
    eid = run_playbook(PLAYBOOKS / "loop300.yaml", {"items": list(range(300)), "fail_at": 33},
                       data_dir=home).execution_id  # fmt: skip
    events = SqliteEventStore(home / "events.db").read(eid)
    a, b = _open(store_url), _open(store_url)
    try:
        rnd, i, turn = random.Random(7), 0, 0
        while i < len(events):
            n = rnd.choice([1, 3, 40, 300, 700])
            batch = [e.__class__.from_dict(e.to_dict()) for e in events[i : i + n]]
            (a, b)[turn % 2].append(batch)
            if turn == 3:  # the same batch again (a retried flush): stored once
                (a, b)[(turn + 1) % 2].append([e.__class__.from_dict(e.to_dict()) for e in events[i : i + n]])
            i, turn = i + n, turn + 1
            got = a.summary(eid)
            if got is not None:  # behind the log, or at it: equal to the fold of that prefix
                assert sorted(got[1]) == sorted(state_rows(rebuild(events[: got[0]]), everything=True))
        views = ExecutionViews(a)
        page = views.explain(eid)
        assert page["execution"]["events"] == len(events)
        assert _rows(a, eid) == _rebuilt(a, eid)  # the reader caught it up and wrote it back
    finally:
        a.close()
        b.close()


def _count(db: Path) -> int:
    try:
        with sqlite3.connect(db, timeout=5) as c:
            return c.execute("SELECT (SELECT COUNT(*) FROM noetl_event) +"
                             " COALESCE((SELECT SUM(seq_last - seq_first + 1) FROM noetl_event_segment), 0)").fetchone()[0]  # fmt: skip
    except sqlite3.OperationalError:
        return 0


def _child(data_dir: str, eid: str) -> None:
    run_playbook(PLAYBOOKS / "loop300.yaml", {"items": list(range(3000)), "fail_at": 2500}, data_dir=data_dir,
                 execution_id=eid)  # fmt: skip
    os._exit(0)


@pytest.mark.slow
def test_kill_nine_mid_loop_then_resume(tmp_path):
    d, eid = tmp_path / "noetl", "01a1f000-0000-7000-8000-00000000a036"
    proc = mp.get_context("fork").Process(target=_child, args=(str(d), eid))
    proc.start()
    deadline = time.monotonic() + 120
    while _count(d / "events.db") < 5000 and proc.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert proc.is_alive(), "the run ended before the kill"
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    store = SqliteEventStore(d / "events.db")
    last, rows = _rows(store, eid)
    logged = len(store.read(eid))
    assert 0 < logged - WRITE_EVERY < last <= logged < 12000  # at most WRITE_EVERY events behind the log
    assert (last, rows) == _rebuilt(store, eid, last)  # and equal to the fold of the log up to it
    store.close()
    result = resume_execution(eid, data_dir=d)
    assert result.status == "failed"
    store = SqliteEventStore(d / "events.db")
    assert _rows(store, eid) == _rebuilt(store, eid)  # the resumed process continued the summary
    loop = ExecutionViews(store).explain(eid)["runs"][0]["loop"]
    assert (loop["ok"] + loop["failed"], loop["failed"]) == (3000, 1)


class Counting(SqliteEventStore):
    """Counts the events every read returns and the SQL statements run."""

    def __init__(self, path):
        super().__init__(path)
        self.events_read = 0
        self.statements: list[str] = []
        self._conn.set_trace_callback(self.statements.append)

    def read(self, execution_id, after_sequence=0):  # noqa: ANN001, ANN201
        out = super().read(execution_id, after_sequence)
        self.events_read += len(out)
        return out

    def read_range(self, execution_id, after_sequence, until_sequence):  # noqa: ANN001, ANN201
        out = super().read_range(execution_id, after_sequence, until_sequence)
        self.events_read += len(out)
        return out


def test_opening_a_page_reads_the_summary_not_the_log(home):
    eid = run_playbook(PLAYBOOKS / "loop300.yaml", {"items": list(range(3000)), "fail_at": 2222},
                       data_dir=home).execution_id  # fmt: skip
    store = Counting(home / "events.db")
    total = len(SqliteEventStore(home / "events.db").read(eid))
    views = ExecutionViews(store)
    page = views.explain(eid)
    assert page["execution"]["events"] == total > 12000
    assert store.events_read == 1  # the request (where the playbook is); nothing after the summary
    assert len(store.statements) < 20, store.statements
    rid = page["runs"][0]["step_run_id"]
    rows = views.iterations(eid, rid, 2200, 50)["iterations"]
    assert [r["index"] for r in rows] == list(range(2200, 2250))
    assert next(r for r in rows if r["index"] == 2222)["error"]["message"].endswith("item 2222 is bad")
    assert store.events_read < 1 + 2 * 256 * 4 + 50  # the stretch that holds them: a chunk or two
    # an execution recorded before summaries: folded from its log once, its summary written back
    with sqlite3.connect(home / "events.db") as c:
        c.execute("DELETE FROM noetl_explain WHERE execution_id = ?", (eid,))
    fresh = Counting(home / "events.db")
    again = ExecutionViews(fresh)
    assert again.explain(eid) == page and again.rebuilt == 1 and fresh.events_read >= total
    third = Counting(home / "events.db")
    assert ExecutionViews(third).explain(eid) == page and third.events_read == 1


def test_a_short_execution_folds_nothing_at_append_and_a_late_event_is_read(store_url, home, monkeypatch):
    """Issue 35: an execution that ends in fewer than WRITE_EVERY events is neither folded nor written
    by its appends (its whole log is the summary's tail); an event appended after its end (a late
    task.done) is read by the page, which still equals a fold of the whole log."""
    import dataclasses

    from noetl_dagster.engine import explain as explain_mod

    fed: list[int] = []
    feed = explain_mod.Explainer.feed
    monkeypatch.setattr(explain_mod.Explainer, "feed", lambda self, evs: fed.append(1) or feed(self, evs))
    eid = run_playbook(PLAYBOOKS / "retries.yaml", {"fail_times": 1}, event_store=store_url,
                       data_dir=home).execution_id  # fmt: skip
    assert fed == []
    store = _open(store_url)
    try:
        events = store.read(eid)
        assert len(events) < WRITE_EVERY and store.summary(eid) is None
        late = next(e for e in events if e.name == "task.done")
        late = dataclasses.replace(late, sequence=None, event_id=str(uuid.uuid4()))
        store.append([late])  # (another process: it may catch up on the short log, never write ahead)
        views = ExecutionViews(store)
        page = views.explain(eid)
        assert views.rebuilt == 1 and page["execution"]["events"] == len(events) + 1
        lines = {r["step"]: r["line"] for r in page["runs"]}
        whole = explain(store.read(eid), price=views._pricing(), lines=lines,  # noqa: SLF001
                      playbook=playbook_of(store.read(eid))[0]).data  # fmt: skip
        assert [page[k] for k in ("runs", "arcs", "totals", "steps")] == [
            whole[k] for k in ("runs", "arcs", "totals", "steps")
        ]
        assert _rows(store, eid) == _rebuilt(store, eid)  # written back by the reader
    finally:
        store.close()


def test_an_event_the_fold_cannot_read_never_fails_the_append(store_url):
    from noetl_dagster.engine.events import Event

    store, eid = _open(store_url), "01a1f000-0000-7000-8000-0000000bad36"
    try:
        store.append([Event("playbook.execution.requested", eid, {"playbook": "x"})])
        store.append([Event("step.scheduled", eid, {}, step="a", step_run_id="r1", timestamp="not a time")])
        store.append([Event("workflow.finished", eid, {"status": "completed"})])  # appended all the same
        assert [e.name for e in store.read(eid)][-1] == "workflow.finished"
        got = store.summary(eid)
        assert got is None or got[0] == 1  # left behind (readers fold the rest), never wrong
    finally:
        store.close()


def test_warm_writes_the_summaries_of_executions_recorded_before_them(home):
    eid = run_playbook(PLAYBOOKS / "retries.yaml", {"fail_times": 1}, data_dir=home).execution_id
    with sqlite3.connect(home / "events.db") as c:
        c.execute("DELETE FROM noetl_explain")  # as a store from before summaries left it
    store = SqliteEventStore(home / "events.db")
    assert store.summary(eid) is None
    assert ExecutionViews(store).warm(5) == 1 and _rows(store, eid) == _rebuilt(store, eid)
    assert ExecutionViews(store).warm(5) == 0  # nothing left to do
