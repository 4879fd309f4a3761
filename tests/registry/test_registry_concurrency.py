"""8 writers, each with its own connection, registering versions of one resource at once."""

from __future__ import annotations

import threading
import uuid

from registry_service.models import Principal
from registry_service.service import Registry
from registry_service.store import open_store

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
        from registry_service.models import LocationIn, RegisterRequest

        reg = registries[i]
        mine = []
        try:
            barrier.wait()
            for j in range(VERSIONS_EACH):
                r = reg.register(owner, RegisterRequest(uri=series, locations=[LocationIn(uri=f"file:///w{i}/v{j}")]))
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
