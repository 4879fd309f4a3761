"""Hand-off overhead: `facts export` into an embedded store nobody holds vs into one a serving
process holds (the export then runs in the owner, over its loopback endpoint).

The same synthetic event log is exported in each round into a fresh database of the same chdb
path, once by `facts export` itself (the baseline) and once handed to an owner process (what a
`dashboard serve` runs: OwnerService). Both are real CLI processes, so the wall time includes
their start; the export time is the exporter's own (in the CLI, or in the owner). Best of N.

    .venv/bin/python -m benchmarks.bench_live_dash [--events N] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

from noetl_analytics.store import close_all
from noetl_analytics.synthetic import SyntheticSpec, generate
from noetl_dagster.storage.events import SqliteEventStore

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        [
            *(str(ROOT / p) for p in ("", "analytics", "lineage", "registry_service")),
            os.environ.get("PYTHONPATH", ""),
        ]
    ),
}
OWNER = """
import sys, threading, time
from noetl_analytics.export_handoff import OwnerService
from noetl_analytics.store import FactsStore
from noetl_analytics.store_owner import set_process_kind
set_process_kind("bench owner")
OwnerService(FactsStore("chdb://" + sys.argv[1]), threading.Lock()).start()
print("ready", flush=True)
time.sleep(3600)
"""


def _export(path: Path, log_url: str, database: str) -> tuple[float, dict]:
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "noetl_dagster.commands.main", "facts", "export", "--clickhouse", f"chdb://{path}",
         "--database", database, "--events", log_url, "--json"],
        env=ENV, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    wall = time.perf_counter() - t
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return wall, json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_live_dash_"))
    try:
        spec = SyntheticSpec(executions=args.events // 75 + 1, steps=6)
        log = SqliteEventStore(work / "events.db")
        log.append(list(islice(generate(spec), args.events)))
        log_url, n = log.url, log.tail_last()
        log.close()
        close_all()
        path = work / "facts"
        local, handed = [], []
        for r in range(args.rounds):
            wall, report = _export(path, log_url, f"local_{r}")
            assert "this process" in report["exported_by"], report
            local.append((wall, report["seconds"]))
            owner = subprocess.Popen([sys.executable, "-c", OWNER, str(path)], env=ENV, stdout=subprocess.PIPE,
                                     text=True)  # fmt: skip
            try:
                assert owner.stdout is not None and owner.stdout.readline().strip() == "ready"
                wall, report = _export(path, log_url, f"handed_{r}")
                assert report["exported_by"].startswith(f"pid {owner.pid} (bench owner"), report
                handed.append((wall, report["seconds"]))
            finally:
                owner.kill()
                owner.wait()
        (lw, ls), (hw, hs) = min(local), min(handed)
        print(f"facts export of {n:,} events, best of {args.rounds}:")
        print(f"  itself:          wall {lw:.2f} s, export {ls:.2f} s ({n / ls:,.0f} events/s)")
        print(f"  handed to owner: wall {hw:.2f} s, export {hs:.2f} s ({n / hs:,.0f} events/s)")
        print(f"ratio handed / itself: wall {hw / lw:.2f}, export {hs / ls:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
