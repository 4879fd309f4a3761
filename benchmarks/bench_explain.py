"""Opening a big execution's page (issue 36): a ``--items`` (200,000) iteration loop.

One local run of a noop loop over ``--items`` items into a fresh SQLite event store (the store
keeps the execution's summary with each append), then ``dashboard serve``'s server (a real HTTP
server on 127.0.0.1, a registry API key) is asked:

0. server start: a NEW PROCESS starts a fresh server over the data directory, from spawn to
   listening (imports and set-up, the graph layout library included: ``make_server`` imports
   networkx before it listens); reported, not targeted (starting a server is not opening a page);
1. cold: the first open of the execution on that just-started server (nothing in memory, no
   cache of any kind): ``/executions/<id>`` + ``/api/execution``, timed from the first request;
2. warm: the same request again;
3. page: 1,000 iterations from the middle of the loop (``/api/execution/iterations``), cold
   (the first page request of another fresh process) and warm;
4. no summary: the execution's summary deleted (as for one recorded before summaries): a fresh
   process folds the whole log once (reported, not targeted) and writes the summary back;
   then another fresh process opens it from the summary again.

Target: 1-3 under 2 s. Run: ``python -m benchmarks.bench_explain [--items N]``. Always exits 0;
read PASS / MISS.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TARGET_S = 2.0

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: big_loop, path: bench/big_loop}
workflow:
  - step: start
    loop: {in: "{{ workload.items }}", iterator: i}
    tool: {kind: noop, result: "{{ iter.i }}"}
    next: {arcs: [{step: end}]}
  - step: end
    tool: {kind: noop}
"""


def _serve(data: str, registry: str) -> None:
    """The child: a fresh server over ``data``; prints its port, serves until killed."""
    t0 = time.perf_counter()
    from noetl_analytics.dashboard_access import KeyAuth
    from noetl_analytics.execution_view import ExecutionViews
    from noetl_analytics.interactive import make_server
    from noetl_analytics.store import FactsStore
    from noetl_dagster.storage.event_stores import open_event_store
    from noetl_registry.service import Registry

    views = ExecutionViews(open_event_store(None, data_dir=Path(data)), data_dir=data)
    t1 = time.perf_counter()
    from noetl_analytics.execution_view import preload_layout

    preload_layout()  # what make_server does first; timed here apart (make_server's is then a no-op)
    t2 = time.perf_counter()
    server = make_server(FactsStore(f"chdb://{Path(data) / 'facts'}"), port=0, auth=KeyAuth(Registry(registry)),
                         executions=views)  # fmt: skip
    print(f"PORT {server.server_address[1]} {time.perf_counter() - t0:.3f} {t2 - t1:.3f}", flush=True)
    server.serve_forever()


class Fresh:
    """A fresh server in a new process (``with``: started, then killed)."""

    def __init__(self, data: Path, registry: str):
        self.cmd = [
            sys.executable,
            "-m",
            "benchmarks.bench_explain",
            "--serve",
            str(data),
            "--registry",
            registry,
        ]

    def __enter__(self) -> Fresh:
        t = time.perf_counter()
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1]
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("PORT "):
            raise RuntimeError(f"the server did not start: {line!r}")
        _, port, ready, lay = line.split()
        self.url, self.ready, self.startup = f"http://127.0.0.1:{port}", float(ready), time.perf_counter() - t
        self.layout = float(lay)
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()


def _timed(fn: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=200_000)
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--registry", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        _serve(args.serve, args.registry)
        return 0
    import httpx

    from noetl_dagster.runners.local import run_playbook
    from noetl_dagster.storage.events import SqliteEventStore
    from noetl_registry.service import Registry

    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "noetl"
        pb = Path(d) / "big_loop.yaml"
        pb.write_text(PLAYBOOK)
        data.mkdir(parents=True)
        registry = f"sqlite:///{Path(d) / 'registry.db'}"
        reg = Registry(registry)
        _, key = reg.create_api_key("default")
        reg.close()
        auth = {"Authorization": f"Bearer {key}"}

        def get(url: str, path: str, **params: Any) -> Any:
            r = httpx.get(url + path, params=params, headers=auth, timeout=900)
            r.raise_for_status()
            return r

        def page_open(url: str) -> Any:
            return (get(url, f"/executions/{eid}"), get(url, "/api/execution", id=eid))[1]

        rows: list[tuple[str, float, float | None]] = []
        took, res = _timed(lambda: run_playbook(pb, {"items": list(range(args.items))}, data_dir=data))
        eid = res.execution_id
        print(f"run: {args.items:,} iterations in {took:.1f} s ({res.status})")
        store = SqliteEventStore(data / "events.db")
        last, srows = store.summary(eid) or (0, [])
        print(f"summary: {len(srows)} rows, {sum(len(b) for _, b in srows):,} bytes, at sequence {last:,}")
        mid = args.items // 2
        with Fresh(data, registry) as srv:
            t, r = _timed(lambda: page_open(srv.url))
            events = r.json()["execution"]["events"]
            rid = r.json()["runs"][0]["step_run_id"]
            rows.append(("server start: new process, spawn to listening", srv.startup, None))
            rows.append(("cold: first open (page + /api/execution), just-started server", t, TARGET_S))
            t, _ = _timed(lambda: page_open(srv.url))
            rows.append(("warm: the same again", t, TARGET_S))
            t, p = _timed(
                lambda: get(srv.url, "/api/execution/iterations", id=eid, run=rid, offset=mid, limit=1000)
            )
            assert [i["index"] for i in p.json()["iterations"]][:1] == [mid]
            rows.append(("page: 1,000 iterations from the middle", t, TARGET_S))
            print(
                f"server process: ready {srv.startup:.2f} s after spawn ({srv.ready:.2f} s of imports and set-up, "
                f"{srv.layout:.2f} s of it the layout library)"
            )
        with Fresh(data, registry) as srv:
            t, _ = _timed(
                lambda: get(srv.url, "/api/execution/iterations", id=eid, run=rid, offset=mid, limit=1000)
            )
            rows.append(("cold page: 1,000 iterations, new process (its first request)", t, TARGET_S))
        with sqlite3.connect(data / "events.db") as c:
            c.execute("DELETE FROM noetl_explain WHERE execution_id = ?", (eid,))
        with Fresh(data, registry) as srv:
            t, _ = _timed(lambda: page_open(srv.url))
            rows.append(("no summary (recorded before summaries): fold of the log", t, None))
        with Fresh(data, registry) as srv:
            t, _ = _timed(lambda: page_open(srv.url))
            rows.append(("cold again: the summary written back by that fold", t, TARGET_S))
        store.close()
    print(
        f"events in the log: {events:,}; iterations page JSON {len(p.content):,} bytes for 1,000 iterations"
    )
    for name, t, target in rows:
        verdict = "" if target is None else ("PASS" if t < target else "MISS")
        print(f"  {name:<62} {t:8.3f} s  {verdict}")
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
