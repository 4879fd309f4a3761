"""Parallel loop scheduling (issue 19.1): parallel vs sequential, before and after the lane rule.

Three loops, each run sequential and parallel (max_in_flight 16) by the local runner
against a fresh embedded SQLite event store, in this one process, interleaved and
best of ``--repeat``:

1. CPU-bound: ``--cpu`` iterations of a python task ``result = x * 2`` (all GIL).
   Target: parallel <= 1.05x sequential.
2. I/O-bound, sleep: ``--io`` iterations of a python task that sleeps ``--latency-ms``.
3. I/O-bound, HTTP: ``--io`` ``http`` GETs against a real local server (stdlib
   ThreadingHTTPServer in its own process) that answers after ``--latency-ms``.
   Target for 2 and 3: parallel much faster than sequential (>= 4x).

"before" is the scheduler this replaced, reproduced here verbatim (``max_in_flight``
threads pulling every index from the start: ``frame.run_bounded``), patched in for
its runs only, so both figures come from the same process and the same minute.
The "after" runs also print the schedule the rule chose (lanes started, GIL share).

Run: ``python -m benchmarks.bench_loops [--cpu N] [--io N]`` or
``python -m benchmarks --only loops``. Always exits 0; read PASS / MISS.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

CPU_TARGET = 1.05
IO_TARGET = 4.0
MIF = 16

_SCHEDULES: list[dict[str, Any]] = []


def _server_main(port: int, latency: float) -> None:
    import http.server

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802
            time.sleep(latency)
            body = b'{"ok":true}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
    srv.daemon_threads = True
    srv.serve_forever()


def LatencyServer(latency: float):  # noqa: N802 - reads as the class it returns
    """A real HTTP server in its own process that answers every GET after ``latency`` seconds."""
    from benchmarks.bench_tools import LoopbackServer

    return LoopbackServer(_server_main, (latency,))


def _playbook(tool: dict[str, Any], n: int, mode: str):
    from noetl_dagster.dsl import load_playbook_dict

    return load_playbook_dict({
        "apiVersion": "noetl.io/v2", "kind": "Playbook",
        "metadata": {"name": f"bench_loops_{mode}", "path": f"bench/loops_{mode}"},
        "workflow": [{
            "step": "start",
            "loop": {"in": f"{{{{ range({n}) | list }}}}", "iterator": "x", "spec": {"mode": mode, "max_in_flight": MIF}},
            "tool": tool,
        }],
    })  # fmt: skip


def _legacy_run_parallel(self, lr, body) -> None:  # noqa: ANN001 - the scheduler before the lane rule, verbatim
    from noetl_dagster.engine.frame import run_bounded

    run_bounded(lr.total, min(lr.max_in_flight, lr.total), lambda i: self.loop_iteration(lr, i, body),
                name=f"noetl-{lr.frame.step.name}")  # fmt: skip


def _run(pb, work: Path, scheduler: str) -> tuple[float, float]:
    from noetl_dagster.engine.loops import LoopPhases
    from noetl_dagster.runners.local import build_services, run_playbook

    current = LoopPhases._run_parallel
    if scheduler == "before":
        LoopPhases._run_parallel = _legacy_run_parallel  # type: ignore[method-assign]
    elif scheduler == "after":

        def spy(self, lr, body):  # noqa: ANN001
            current(self, lr, body)
            _SCHEDULES.append(dict(getattr(lr, "schedule", {}) or {}))

        LoopPhases._run_parallel = spy  # type: ignore[method-assign]
    services = build_services(data_dir=work, logger=lambda _m: None)
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        res = run_playbook(pb, services=services)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        LoopPhases._run_parallel = current  # type: ignore[method-assign]
        services.event_store.close()
    stats = res.results["start"]["stats"]
    if res.status != "completed" or stats["failed"]:
        raise RuntimeError(f"loop run failed: {res.status} {stats}")
    if os.environ.get("NOETL_BENCH_VERBOSE"):
        print(f"    {scheduler:10s} {wall:8.3f} s wall {cpu:8.3f} s cpu", flush=True)
    return wall, cpu


def compare(name: str, tool: dict[str, Any], n: int, repeat: int, tmp: Path) -> dict[str, Any]:
    seq, par = _playbook(tool, n, "sequential"), _playbook(tool, n, "parallel")
    _run(_playbook(tool, min(n, 20), "parallel"), tmp / f"{name}-warm", "after")  # imports, template cache
    labels = ("sequential", "before", "after")
    walls: dict[str, list[float]] = {k: [] for k in labels}
    cpus: dict[str, list[float]] = {k: [] for k in labels}
    _SCHEDULES.clear()
    for r in range(repeat):
        for label in labels:  # interleaved: load drifts hit all three alike
            wall, cpu = _run(seq if label == "sequential" else par, tmp / f"{name}-{label}-{r}", label)
            walls[label].append(wall)
            cpus[label].append(cpu)
    sched = _SCHEDULES[-1] if _SCHEDULES else {}
    out: dict[str, Any] = {"name": name, "n": n, "repeat": repeat, "schedule": sched}
    for k in ("before", "after"):  # per round, against the sequential run next to it
        out[f"{k}_paired"] = statistics.median(
            x / s for x, s in zip(walls[k], walls["sequential"], strict=True)
        )
        out[f"{k}_cpu_paired"] = statistics.median(
            x / s for x, s in zip(cpus[k], cpus["sequential"], strict=True)
        )
    for k in labels:
        out[k], out[f"{k}_cpu"] = min(walls[k]), min(cpus[k])
        out[f"{k}_med"], out[f"{k}_cpu_med"] = statistics.median(walls[k]), statistics.median(cpus[k])
    return out


def report(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        cpu = row["name"] == "cpu"
        print(
            f"== {row['name']}: {row['n']:,} iterations, max_in_flight {MIF}, {row['repeat']} interleaved rounds =="
        )
        for stat, suffix in (("best", ""), ("median", "_med")):
            s, b, a = row["sequential" + suffix], row["before" + suffix], row["after" + suffix]
            sc, bc, ac = row["sequential_cpu" + suffix], row["before_cpu" + suffix], row["after_cpu" + suffix]
            print(f"  [{stat}] sequential      : {s:8.3f} s wall {sc:8.3f} s cpu")
            print(f"  [{stat}] parallel before : {b:8.3f} s wall {bc:8.3f} s cpu   "
                  f"parallel/sequential {b / s:6.3f}x wall {bc / sc:6.3f}x cpu")  # fmt: skip
            print(f"  [{stat}] parallel after  : {a:8.3f} s wall {ac:8.3f} s cpu   "
                  f"parallel/sequential {a / s:6.3f}x wall {ac / sc:6.3f}x cpu")  # fmt: skip
        for k in ("before", "after"):
            print(f"  [median of per-round ratios] parallel {k}/sequential: "
                  f"{row[k + '_paired']:6.3f}x wall {row[k + '_cpu_paired']:6.3f}x cpu")  # fmt: skip
        print(f"  schedule after      : {row['schedule']}")
        s, a = row["sequential"], row["after"]
        if cpu:
            print(
                f"  target parallel <= {CPU_TARGET:g}x sequential (best wall): {'PASS' if a / s <= CPU_TARGET else 'MISS'}"
            )
        else:
            print(
                f"  target parallel speedup >= {IO_TARGET:g}x (best wall): {'PASS' if s / a >= IO_TARGET else 'MISS'}"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", type=int, default=10_000, help="iterations of the CPU-bound loop")
    ap.add_argument("--io", type=int, default=300, help="iterations of each I/O-bound loop")
    ap.add_argument("--latency-ms", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=["cpu", "sleep", "http"], action="append", default=[])
    args = ap.parse_args(argv)
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    lat = args.latency_ms / 1000
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if not args.only or "cpu" in args.only:
            rows.append(compare("cpu", {"kind": "python", "input": {"x": "{{ iter.x }}"}, "code": "result = x * 2"},
                                args.cpu, args.repeat, tmp))  # fmt: skip
        if not args.only or "sleep" in args.only:
            code = f"import time\ntime.sleep({lat})\nresult = x"
            rows.append(compare("sleep", {"kind": "python", "input": {"x": "{{ iter.x }}"}, "code": code},
                                args.io, max(1, args.repeat - 1), tmp))  # fmt: skip
        if not args.only or "http" in args.only:
            server = LatencyServer(lat)
            try:
                tool = {"kind": "http", "url": server.url, "params": {"i": "{{ iter.x }}"}}
                rows.append(compare("http", tool, args.io, max(1, args.repeat - 1), tmp))
            finally:
                server.close()
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    report(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
