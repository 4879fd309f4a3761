"""8 writers, each with its own connection, registering versions of one resource at once."""

from __future__ import annotations

import threading
import uuid

import pytest

from noetl_registry.models import Principal
from noetl_registry.service import Registry
from noetl_registry.store import open_store

WRITERS = 8
VERSIONS_EACH = 6


def test_concurrent_writers_get_distinct_ordered_versions_and_lose_no_location(db_url):
    tenant = f"tc{uuid.uuid4().hex[:8]}"
    series = f"noetl://{tenant}/lab/hot/dataset/table"
    owner = Principal(tenant=tenant, project="lab")
    registries = [Registry(db_url) for _ in range(WRITERS)]  # separate connections / pools
    barrier = threading.Barrier(WRITERS)
    results: dict[int, list[tuple[int, str, str]]] = {}
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        from noetl_registry.models import LocationIn, RegisterRequest

        reg = registries[i]
        mine = []
        try:
            barrier.wait()
            for j in range(VERSIONS_EACH):
                r = reg.register(
                    owner, RegisterRequest(uri=series, locations=[LocationIn(uri=f"file:///w{i}/v{j}")])
                )
                # a replica added right away, concurrently with the other writers' registrations
                reg.add_location(owner, r.resource_id, LocationIn(uri=f"s3://replica/w{i}/v{j}"))
                mine.append((r.seq, r.version, r.resource_id))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        results[i] = mine

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    total = WRITERS * VERSIONS_EACH
    seqs = sorted(s for rows in results.values() for s, _, _ in rows)
    assert seqs == list(range(1, total + 1))  # distinct, gap-free
    for rows in results.values():
        assert [s for s, _, _ in rows] == sorted(s for s, _, _ in rows)  # each writer sees its own increase
        assert all(v == f"v{s}" for s, v, _ in rows)

    check = Registry(open_store(db_url))
    listed = check.list_resources(owner, tenant=tenant, limit=1000)
    assert [r.seq for r in listed] == list(range(1, total + 1))
    for r in listed:
        assert len(r.locations) == 2 and {lc.role for lc in r.locations} == {"primary", "replica"}
    assert check.resolve(owner, series).version == f"v{total}"
    events = check.events(owner, limit=1000).events
    assert len(events) == 2 * total  # one registered + one replica_available each, none lost
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    for reg in [*registries, check]:
        reg.close()


PROCESSES = 4
THREADS_PER_PROCESS = 2
PROCESS_VERSIONS = 5

_WORKER = r"""
import json, sys, threading
from noetl_registry.models import LocationIn, Principal, RegisterRequest
from noetl_registry.service import Registry

db, tenant, w, threads, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
series = f"noetl://{tenant}/lab/hot/dataset/table"
owner = Principal(tenant=tenant, project="lab")
reg = Registry(db)
go = threading.Barrier(threads)
out, errors = [], []

def run(t):
    go.wait()
    try:
        for j in range(n):
            r = reg.register(owner, RegisterRequest(uri=series, locations=[LocationIn(uri=f"file:///p{w}/t{t}/v{j}")]))
            reg.add_location(owner, r.resource_id, LocationIn(uri=f"s3://replica/p{w}/t{t}/v{j}"))
            out.append(r.seq)
    except BaseException as e:
        errors.append(repr(e))

ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
[t.start() for t in ts]
[t.join() for t in ts]
print(json.dumps({"seqs": out, "errors": errors}))
"""


@pytest.mark.slow
def test_concurrent_writer_processes_on_postgres_lose_nothing(pg_registry_url):
    """Several processes (each with two threads and its own pool) add versions and replicas
    to one series on the Postgres server: no lost version or location, no duplicate number."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    tenant = f"tp{uuid.uuid4().hex[:8]}"
    Registry(pg_registry_url).close()  # migrate once up front
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _WORKER,
                pg_registry_url,
                tenant,
                str(w),
                str(THREADS_PER_PROCESS),
                str(PROCESS_VERSIONS),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for w in range(PROCESSES)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(not r["errors"] for r in results), [r["errors"] for r in results]
    total = PROCESSES * THREADS_PER_PROCESS * PROCESS_VERSIONS
    seqs = sorted(s for r in results for s in r["seqs"])
    assert seqs == list(range(1, total + 1))  # no duplicate, none lost
    owner = Principal(tenant=tenant, project="lab")
    check = Registry(pg_registry_url)
    listed = check.list_resources(owner, tenant=tenant, limit=1000)
    assert [r.version for r in listed] == [f"v{i}" for i in range(1, total + 1)]
    uris = {lc.uri for r in listed for lc in r.locations}
    assert len(uris) == 2 * total  # every primary and every replica
    assert all(sorted(lc.role for lc in r.locations) == ["primary", "replica"] for r in listed)
    with check.store.read() as tx:
        dupes = tx.one(
            "SELECT COUNT(*) - COUNT(DISTINCT version) FROM registry_resource WHERE tenant_id = ?", (tenant,)
        )
    assert dupes[0] == 0
    assert len(check.events(owner, limit=1000).events) == 2 * total
    print(
        f"postgres concurrent writers: {PROCESSES} processes x {THREADS_PER_PROCESS} threads, {total} versions,"
        f" {len(uris)} locations, 0 lost, 0 duplicate"
    )
    check.close()
