"""The three event-log tiers (issue 45) against the real nats-server with JetStream and the real Postgres:
the nats:// EventStore (hot), the projector (warm), the archiver and retention controller (cold)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from nats_tier_fixtures import new_tier

from noetl_dagster.commands.main import cli
from noetl_dagster.engine.chain import check_chain
from noetl_dagster.engine.events import Event
from noetl_dagster.engine.ports import ExecutionLeased
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage import nats_consumers as nc
from noetl_dagster.storage.archive import verify_archive
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.storage.nats_events import NatsEventStore, parse_nats_url
from noetl_dagster.storage.nats_projection import Projection

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "example_project" / "playbooks"
# playbooks the local runner completes without outside services, with a sub-playbook and a cycle among them
PLAYBOOKS = ["hello_dagster", "countdown_cycle", "fanout_join", "admission_gate", "score_customer"]


@pytest.fixture(scope="module")
def _tiers():
    made = []
    yield made
    for t in made:  # at the module's end: tests/conftest.py replays each test's executions after it
        t.cleanup()


@pytest.fixture
def tier(tmp_path, _tiers):
    t = new_tier(tmp_path)
    _tiers.append(t)
    return t


def _names_per_step(events):
    out: dict = {}
    for e in events:
        out.setdefault((e.step, e.iteration), []).append(e.name)
    return out


def _summary(result):
    j = result.to_json()
    j.pop("execution_id", None)
    return j


# -- the hot tier ----------------------------------------------------------------------------------


def test_append_waits_for_the_ack_numbers_and_reads_back_before_projection(tier):
    with open_event_store(tier.url) as store:
        assert isinstance(store, NatsEventStore)
        evs = [
            Event("workflow.started", "ex-1"),
            Event("step.started", "ex-1", step="a"),
            Event("x.y", "ex-2"),
        ]
        store.append(evs)
        assert [e.sequence for e in evs] == [1, 2, 1]
        # nothing projected yet: read comes from the stream (read-your-writes)
        assert [e.event_id for e in store.read("ex-1")] == [e.event_id for e in evs[:2]]
        assert [e.sequence for e in store.read("ex-1", 1)] == [2]
        report = check_chain("ex-1", store.read_chained("ex-1"))
        assert report.to_json()["status"] == "ok"
        # a re-sent event is acknowledged as a duplicate and keeps its number
        again = Event.from_dict(evs[0].to_dict() | {"sequence": None})
        store.append([again])
        assert again.sequence == 1 and len(store.read("ex-1")) == 2


def test_read_fills_a_hole_in_the_projection_from_the_stream(tier):
    """Regression: a projection holding an execution's events 3..5 but not 1..2 (a restarted projector's
    later batch applied first) read as the whole log, not as a chain missing its start."""
    with open_event_store(tier.url) as store:
        evs = [Event("ctx.patched", "ex-h", data={"i": i}) for i in range(5)]
        store.append(evs)
        p = tier.placement()
        recs = _stream_records(tier, p)
        store.projection.apply([(i + 1, r) for i, r in enumerate(recs) if i >= 2], stream=p.events_stream)
        assert [e.sequence for e in store.read("ex-h")] == [1, 2, 3, 4, 5]
        assert [e.sequence for e in store.read("ex-h", 1)] == [2, 3, 4, 5]
        assert check_chain("ex-h", store.read_chained("ex-h")).to_json()["status"] == "ok"
    with open_event_store(tier.url) as other:  # a process without this one's cache finds the stream too
        assert [e.sequence for e in other.read("ex-h")] == [1, 2, 3, 4, 5]


def test_reading_a_projected_execution_costs_one_stream_request(tier, tmp_path):
    """Regression: a process that did not write the execution walked the whole execution in the stream,
    one request per event, on every read, even when the projection held all of it."""
    r = run_playbook(EXAMPLES / "hello_dagster.yaml", data_dir=tmp_path / "d", event_store=tier.url)
    proj = nc.Projector(tier.url, [tier.placement()])
    proj.drain()
    proj.close()
    with open_event_store(tier.url) as other:
        calls = []
        js = other.client.js
        real = js._api_request

        async def counted(subject, *a, **kw):  # every JetStream API request this store makes
            calls.append(subject.split(".")[3])
            return await real(subject, *a, **kw)

        js._api_request = counted
        assert len(other.read(r.execution_id)) == 26
        assert calls == ["MSG"]  # the execution's last message: nothing past the projection
        assert len(other.read(r.execution_id, 20)) == 6 and calls == ["MSG"] * 2


def test_the_execution_page_reads_through_the_port_and_keeps_its_summary(tier, tmp_path):
    """The explorer (dashboard serve's execution page, noetl_analytics.execution_view) on the nats:// store:
    the first open folds the log and stores the summary in the projection database, the next reads it."""
    from noetl_analytics.execution_view import ExecutionViews  # noqa: PLC0415

    r = run_playbook(EXAMPLES / "countdown_cycle.yaml", data_dir=tmp_path / "d", event_store=tier.url)
    with open_event_store(tier.url) as store:
        assert store.summary(r.execution_id) is None
        page = ExecutionViews(store, data_dir=str(tmp_path / "d")).explain(r.execution_id)
        last, rows = store.summary(r.execution_id)
        assert last == len(store.read(r.execution_id)) and rows
        fresh = ExecutionViews(store, data_dir=str(tmp_path / "d"))
        again = fresh.explain(r.execution_id)
        assert again == page and fresh.rebuilt == 0 and fresh.reads <= 1  # the event naming the playbook
        assert not store.put_summary(r.execution_id, None, last, rows)  # moved meanwhile: left alone
        assert store.put_summary(r.execution_id, last, last, rows)


def test_a_second_process_reads_what_the_first_appended(tier):
    with open_event_store(tier.url) as a, open_event_store(tier.url) as b:
        a.append([Event("workflow.started", "ex-9", tenant_id="acme", project_id="p1")])
        # b never appended to ex-9 and nothing is projected: it finds the execution's stream by scan
        assert [e.name for e in b.read("ex-9")] == ["workflow.started"]


def test_one_lease_per_execution_across_stores_released_on_close(tier):
    """resume's lease lives in the projection database: a second store is refused while the first holds
    it, and takes it once the first closes (the server drops a lock with its connection)."""
    a, b = open_event_store(tier.url), open_event_store(tier.url)
    try:
        a.acquire_lease("ex-lease")
        with pytest.raises(ExecutionLeased, match="ex-lease is leased by another process"):
            b.acquire_lease("ex-lease")
        b.acquire_lease("ex-other")  # another execution's lease is its own
        a.close()
        b.acquire_lease("ex-lease")
    finally:
        b.close()


def test_concurrent_writers_of_one_execution_take_distinct_gap_free_numbers(tier):
    stores = [open_event_store(tier.url) for _ in range(3)]
    try:

        def write(s, k):
            for i in range(30):
                s.append([Event("ctx.patched", "shared", data={"w": k, "i": i})])

        threads = [threading.Thread(target=write, args=(s, k)) for k, s in enumerate(stores)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        evs = stores[0].read("shared")
        assert [e.sequence for e in evs] == list(range(1, 91))
        assert check_chain("shared", stores[0].read_chained("shared")).to_json()["status"] == "ok"
    finally:
        for s in stores:
            s.close()


@pytest.mark.parametrize("name", PLAYBOOKS)
def test_local_runner_on_nats_gives_the_sqlite_trace(tier, tmp_path, name):
    path = EXAMPLES / f"{name}.yaml"
    scope = {"tenant": "demo", "project": "examples"}
    ref = run_playbook(
        path, data_dir=tmp_path / "sqlite", event_store=f"sqlite:///{tmp_path}/ref.db", **scope
    )
    got = run_playbook(path, data_dir=tmp_path / "nats", event_store=tier.url, **scope)
    assert got.status == ref.status == "completed"
    assert _summary(got) == _summary(ref)
    with open_event_store(f"sqlite:///{tmp_path}/ref.db") as s:
        want = _names_per_step(s.read(ref.execution_id))
    with open_event_store(tier.url) as s:
        before = _names_per_step(s.read(got.execution_id))  # from the stream
        proj = nc.Projector(tier.url, [tier.placement("demo", "examples")])
        proj.drain()
        proj.close()
        after = _names_per_step(s.read(got.execution_id))  # from the projection
        assert [x.execution_id for x in s.executions()][:1] != []
    assert before == after == want


# -- the warm tier ---------------------------------------------------------------------------------


def test_projection_tables_and_an_idempotent_replay_of_a_batch(tier, tmp_path):
    r = run_playbook(EXAMPLES / "fanout_join.yaml", data_dir=tmp_path / "d", event_store=tier.url)
    p = tier.placement()
    proj = nc.Projector(tier.url, [p])
    n = proj.drain()
    proj.close()
    projection = Projection(tier.projection_url)
    try:
        live = projection.canonical_dump()
        [(eid, status, last)] = [(x[2], x[4], x[8]) for x in projection.rows("execution_projection")]
        assert (eid, status, last) == (r.execution_id, "completed", n)
        tasks = projection.rows("task_projection")
        assert tasks and all(t[4] == "success" for t in tasks)
        [(name, region, shard, stream, seq, *_)] = projection.rows("projection_checkpoint")
        assert (name, region, shard, stream, seq) == ("state", p.region, p.shard, p.events_stream, n)
        assert len(projection.rows("processed_event")) == n
        # the same batch delivered again (its ack lost): the ledger skips every event
        items = [(i + 1, rec) for i, rec in enumerate(_stream_records(tier, p))]
        assert projection.apply(items, stream=p.events_stream) == 0
        assert projection.canonical_dump() == live
    finally:
        projection.close()


def test_projection_is_the_same_whatever_the_batch_size(tier, tmp_path):
    """Regression: a task started and finished in one batch lost its started_at (the row's fields read
    at the wrong index), so a projection depended on how the stream was cut into batches."""
    run_playbook(EXAMPLES / "fanout_join.yaml", data_dir=tmp_path / "d", event_store=tier.url)
    p = tier.placement()
    items = [(i + 1, r) for i, r in enumerate(_stream_records(tier, p))]
    projection = Projection(tier.projection_url)
    try:
        projection.apply(items, stream=p.events_stream)
        whole = projection.canonical_dump()
        assert all(row[8] is not None for row in projection.rows("task_projection"))  # started_at
        projection.reset()
        for item in items:
            projection.apply([item], stream=p.events_stream)
        assert projection.canonical_dump() == whole
    finally:
        projection.close()


def test_resource_index_holds_every_stored_result_a_task_returned(tier):
    ref = {"$ref": {"uri": "file:///r/x.json", "store": "file", "format": "json", "size": 12,
                    "checksum": "sha256:" + "ab" * 32}}  # fmt: skip
    with open_event_store(tier.url) as store:
        store.append([Event("task.done", "ex-r", step="s", task_run_id="t1", attempt=1, tenant_id="acme",
                            project_id="p1", data={"task": "t", "outcome": {"result": {"rows": ref}}})])  # fmt: skip
    p = tier.placement("acme", "p1")
    proj = nc.Projector(tier.url, [p])
    proj.drain()
    [row] = proj.projection.rows("resource_index")
    proj.close()
    assert row[:9] == ("file:///r/x.json", "sha256:" + "ab" * 32, "acme", "p1", "execution:ex-r", "result",
                       "json", "ab" * 32, 12)  # fmt: skip
    assert (row[9], row[10]) == (p.region, p.shard)


def _stream_records(tier, p):
    from noetl_dagster.storage.nats_streams import connect, decode  # noqa: PLC0415

    with connect(tier.nats_url) as client:
        sub = nc._pull(client, p, None, 1)
        return [decode(m.data) for m in nc._fetch(client, sub, 10_000, 1.0)]


def test_rebuild_from_stream_and_from_archive_alone_equals_live(tier, tmp_path):
    for name in ("hello_dagster", "score_customer", "countdown_cycle"):
        run_playbook(EXAMPLES / f"{name}.yaml", data_dir=tmp_path / "d", event_store=tier.url)
    p = tier.placement()
    proj = nc.Projector(tier.url, [p])
    proj.drain()
    proj.close()
    arch = nc.Archiver(tier.url, p)
    arch.drain()
    arch.close()
    assert len(arch.archived) == 3 and all(verify_archive(a["uri"])["status"] == "ok" for a in arch.archived)
    projection = Projection(tier.projection_url)
    try:
        live = projection.canonical_dump()
        projection.drop_table("task_projection")
        projection.drop_table("event_projection")
        assert nc.rebuild_from_stream(tier.url, p) > 0
        assert projection.canonical_dump() == live
        projection.drop_table("execution_projection")
        bundles = nc.archive_bundles("file://" + str(tier.payload))
        assert len(bundles) == 3
        nc.rebuild_from_archive(tier.url, bundles)
        assert projection.canonical_dump() == live
    finally:
        projection.close()


# -- the cold tier ---------------------------------------------------------------------------------


def test_archiver_checkpoint_and_retention_never_evict_an_unarchived_range(tier, tmp_path):
    p = tier.placement()
    with open_event_store(tier.url) as store:
        done = run_playbook(EXAMPLES / "hello_dagster.yaml", data_dir=tmp_path / "d", event_store=tier.url)
        # a running execution (started, not finished) after the finished one
        store.append([Event("playbook.execution.requested", "running-1", data={"playbook": "x"}),
                      Event("workflow.started", "running-1")])  # fmt: skip
        done2 = run_playbook(EXAMPLES / "hello_dagster.yaml", data_dir=tmp_path / "d", event_store=tier.url)
    n_done = len(_stream_records(tier, p)) - 2
    proj = nc.Projector(tier.url, [p])
    proj.drain()
    proj.close()
    ret = nc.Retention(tier.url, p, min_age_s=0)
    try:
        # nothing archived yet: nothing may go, however old and projected
        assert ret.enforce()["bound"] == 0 and ret.bound()["first_seq"] == 1
        arch = nc.Archiver(tier.url, p)
        arch.drain()
        arch.close()
        assert {a["execution_id"] for a in arch.archived} == {done.execution_id, done2.execution_id}
        first_running = n_done // 2 + 1
        # archived through the first execution only: the running one holds everything after it
        assert nc.last_archive_ack(ret.client, p)["archived_through"] == first_running - 1
        out = ret.enforce()
        assert out["evicted_through"] == first_running - 1 and out["active_first_seq"] == first_running
        with open_event_store(tier.url) as store:
            assert [e.name for e in store.read("running-1")] == [
                "playbook.execution.requested",
                "workflow.started",
            ]
            assert store.read(done.execution_id)[-1].name == "playbook.processed"  # the projection keeps it
        # a restarted archiver resumes from its checkpoint and archives nothing twice
        again = nc.Archiver(tier.url, p)
        again.drain()
        again.close()
        assert [(a["execution_id"], a["status"]) for a in again.archived] == [(done2.execution_id, "exists")]
    finally:
        ret.close()


@settings(max_examples=6, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=30))
def test_retention_on_a_real_stream_never_evicts_an_execution_not_archived(tmp_path_factory, _tiers, steps):
    """Interleaved executions on a real stream, some finished, some not; the projector, the archiver and
    retention (min age 0) run: every event of an execution not archived is still in the stream, and every
    execution reads whole through the store."""
    tier = new_tier(tmp_path_factory.mktemp("prop"))
    _tiers.append(tier)
    p = tier.placement()
    appended: dict[str, int] = {}
    finished: set[str] = set()
    with open_event_store(tier.url) as store:
        for ex, finish in steps:
            eid = f"ex-{ex}"
            if eid in finished:
                continue
            if eid not in appended:
                evs = [Event("playbook.execution.requested", eid, data={"playbook": "x"})]
            elif finish:
                evs = [Event("workflow.finished", eid, data={"status": "completed"}),
                       Event("playbook.processed", eid, data={"status": "completed"})]  # fmt: skip
                finished.add(eid)
            else:
                evs = [Event("ctx.patched", eid, data={"k": appended[eid]})]
            store.append(evs)
            appended[eid] = appended.get(eid, 0) + len(evs)
    for consumer in (nc.Projector(tier.url, [p]), nc.Archiver(tier.url, p)):
        consumer.drain()
        consumer.close()
    ret = nc.Retention(tier.url, p, min_age_s=0)
    ret.enforce()
    ret.close()
    in_stream = [r["execution_id"] for r in _stream_records(tier, p)]
    with open_event_store(tier.url) as store:
        for eid, n in appended.items():
            if eid not in finished:
                assert in_stream.count(eid) == n, (eid, steps)
            assert [e.sequence for e in store.read(eid)] == list(range(1, n + 1))
    assert len(nc.archive_bundles("file://" + str(tier.payload))) == len(finished)


@settings(max_examples=300, deadline=None)
@given(
    archived=st.integers(0, 100),
    checkpoints=st.lists(st.integers(0, 100), max_size=3),
    age=st.integers(0, 100),
    active=st.one_of(st.none(), st.integers(1, 101)),
)
def test_eviction_bound_never_passes_any_gate(archived, checkpoints, age, active):
    b = nc.eviction_bound(archived, checkpoints, age, active)
    assert 0 <= b <= archived and b <= age
    assert all(b <= c for c in checkpoints) and (checkpoints or b == 0)
    assert active is None or b < active


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["start", "event", "finish"])), max_size=40))
def test_archiver_watermark_under_interleavings(ops):
    """Any interleaving of executions' events: archived_through stays below the first event of every
    execution whose bundle is not written (the archiver's own bookkeeping, without servers)."""
    arch = nc.Archiver.__new__(nc.Archiver)
    arch._pending, arch.archived_through, arch.scanned_through, arch.archived = {}, 0, 0, []
    first: dict[int, int] = {}
    open_: set[int] = set()
    for seq, (ex, what) in enumerate(ops, start=1):
        arch.scanned_through = seq
        if what == "start" or ex not in open_:
            if ex in open_:
                continue
            open_.add(ex)
            first[ex] = seq
            arch._pending[str(ex)] = nc._Gathered(seq, None)
        elif what == "finish":
            open_.discard(ex)
            arch._pending.pop(str(ex), None)
        arch._advance()
        assert all(arch.archived_through < first[x] for x in open_)


# -- configuration and commands --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("nats://h:4222", "needs projection="),
        ("nats://h:4222?projection=postgresql%3A%2F%2Fx&bogus=1", "unknown parameter"),
        ("nats://h:4222?projection=postgresql%3A%2F%2Fx&shards=many", "not a number"),
        ("nats://h:4222?projection=postgresql%3A%2F%2Fx&region=us.w", "region"),
    ],
)
def test_bad_store_urls_say_what_is_wrong(url, message):
    with pytest.raises(ValueError, match=message):
        parse_nats_url(url).placement("t", "p")


def test_commands_refuse_bad_input_with_exit_2(tier):
    run = CliRunner().invoke
    r = run(cli, ["projector", "--store", "postgresql://x/y", "--once"])
    assert r.exit_code == 2 and "nats://" in r.output
    r = run(cli, ["retention", "--store", tier.url, "--shard", "s0001", "--min-age", "soon"])
    assert r.exit_code == 2 and "--min-age 'soon'" in r.output
    r = run(cli, ["archiver", "--store", tier.url.split("&payload")[0] + f"&region={tier.region}", "--shard",
                  "s0001", "--once"])  # fmt: skip
    assert r.exit_code == 2 and "payload store" in r.output


def test_commands_run_one_pass(tier, tmp_path):
    run_playbook(EXAMPLES / "hello_dagster.yaml", data_dir=tmp_path / "d", event_store=tier.url)
    run = CliRunner().invoke
    r = run(cli, ["projector", "--store", tier.url, "--once"])
    assert r.exit_code == 0 and "projected 26 events" in r.output, r.output
    r = run(cli, ["archiver", "--store", tier.url, "--once"])
    assert r.exit_code == 0 and '"archived_through":26' in r.output, r.output
    scoped = ["--tenant", "default", "--project", "default"]
    r = run(cli, ["retention", "--store", tier.url, *scoped, "--dry-run"])  # the 24 h default min age
    assert r.exit_code == 0 and '"age_bound":0' in r.output and '"bound":0' in r.output, r.output
    r = run(cli, ["retention", "--store", tier.url, "--min-age", "0", "--dry-run"])
    assert r.exit_code == 0 and '"bound":26' in r.output and "evicted_through" not in r.output, r.output
    r = run(cli, ["retention", "--store", tier.url, "--min-age", "0", "--once"])
    assert r.exit_code == 0 and '"evicted_through":26' in r.output, r.output
    r = run(cli, ["projector", "--store", tier.url, "--rebuild", "archive"])
    assert r.exit_code == 0 and "1 archive bundle(s): 26 events" in r.output, r.output
