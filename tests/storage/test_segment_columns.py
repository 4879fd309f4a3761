"""A segment body keeps one column per field and leaves out the columns that say nothing (all None,
all the default, source/entity as the name implies them): whatever column is left out or kept, the
events decode back field for field."""

from __future__ import annotations

import zstandard

from noetl_dagster.engine.events import Event
from noetl_dagster.storage.event_codec import decode_segment, encode_segment
from noetl_dagster.util.jsonutil import loads


def _events() -> list[Event]:
    evs = [
        Event("step.started", "x1", step="a", step_run_id="r1", entity_id="r1", status="in_progress"),
        Event("task.done", "x1", {"outcome": {"status": "ok"}}, step="a", step_run_id="r1", attempt=1),
        Event("step.done", "x1", {"result": 1}, step="a", step_run_id="r1"),
    ]
    for i, ev in enumerate(evs, start=1):
        ev.sequence = i
    return evs


def _columns(evs: list[Event]) -> dict[str, list]:
    return loads(zstandard.ZstdDecompressor().decompress(encode_segment(evs, zstandard.ZstdCompressor())))[
        "c"
    ]


def test_columns_that_say_nothing_are_left_out():
    cols = _columns(_events())
    assert set(cols) == {"event_id", "timestamp", "name", "data", "status", "entity_id", "step", "step_run_id",
                         "attempt"}  # fmt: skip
    assert cols["attempt"] == [None, 1, None] and cols["data"][0] == {}


def test_one_event_that_differs_keeps_its_column_and_every_field_reads_back():
    evs = _events()
    evs[1].source, evs[2].tenant_id, evs[0].loop_id = "elsewhere", "t2", "L1"
    cols = _columns(evs)
    assert cols["source"] == [e.source for e in evs]
    assert cols["tenant_id"] == ["default", "default", "t2"] and cols["loop_id"] == ["L1", None, None]
    assert "entity" not in cols and "project_id" not in cols
    back = [
        ev for _gid, ev in decode_segment(encode_segment(evs, zstandard.ZstdCompressor()), "x1", 1, 1, "t")
    ]
    assert [e.to_dict() for e in back] == [e.to_dict() for e in evs]


def test_no_events_no_columns():
    assert _columns([]) == {}
