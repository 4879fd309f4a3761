"""The sandboxed worker's per-task overhead (issue 41).

    python -m benchmarks.bench_sandbox_worker [--tasks N] [--repeat R]

A generated playbook whose one step runs ``--tasks`` tasks of one kind (duckdb ``SELECT 42``, rhai
``1 + 1``, python ``result = 1``), run in this process twice per round, interleaved: sandboxed (the
kinds run in the execution's worker process in bubblewrap, tools/sandbox_worker.py) and with the
operator's opt-out ``NOETL_GENERATED_ISOLATION=env-only`` (duckdb and rhai in the engine's own
process; python in a plain process per task, as generated python ran before the worker). Same
playbook, same trust gate, same store: the difference is the sandbox. Figures are the tasks'
``duration_ms`` from their ``task.done`` events, medians over the rounds: the first task (it starts
the worker) and the later ones, and the ratio sandboxed / unsandboxed for each; then the best later
task of all rounds on each side (the floor: on a loaded machine the median holds the wake-up of
another process, which an in-process call never waits for).

Exits 0; the figures are for docs/capacity.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

KINDS = {
    "duckdb": {"kind": "duckdb", "command": "SELECT 42 AS x"},
    "rhai": {"kind": "rhai", "code": "1 + 1"},
    "python": {"kind": "python", "code": "result = 1"},
}


def parent(kind: str, tasks: int) -> dict[str, Any]:
    tools = [{f"t{i}": dict(KINDS[kind])} for i in range(tasks)]
    child = {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "gen", "path": "generated/gen"},
             "workflow": [{"step": "start", "next": {"arcs": [{"step": "s"}]}}, {"step": "s", "tool": tools}]}  # fmt: skip
    return {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "bench", "path": "bench/sandbox"},
            "executor": {"spec": {"generated": {"allow_kinds": [kind], "allow_credentials": []}}},
            "workflow": [{"step": "start", "tool": [{"child": {"kind": "playbook", "definition": child}}]}]}  # fmt: skip


def one_run(kind: str, tasks: int, sandboxed: bool, tmp: Path) -> list[float]:
    """duration_ms of each task of the generated child, in order."""
    from noetl_dagster.dsl import load_playbook_dict
    from noetl_dagster.runners.local import run_playbook
    from noetl_dagster.storage.event_stores import open_event_store

    if sandboxed:
        os.environ.pop("NOETL_GENERATED_ISOLATION", None)
    else:
        os.environ["NOETL_GENERATED_ISOLATION"] = "env-only"
    try:
        home = Path(tempfile.mkdtemp(dir=tmp))
        url = f"sqlite:///{home / 'events.db'}"
        res = run_playbook(load_playbook_dict(parent(kind, tasks)), None, event_store=url, data_dir=home)
        if res.status != "completed":
            raise SystemExit(f"{kind} sandboxed={sandboxed}: {res.status} {res.results}")
        store = open_event_store(url)
        kid = next(se.event.execution_id for se in store.iter_all()
                   if se.event.name == "playbook.execution.requested" and se.event.parent_execution_id == res.execution_id)  # fmt: skip
        return [e.data["outcome"]["meta"]["duration_ms"] for e in store.read(kid) if e.name == "task.done"]
    finally:
        os.environ.pop("NOETL_GENERATED_ISOLATION", None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from noetl_dagster.tools import sandbox

    if not sandbox.available():
        print(f"bench_sandbox_worker: no OS sandbox here ({sandbox.unavailable_reason()}); skipped")
        return
    print(
        f"sandboxed worker vs unsandboxed, {args.tasks} tasks per execution, medians of {args.repeat} rounds"
    )
    print(f"{'kind':<8} {'first sandboxed':>16} {'first plain':>12} {'ratio':>7} {'later sandboxed':>16} "
          f"{'later plain':>12} {'ratio':>7} {'later +ms':>10} {'later best, sandboxed / plain':>30}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as t:
        tmp = Path(t)
        for kind in KINDS:
            first: dict[bool, list[float]] = {True: [], False: []}
            later: dict[bool, list[float]] = {True: [], False: []}
            floor: dict[bool, list[float]] = {True: [], False: []}
            for r in range(args.repeat):
                for sandboxed in (
                    (True, False) if r % 2 == 0 else (False, True)
                ):  # interleaved, order alternating
                    d = one_run(kind, args.tasks, sandboxed, tmp)
                    first[sandboxed].append(d[0])
                    later[sandboxed].append(statistics.median(d[1:]))
                    floor[sandboxed].append(min(d[1:]))
            f_on, f_off = statistics.median(first[True]), statistics.median(first[False])
            l_on, l_off = statistics.median(later[True]), statistics.median(later[False])
            m_on, m_off = min(floor[True]), min(floor[False])
            print(f"{kind:<8} {f_on:>13.1f} ms {f_off:>9.1f} ms {f_on / f_off:>6.1f}x {l_on:>13.2f} ms "
                  f"{l_off:>9.2f} ms {l_on / l_off:>6.2f}x {l_on - l_off:>+8.2f} {m_on:>8.2f} / {m_off:.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
