"""The local files' v3 layout (issue 46 footprint): dictionary-encoded text columns, event ids the
store names itself (derived on read, bound by the chain), the event's own ids out of its body; files
of the earlier layout (a committed fixture written by the code before) still read the same."""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from noetl_dagster.engine.chain import check_chain
from noetl_dagster.engine.events import Event, uuid7
from noetl_dagster.storage.events import SqliteEventStore
from noetl_dagster.storage.feather_events import (
    EVENTS_FILE,
    FeatherEventStore,
    derived_event_id,
    micros,
)
from noetl_dagster.storage.local_mode import PushRefused, push

FIXTURE = Path(__file__).parent / "fixtures" / "local_v2"


def _loop_events(execution_id: str, n: int) -> list[Event]:
    """What a loop records (ids of its own repeated in the body), every event without an id."""
    srid, loop = uuid7(), uuid7()
    out = [Event("playbook.execution.requested", execution_id, {"playbook": "p"}, entity_id=execution_id)]
    for i in range(n):
        trid = uuid7()
        out += [
            Event("loop.iteration.started", execution_id, step="fan", step_run_id=srid, loop_id=loop,
                  entity_id=loop, iteration=i, status="in_progress"),
            Event("task.started", execution_id, {"task": "t"}, step="fan", step_run_id=srid, loop_id=loop,
                  task_run_id=trid, entity_id=trid, iteration=i, attempt=1, status="in_progress"),
            Event("task.done", execution_id, {"outcome": {"meta": {"task_run_id": trid, "of": execution_id}}},
                  step="fan", step_run_id=srid, loop_id=loop, task_run_id=trid, entity_id=trid, iteration=i),
        ]  # fmt: skip
    return out


def _rewrite(path: Path, edit) -> None:
    """Rewrite events.feather with pyarrow after ``edit(columns as lists)`` (an attacker's edit)."""
    table = pa.ipc.open_stream(path.read_bytes()).read_all()
    data = table.to_pydict()
    edit(data)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(pa.table(data, schema=table.schema))
    path.write_bytes(sink.getvalue().to_pybytes())


@pytest.mark.parametrize("execution_id", sorted(p.name for p in FIXTURE.iterdir() if p.is_dir()))
def test_a_folder_written_by_the_v2_layout_reads_back_the_same_and_pushes(tmp_path, execution_id):
    """The fixture was written by `run` before this layout (one folder plain, one with zstd buffers);
    its events, as that code read them, are in expected_events.json."""
    shutil.copytree(FIXTURE / execution_id, tmp_path / "local" / execution_id)
    expected = json.loads((FIXTURE / "expected_events.json").read_text())[execution_id]
    local = FeatherEventStore(tmp_path / "local")
    assert [e.to_dict() for e in local.read(execution_id)] == expected and not local.skipped
    assert check_chain(execution_id, local.read_chained(execution_id)).status == "ok"
    table = pa.ipc.open_stream((tmp_path / "local" / execution_id / EVENTS_FILE).read_bytes()).read_all()
    assert "packing" not in table.schema.names  # it is the old layout
    target = SqliteEventStore(tmp_path / "events.db")
    assert push(local, [execution_id], target) == len(expected)
    assert [e.to_dict() for e in target.read(execution_id)] == expected
    with pytest.raises(ValueError, match="earlier column layout"):  # not appended to: a new schema
        local.append([Event("x.y", execution_id)])
    local._execs.clear()  # the refused row stays buffered; the test drops it rather than flush at exit


def test_events_created_without_an_id_are_named_after_their_sequence_and_read_back_the_same(tmp_path):
    evs = _loop_events("x1", 3)
    first_id = evs[0].event_id
    store = FeatherEventStore(tmp_path)
    store.append(evs)
    store.close()
    assert evs[0].event_id == first_id  # the first keeps its (random) id: the anchor of the others
    for e in evs[1:]:
        assert e.event_id == derived_event_id("x1", first_id, e.sequence, micros(e.timestamp))
    table = pa.ipc.open_stream((tmp_path / "x1" / EVENTS_FILE).read_bytes()).read_all()
    assert table.column("event_id").to_pylist()[1:] == [None] * (len(evs) - 1)  # nothing kept for them
    assert table.column("event_id_text").to_pylist() == [None] * len(evs)
    assert (
        str(table.schema.field("execution_id").type) == "dictionary<values=string, indices=int32, ordered=0>"
    )
    bodies = table.column("body").to_pylist()
    assert not any(e.task_run_id.encode() in b for e, b in zip(evs, bodies, strict=True) if e.task_run_id)
    again = FeatherEventStore(tmp_path)
    assert again.read("x1") == evs and not again.skipped
    assert check_chain("x1", again.read_chained("x1")).status == "ok"


def test_an_id_given_to_an_event_is_kept_and_copies_from_another_process_stay_idempotent(tmp_path):
    sent = Event.from_dict({**Event("a.b", "x1").to_dict(), "event_id": uuid7()})  # sent from elsewhere
    later = Event("a.c", "x1")
    later.event_id = "evt-set-later"  # an id set after construction is a given one too
    evs = [Event("a.a", "x1"), sent, later, Event("a.d", "x1")]
    ids = [e.event_id for e in evs[1:3]]
    store = FeatherEventStore(tmp_path)
    store.append(evs)
    store.append(evs)  # the same objects again: every one already there
    store.close()
    assert [e.event_id for e in evs[1:3]] == ids and [e.sequence for e in evs] == [1, 2, 3, 4]
    again = FeatherEventStore(tmp_path)  # a new process: ids only in the file
    copies = [Event.from_dict({**e.to_dict(), "sequence": None}) for e in evs]
    again.append(copies)
    assert [c.sequence for c in copies] == [1, 2, 3, 4] and len(again.read("x1")) == 4


@pytest.mark.parametrize("edit", ["created_at", "anchor", "explicit id", "sequence"])
def test_an_edit_of_what_a_derived_id_comes_from_breaks_the_chain(tmp_path, edit):
    store = FeatherEventStore(tmp_path)
    store.append(_loop_events("x1", 2))
    store.close()
    path = tmp_path / "x1" / EVENTS_FILE

    def change(data):
        if edit == "created_at":  # moves the event's time (and so its id) by a millisecond
            data["created_at"][3] = data["created_at"][3].replace(
                microsecond=(data["created_at"][3].microsecond + 1000) % 1_000_000
            )
        elif edit == "anchor":  # every derived id changes with the first event's id
            data["event_id"][0] = bytes(16)
        elif edit == "explicit id":  # an id of the attacker's choosing where the store derived one
            data["event_id"][3] = bytes.fromhex(uuid7().replace("-", ""))
        else:
            data["sequence"][4], data["sequence"][5] = data["sequence"][5], data["sequence"][4]

    _rewrite(path, change)
    report = check_chain("x1", FeatherEventStore(tmp_path).read_chained("x1"))
    assert report.status == "broken"


def test_push_refuses_a_diverged_copy_whose_events_have_the_same_ids(tmp_path):
    """Regression: push compared only event ids with what the target holds. A copy of a local folder
    resumed in two places names its next events alike (derived ids), so a diverged history would
    have been "pushed" (skipped as already there) and marked pushed while the target kept the other."""
    evs = _loop_events("x1", 1)
    a = FeatherEventStore(tmp_path / "a")
    a.append(evs)
    a.close()
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    a, b = FeatherEventStore(tmp_path / "a"), FeatherEventStore(tmp_path / "b")
    ea, eb = Event("task.done", "x1", {"result": 1}), Event("task.done", "x1", {"result": 2})
    eb.timestamp = ea.timestamp  # the same time: the same derived id, other content
    a.append([ea])
    b.append([eb])
    assert ea.event_id == eb.event_id
    a.close()
    b.close()
    target = SqliteEventStore(tmp_path / "events.db")
    push(FeatherEventStore(tmp_path / "a"), ["x1"], target)
    with pytest.raises(PushRefused, match="holds other events"):
        push(FeatherEventStore(tmp_path / "b"), ["x1"], target)
    assert target.read("x1")[-1].data == {"result": 1}


def test_a_file_cut_between_a_dictionary_delta_and_its_batch_reads_and_appends_on(tmp_path):
    store = FeatherEventStore(tmp_path)
    store.append([Event("a.a", "x1", step="s1")])
    store.barrier()
    store.append([Event("b.b", "x1", step="s2")])  # new event type and step: dictionary deltas first
    store.close()
    path = tmp_path / "x1" / EVENTS_FILE
    raw = path.read_bytes()
    reader, ends = pa.BufferReader(raw), []
    while True:
        try:
            msg = pa.ipc.read_message(reader)
        except EOFError:
            break
        ends.append((msg.type, reader.tell()))
    assert [t for t, _ in ends][-3:] == ["dictionary", "dictionary", "record batch"]
    path.write_bytes(raw[: ends[-2][1]])  # the deltas whole, the batch they were for never written
    cut = FeatherEventStore(tmp_path)
    assert [e.name for e in cut.read("x1")] == ["a.a"]
    cut.append([Event("c.c", "x1", step="s2"), Event("b.b", "x1", step="s3")])
    cut.close()
    table = pa.ipc.open_stream(path.read_bytes()).read_all()
    assert table.column("event_type").to_pylist() == ["a.a", "c.c", "b.b"]
    assert table.column("step").to_pylist() == ["s1", "s2", "s3"]
    assert check_chain("x1", FeatherEventStore(tmp_path).read_chained("x1")).status == "ok"


_ids = st.one_of(st.none(), st.just("shared"), st.builds(uuid7), st.text(string.printable, max_size=12),
                 st.text(max_size=6))  # fmt: skip
_values = st.recursive(
    st.one_of(st.none(), st.integers(), st.text(max_size=20), st.sampled_from(["\x01", "\x02\x03", "\x04x"])),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(_ids, _ids, _ids, st.sampled_from([0, 1, 2, 3, 4, 5]), _values,
                               st.sampled_from(["success", "in_progress", "error"]), st.booleans(), st.booleans()),
                     min_size=1, max_size=8))  # fmt: skip
def test_any_event_reads_back_exactly_as_appended(tmp_path_factory, rows):
    """The packing (ids out of the body, their text replaced, the entity_id coded) is exact for any
    ids and any data, the ids' text inside the data included, and raw control characters too."""
    root = tmp_path_factory.mktemp("v3")
    eid = "01a23729-63ba-758e-b7e1-0bce0e9bb6a3"
    evs = []
    for srid, loop, trid, entity, data, status, odd_time, has_id in rows:
        ids = [trid, srid, loop, eid, "other", None]
        ev = Event("task.done", eid, {"v": data, "ids": [x for x in ids if x]}, step_run_id=srid,
                   loop_id=loop, task_run_id=trid, entity_id=ids[entity], status=status,
                   step=None if entity == 5 else "s")  # fmt: skip
        if odd_time:
            ev.timestamp = "2026-12-02T18:00:00Z"  # not the recorder's form: the body keeps it
        if has_id:
            ev.event_id = uuid7()
        evs.append(ev)
    store = FeatherEventStore(root)
    store.append(evs)
    store.close()
    again = FeatherEventStore(root)
    assert again.read(eid) == evs and not again.skipped
    assert check_chain(eid, again.read_chained(eid)).status == "ok"
