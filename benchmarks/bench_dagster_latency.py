"""Request-to-start latency through Dagster (issue 19 §3): where a detached request's seconds go.

Starts the real ``dagster dev`` (webserver + daemon) on the example code location with
``example_project/dagster.yaml`` (QueuedRunCoordinator, the router sensor), records detached
requests of ``hello_dagster.yaml`` one after the other (``noetl-dagster run --runner dagster
--detach`` does the same) and splits each request's way to its run's start with the run's own
event log: request -> run enqueued (router sensor tick and evaluation) -> starting (run queue
and launcher) -> started (the run worker process booted and loaded the code).
Target: p50 request-to-start <= 3 s. The first request is a warm-up (code location load).

Run: ``python -m benchmarks.bench_dagster_latency [--requests N]`` or ``python -m benchmarks --only dagster_latency``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HELLO = REPO / "example_project" / "playbooks" / "hello_dagster.yaml"
TARGET_S = 3.0
STAGES = ("RUN_ENQUEUED", "RUN_STARTING", "RUN_START")  # Dagster 1.13 logs no RUN_DEQUEUED


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_run(instance, eid: str, timeout: float):
    import dagster as dg

    deadline = time.time() + timeout
    while time.time() < deadline:
        runs = instance.get_runs(dg.RunsFilter(tags={"noetl/execution_id": eid}))
        if runs and runs[0].status in (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE):
            return runs[0]
        time.sleep(0.2)
    raise RuntimeError(f"no finished run for execution {eid} in {timeout:.0f} s")


def _stages(instance, run) -> dict[str, float]:
    out: dict[str, float] = {}
    for rec in instance.all_logs(run.run_id):
        t = rec.dagster_event.event_type.name if rec.dagster_event else None  # the value is PIPELINE_*
        if t in STAGES and t not in out:
            out[t] = rec.timestamp
    return out


def measure(requests: int, timeout: float) -> list[dict[str, float]]:
    tmp = Path(tempfile.mkdtemp(prefix="bench_dagster_latency_"))
    home, noetl_home = tmp / "dagster_home", tmp / "noetl"
    home.mkdir()
    shutil.copy(REPO / "example_project" / "dagster.yaml", home / "dagster.yaml")
    os.environ["DAGSTER_HOME"], os.environ["NOETL_DAGSTER_HOME"] = str(home), str(noetl_home)
    port = _free_port()
    log = open(tmp / "dagster_dev.log", "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "dagster"), "dev", "-m", "example_project.definitions", "-h", "127.0.0.1", "-p", str(port)],
        cwd=tmp, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        import dagster as dg
        import httpx

        from noetl_dagster.translator.runner import run_playbook_dagster

        deadline = time.time() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError((tmp / "dagster_dev.log").read_text()[-2000:])
            try:
                if httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError("dagster dev did not answer in 180 s")
            time.sleep(0.5)
        instance = dg.DagsterInstance.get()
        rows = []
        for i in range(requests + 1):
            t0 = time.time()
            req = run_playbook_dagster(HELLO, {"name": f"r{i}"}, data_dir=noetl_home, tenant="demo", project="examples",
                                       detach=True)  # fmt: skip
            run = _wait_run(instance, req.execution_id, timeout)
            st = _stages(instance, run)
            if i == 0 or not all(s in st for s in STAGES):
                continue  # warm-up: the daemon's first tick loads the code location
            rows.append({"created": st["RUN_ENQUEUED"] - t0, "queued": st["RUN_STARTING"] - st["RUN_ENQUEUED"],
                         "boot": st["RUN_START"] - st["RUN_STARTING"], "total": st["RUN_START"] - t0})  # fmt: skip
        return rows
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        log.close()
        from noetl_dagster.resources.noetl import close_all_services

        close_all_services()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args(argv)
    rows = measure(args.requests, args.timeout)
    if not rows:
        print("no request completed")
        return
    print(f"request -> run start through dagster dev, {len(rows)} requests (load average {os.getloadavg()[0]:.2f})")
    print(f"  {'stage':<34} {'p50 s':>7} {'max s':>7}")
    labels = {"created": "request -> run enqueued (sensor)", "queued": "enqueued -> starting (queue, launch)",
              "boot": "starting -> started (run worker)",
              "total": "request -> run started"}  # fmt: skip
    for key, label in labels.items():
        vals = [r[key] for r in rows]
        print(f"  {label:<34} {statistics.median(vals):7.2f} {max(vals):7.2f}")
    p50 = statistics.median(r["total"] for r in rows)
    print(f"  p50 request-to-start {p50:.2f} s   target <= {TARGET_S:g} s: {'PASS' if p50 <= TARGET_S else 'MISS'}")


if __name__ == "__main__":
    main()
