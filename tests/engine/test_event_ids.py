"""Event ids: RFC 9562 UUIDv7 strings whose first 48 bits are the event's millisecond."""

from __future__ import annotations

import threading
import uuid

from noetl_dagster.engine import events
from noetl_dagster.engine.events import Event, _uuid7_at


def test_ids_are_version_7_with_the_millisecond_in_front():
    for ms in (0, 1, 0xFFFF, 0x10000, 1_795_000_000_123, 0xFFFFFFFFFFFF):
        s = _uuid7_at(ms)
        u = uuid.UUID(s)
        assert str(u) == s and u.version == 7 and u.variant == uuid.RFC_4122
        assert u.int >> 80 == ms


def test_ids_sort_by_time_and_do_not_repeat():
    ids = [_uuid7_at(ms) for ms in range(1_795_000_000_000, 1_795_000_000_050) for _ in range(40)]
    assert len(set(ids)) == len(ids)
    assert [i[:13] for i in ids] == sorted(i[:13] for i in ids)


def test_threads_never_pair_a_millisecond_with_another_prefix():
    bad: list[str] = []

    def work(base: int) -> None:
        for k in range(3000):
            ms = base + k % 7
            s = _uuid7_at(ms)
            if uuid.UUID(s).int >> 80 != ms:
                bad.append(s)

    threads = [threading.Thread(target=work, args=(10**12 * (i + 1),)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def test_an_event_id_and_timestamp_come_from_one_clock_read():
    ev = Event("step.started", "e1")
    ms = uuid.UUID(ev.event_id).int >> 80
    assert ev.timestamp.startswith(events._iso_at(ms * 1_000_000)[:23])


def test_the_random_bits_fill_rand_a_then_rand_b_after_the_variant():
    """The id's random part is the generator's 80 bits laid out as RFC 9562 fields (rand_a: the top 12,
    then the variant "10" and 14 bits, then the low 48): the same ids for the same random stream."""
    for seed in range(200):
        events._rng.seed(seed)
        rand = events._rng.getrandbits(80)
        events._rng.seed(seed)
        s = _uuid7_at(1_795_000_000_123)
        u = uuid.UUID(s).int
        assert (u >> 64) & 0xFFF == (rand >> 68) & 0xFFF
        assert (u >> 48) & 0xFFFF == 0x8000 | ((rand >> 48) & 0x3FFF)
        assert u & 0xFFFFFFFFFFFF == rand & 0xFFFFFFFFFFFF
    events._rng.seed(__import__("os").urandom(32))  # the stream stays unpredictable for the tests after
