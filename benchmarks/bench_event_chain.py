"""What the hash chain (issue 41) costs the SQLite event store: append CPU with and without it.

Each row appends the same events to a fresh SQLite file in a child process whose code is this
checkout or ``--before-tree`` (e.g. a worktree of main before the chain), rows interleaved round
by round; the figures are the child's CPU seconds (``time.process_time``) per 1,000 events and the
ratio this checkout / before. Two layouts: small batches (one row per event, a step's flush) and
loop-sized batches (one compressed segment per flush). ``verify`` (the chain recomputed from the
log, as every replay does first) is timed on this checkout beside a plain ``read``.

Run: ``python -m benchmarks.bench_event_chain [--before-tree DIR] [--events 20000] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
from noetl_dagster.engine.events import Event
from noetl_dagster.storage.events import SqliteEventStore
path, n, batch, verify = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
store = SqliteEventStore(path)
store.segment_min = 256 if batch >= 256 else None
events = [Event(name="task.done", execution_id="bench", step="s", iteration=i,
                data={"task": "t", "outcome": {"status": "ok", "result": {"i": i, "v": "x" * 40}}})
          for i in range(n)]
t = time.process_time()
for i in range(0, n, batch):
    store.append(events[i : i + batch])
out = {"append": time.process_time() - t}
if verify:
    from noetl_dagster.engine.replay import verify_chain
    t = time.process_time()
    store.read("bench")
    out["read"] = time.process_time() - t
    t = time.process_time()
    verify_chain(store, "bench")
    out["verify"] = time.process_time() - t
print(json.dumps(out))
"""


def _child(tree: Path, path: str, n: int, batch: int, verify: bool) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    p = subprocess.run([sys.executable, "-c", CHILD, path, str(n), str(batch), "1" if verify else "0"],
                       env=env, capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before-tree", help="another checkout (e.g. a worktree of main before the chain)")
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    here = Path(__file__).resolve().parent.parent
    trees = {"this checkout": here, **({"before": Path(args.before_tree)} if args.before_tree else {})}
    layouts = {"rows (batches of 20)": 20, "segments (batches of 2,000)": 2000}
    per: dict[tuple[str, str], list[float]] = {}
    checks: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for layout, batch in layouts.items():
                for name, tree in trees.items():
                    path = str(Path(tmp) / f"{r}-{batch}-{name.replace(' ', '_')}.db")
                    got = _child(tree, path, args.events, batch, name == "this checkout")
                    per.setdefault((layout, name), []).append(got["append"] / args.events * 1e6)
                    for k in ("read", "verify"):
                        if k in got:
                            checks.setdefault(f"{k}, {layout}", []).append(got[k] / args.events * 1e6)
    print(f"SQLite append, CPU ms per 1,000 events (median of {args.rounds} rounds, {args.events} events):")
    for layout in layouts:
        mine = statistics.median(per[(layout, "this checkout")])
        line = f"  {layout:<30} this checkout {mine:7.2f}"
        if "before" in trees:
            before = statistics.median(per[(layout, "before")])
            line += f"   before {before:7.2f}   ratio {mine / before:.2f}x"
        print(line)
    print("this checkout: a plain read vs verify (read + the chain recomputed), CPU ms per 1,000 events:")
    for k, v in checks.items():
        print(f"  {k:<40} {statistics.median(v):7.2f}")


if __name__ == "__main__":
    main()
