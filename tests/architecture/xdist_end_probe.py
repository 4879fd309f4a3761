"""Run by test_xdist_worker_end.py in its own pytest (-n 1), not collected by the suite: keeps a
large heap alive and records what the worker's closing garbage collection would walk."""

from __future__ import annotations

import gc
import json
import os

KEPT = [[i] for i in range(300_000)]  # lists are tracked by the gc; alive until the worker exits


def test_heap_is_large(request):
    def record() -> None:  # a cleanup added now runs before pytest's own (LIFO): its gc.collect() is next
        with open(os.environ["XDIST_END_PROBE_OUT"], "w") as f:
            json.dump({"walked": len(gc.get_objects()), "frozen": gc.get_freeze_count()}, f)

    request.config.add_cleanup(record)
    assert len(KEPT) == 300_000
