"""The Dagster runner's platform line against the local runner's (issue 43 item 4), in one process.

The same three-step playbook runs through ``run_playbook`` (local) and ``run_playbook_dagster``
(``execute_in_process`` on one ephemeral instance, opened as the CLI opens it), interleaved round by round after a warm-up. Per
execution, CPU seconds of the process (``time.process_time``):

* ``spent``: the whole call;
* ``platform``: the execution's platform line (``workflow.finished`` ``platform.cpu_s``);
* ``tasks``: its task attempts' ``cpu_s``;
* ``teardown``: spent - platform - tasks: the CPU after the window closed at ``workflow.finished``
  (the finishing op's pricing, cost summary and tags, Dagster's step and run success events, the
  runner reading the log back), which no line holds.

Ratios: Dagster / local platform line, teardown / spent of the Dagster runner, and the Dagster
runner on the instance the CLI opens (``open_instance``: one event-log connection) / on Dagster's plain
ephemeral instance (``dagster_plain``), interleaved. ``--cli`` also
runs ``noetl-dagster run [--runner dagster]`` as processes (each charged from process start, as a
user's command is) and compares their platform lines.

Run: ``python -m benchmarks.bench_platform_line [--rounds 10] [--cli 3]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: platform_line, path: bench/platform_line}
workflow:
  - step: start
    tool: {kind: python, code: "result = sum(i * i for i in range(20000))"}
    next: {arcs: [{step: mid}]}
  - step: mid
    tool: {kind: python, code: "result = 1"}
    next: {arcs: [{step: end}]}
  - step: end
    tool: {kind: noop}
"""


def _lines(data: Path, execution_id: str) -> tuple[float, float]:
    """(platform cpu_s, tasks cpu_s) of the execution's log."""
    from noetl_dagster.storage.event_stores import open_event_store

    log = open_event_store(None, data_dir=data)
    try:
        events = log.read(execution_id)
    finally:
        log.close()
    fin = next(e for e in events if e.name == "workflow.finished")
    tasks = sum(
        (e.data["outcome"].get("meta") or {}).get("usage", {}).get("cpu_s", 0.0)
        for e in events
        if e.name == "task.done"
    )
    return float((fin.data.get("platform") or {}).get("cpu_s", 0.0)), float(tasks)


def in_process(rounds: int, data: Path, pb: Path) -> dict[str, dict[str, float]]:
    import dagster as dg

    from noetl_dagster.runners.local import run_playbook
    from noetl_dagster.translator.runner import open_instance, run_playbook_dagster

    os.environ.pop("DAGSTER_HOME", None)
    instance = open_instance()  # the instance `run --runner dagster` opens: ephemeral, one event connection
    plain = dg.DagsterInstance.ephemeral()  # Dagster's: a connection per event write

    def one(runner: str) -> tuple[float, float, float]:
        cpu = time.process_time()
        if runner.startswith("dagster"):
            res = run_playbook_dagster(
                pb, data_dir=data, instance=plain if runner == "dagster_plain" else instance
            )
        else:
            res = run_playbook(pb, data_dir=data)
        spent = time.process_time() - cpu
        assert res.status == "completed", res.results
        return (spent, *_lines(data, res.execution_id))

    runners = ("local", "dagster", "dagster_plain")
    for _ in range(2):  # warm-up: imports, first compile, the instance's tables
        for runner in runners:
            one(runner)
    got: dict[str, list[tuple[float, float, float]]] = {r: [] for r in runners}
    for _ in range(rounds):
        for runner in runners:
            got[runner].append(one(runner))
    out = {}
    for runner, rows in got.items():
        spent, platform, tasks = (statistics.median(r[i] for r in rows) for i in range(3))
        out[runner] = {"spent": spent, "platform": platform, "tasks": tasks,
                       "teardown": max(0.0, spent - platform - tasks)}  # fmt: skip
    return out


def cli(rounds: int, data: Path, pb: Path) -> dict[str, float]:
    """Median platform line of ``noetl-dagster run --json`` processes, per runner."""
    import json

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "NOETL_DAGSTER_HOME": str(data)}
    env["PYTHONPATH"] = os.pathsep.join(
        str(root / p) for p in ("", "analytics", "lineage", "registry_service")
    )
    env.pop("DAGSTER_HOME", None)
    out: dict[str, list[float]] = {"local": [], "dagster": []}
    for _ in range(rounds):
        for runner in out:
            proc = subprocess.run(
                [sys.executable, "-m", "noetl_dagster.commands.main", "run", str(pb), "--json", "--runner", runner],
                capture_output=True, text=True, env=env, check=True,
            )  # fmt: skip
            out[runner].append(_lines(data, json.loads(proc.stdout)["execution_id"])[0])
    return {k: statistics.median(v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--cli", type=int, default=0, help="rounds of CLI processes per runner (0: none)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        pb = Path(tmp) / "platform_line.yaml"
        pb.write_text(PLAYBOOK)
        got = in_process(args.rounds, data, pb)
        for runner, m in got.items():
            print(f"{runner:8s} spent {m['spent'] * 1e3:7.2f} ms  platform {m['platform'] * 1e3:7.2f} ms  "
                  f"tasks {m['tasks'] * 1e3:6.2f} ms  teardown {m['teardown'] * 1e3:6.2f} ms")  # fmt: skip
        d, loc = got["dagster"], got["local"]
        ratios = {
            "platform_dagster_over_local": d["platform"] / loc["platform"],
            "teardown_share_dagster": d["teardown"] / d["spent"],
            "dagster_one_connection_over_plain": d["spent"] / got["dagster_plain"]["spent"],
        }
        print(f"platform line Dagster / local: {ratios['platform_dagster_over_local']:.1f}x; "
              f"Dagster teardown (in no line): {ratios['teardown_share_dagster']:.1%} of its CPU")  # fmt: skip
        print(f"Dagster runner on the CLI's instance / on a plain ephemeral one: "
              f"{ratios['dagster_one_connection_over_plain']:.2f}x CPU")  # fmt: skip
        if args.cli:
            c = cli(args.cli, data, pb)
            ratios["cli_platform_dagster_over_local"] = c["dagster"] / c["local"]
            print(f"CLI processes: platform line local {c['local']:.3f} s, Dagster {c['dagster']:.3f} s "
                  f"({ratios['cli_platform_dagster_over_local']:.1f}x)")  # fmt: skip
    return ratios


if __name__ == "__main__":
    main()
