"""An xdist worker's end: the controller tears a worker down once it reports finished, and execnet
sends it a SIGINT if it is still busy 5 s later. pytest's closing gc.collect() walked the worker's
whole heap after that report (seconds for a 1.5 GB worker on a loaded machine); the KeyboardInterrupt
showed up in a gc callback as an unraisable exception at the end of CI. tests/conftest.py collects
and freezes the heap before the report, so that last collection walks only what came after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("xdist_end_probe.py")


def test_the_closing_collection_of_a_worker_skips_the_heap_it_had_when_it_finished(tmp_path):
    out = tmp_path / "probe.json"
    env = {**os.environ, "XDIST_END_PROBE_OUT": str(out)}
    env.pop("PYTEST_XDIST_WORKER", None)  # the child's controller starts its own worker
    r = subprocess.run([sys.executable, "-m", "pytest", "-n", "1", "-p", "no:cacheprovider", "-q", str(PROBE)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    seen = json.loads(out.read_text())
    assert seen["frozen"] >= 300_000  # the probe's heap, frozen before the worker reported
    assert seen["walked"] < 100_000, seen  # without the freeze: over 300,000
