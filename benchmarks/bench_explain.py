"""Opening a big execution's page (issue 36): a ``--items`` (200,000) iteration loop.

One local run of a noop loop over ``--items`` items into a fresh SQLite event store, then
``dashboard serve``'s server (a real HTTP server on 127.0.0.1, a registry API key) is asked:

1. live: the server ran while the execution did (its follower folded the events as they were
   appended): ``/executions/<id>`` + ``/api/execution`` once the run is over;
2. open: a new server over the same data directory (a restart): the same, from the explain
   cache (``explain_cache.db``) the first server wrote;
3. warm: the same request again (memory);
4. page: 1,000 iterations from the middle of the loop (``/api/execution/iterations``);
5. cold: a server with neither (no cache, did not follow): it folds the whole log (every event
   decoded and priced) at the first request.

Target: 1-4 under 2 s. The cold fold is O(events) and is reported, not targeted.
Run: ``python -m benchmarks.bench_explain [--items N]``. Always exits 0; read PASS / MISS.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
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


def _server(data: Path, reg: Any, *, cache: bool = True, follow: threading.Event | None = None) -> tuple[Any, str, Any]:
    from analytics.dashboard_access import KeyAuth
    from analytics.execution_view import ExecutionViews, default_cache
    from analytics.interactive import make_server
    from analytics.store import FactsStore
    from noetl_dagster.storage.event_stores import open_event_store

    views = ExecutionViews(open_event_store(None, data_dir=data), data_dir=str(data),
                           cache=default_cache(str(data)) if cache else None)  # fmt: skip
    if follow is not None:  # as `dashboard serve` does
        views.follow_once()
        threading.Thread(target=views.follow, args=(follow,), daemon=True).start()
    server = make_server(FactsStore(f"chdb://{data / 'facts'}"), port=0, auth=KeyAuth(reg), executions=views)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}", views


def _timed(fn: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main(argv: list[str] | None = None) -> int:
    import httpx

    from noetl_dagster.runners.local import run_playbook
    from registry_service.service import Registry

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=200_000)
    args = ap.parse_args(argv)
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "noetl"
        pb = Path(d) / "big_loop.yaml"
        pb.write_text(PLAYBOOK)
        data.mkdir(parents=True)
        reg = Registry(f"sqlite:///{Path(d) / 'registry.db'}")
        _, key = reg.create_api_key("default")
        auth = {"Authorization": f"Bearer {key}"}

        def get(url: str, path: str, **params: Any) -> Any:
            r = httpx.get(url + path, params=params, headers=auth, timeout=900)
            r.raise_for_status()
            return r

        def page_open(url: str) -> Any:
            return (get(url, f"/executions/{eid}"), get(url, "/api/execution", id=eid))[1]

        rows = []
        stop = threading.Event()
        server, url, views = _server(data, reg, follow=stop)
        took, res = _timed(lambda: run_playbook(pb, {"items": list(range(args.items))}, data_dir=data))
        eid = res.execution_id
        print(f"run: {args.items:,} iterations in {took:.1f} s ({res.status})")
        t_catch = time.perf_counter()
        while views.cursor < views.store.tail_last():  # the follower is still folding the last batches
            time.sleep(0.05)
        print(f"the follower caught up {time.perf_counter() - t_catch:.2f} s after the run ended")
        t, r = _timed(lambda: page_open(url))
        events = r.json()["execution"]["events"]
        rows.append(("live: page + /api/execution, server followed the run", t, TARGET_S))
        stop.set()
        server.shutdown()
        server.server_close()
        server, url, _ = _server(data, reg)  # a restarted server: the cache on disk
        t, r = _timed(lambda: page_open(url))
        rows.append(("open: page + /api/execution, new server (explain cache)", t, TARGET_S))
        t, _ = _timed(lambda: get(url, "/api/execution", id=eid))
        rows.append(("warm: /api/execution again (memory)", t, TARGET_S))
        loop = r.json()["runs"][0]
        mid = args.items // 2
        t, r = _timed(lambda: get(url, "/api/execution/iterations", id=eid, run=loop["step_run_id"], offset=mid, limit=1000))
        assert [i["index"] for i in r.json()["iterations"]][:1] == [mid]
        rows.append(("page: 1,000 iterations from the middle", t, TARGET_S))
        server.shutdown()
        server.server_close()
        server, url, _ = _server(data, reg, cache=False)
        t, _ = _timed(lambda: get(url, "/api/execution", id=eid))
        rows.append(("cold: /api/execution, no cache, not followed (fold of the log)", t, None))
        server.shutdown()
        server.server_close()
        reg.close()
    print(f"events in the log: {events:,}; page JSON {len(r.content):,} bytes for 1,000 iterations")
    for name, t, target in rows:
        verdict = "" if target is None else ("PASS" if t < target else "MISS")
        print(f"  {name:<58} {t:8.3f} s  {verdict}")
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
