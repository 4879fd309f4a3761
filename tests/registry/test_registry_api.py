"""The registry contract, run on SQLite and Postgres, in-process and over HTTP."""

from __future__ import annotations

import pytest

from noetl_registry.errors import Conflict, InvalidRequest, NotFound


def test_register_assigns_ordered_versions_and_resolves_latest(connect, tenants):
    ta, _ = tenants
    a = connect(ta, "lab")
    series = f"noetl://{ta}/lab/sales/dataset/orders"
    r1 = a.register(
        series,
        locations=[
            {
                "uri": "file:///data/o1.parquet",
                "checksum": checksum("1"),
                "size_bytes": 10,
                "format": "parquet",
                "rows": 3,
            }
        ],
        metadata={"owner": "sales"},
    )
    r2 = a.register(series, locations=[{"uri": "file:///data/o2.parquet", "checksum": checksum("2")}])
    assert (r1.version, r1.seq, r2.version, r2.seq) == ("v1", 1, "v2", 2)
    assert r1.uri == f"{series}@v1" and r1.urn == f"urn:noetl:{ta}:lab:sales:dataset:orders:v1"
    assert r1.kind == "dataset" and r1.metadata == {"owner": "sales"}
    assert r1.locations[0].role == "primary" and r1.locations[0].storage_type == "file"
    assert r1.home_shard.startswith("s") and r1.locations[0].shard == r1.home_shard
    latest = a.resolve(series)
    assert latest.allowed and latest.version == "v2" and latest.expected_checksum == checksum("2")
    assert a.resolve(f"{series}@latest").resource_id == r2.resource_id
    plan = a.resolve(r1.urn)  # the URN names the same record
    assert plan.resource_id == r1.resource_id and plan.location.uri == "file:///data/o1.parquet"
    assert (plan.size_bytes, plan.format, plan.rows) == (10, "parquet", 3)
    assert a.get(r1.resource_id).uri == r1.uri


def test_explicit_versions_are_unique_and_reregistering_is_idempotent(connect, tenants):
    ta, _ = tenants
    a = connect(ta)
    uri = f"noetl://{ta}/lab/models/model/fraud@2026-05-29"
    loc = {"uri": "s3://models/fraud.bin", "checksum": checksum("f")}
    first = a.register(uri, locations=[loc])
    assert first.version == "2026-05-29"
    again = a.register(uri, locations=[loc])  # a retried write
    assert again.resource_id == first.resource_id
    with pytest.raises(Conflict):
        a.register(uri, locations=[{"uri": "s3://models/other.bin", "checksum": checksum("0")}])
    with pytest.raises(InvalidRequest):
        a.register(f"noetl://{ta}/lab/models/model/fraud@latest")


def test_add_location_primary_and_replica_and_region_choice(connect, tenants):
    ta, _ = tenants
    a = connect(ta, "lab")
    r = a.register(
        f"noetl://{ta}/lab/ns/dataset/t",
        locations=[{"uri": "s3://usw2/t.parquet", "region": "usw2", "checksum": checksum("1")}],
    )
    rep = a.add_location(
        r.resource_id, {"uri": "gs://use1/t.parquet", "region": "use1", "checksum": checksum("1")}
    )
    assert rep.role == "replica"
    with pytest.raises(InvalidRequest):
        a.add_location(r.resource_id, {"uri": "s3://x/y", "role": "primary"})
    assert a.resolve(r.uri).location.uri == "s3://usw2/t.parquet"  # primary by default
    assert a.resolve(r.uri, region="use1").location.uri == "gs://use1/t.parquet"  # nearest copy
    assert {lc.uri for lc in a.get(r.resource_id).locations} == {"s3://usw2/t.parquet", "gs://use1/t.parquet"}
    with pytest.raises(NotFound):
        a.add_location("res_missing", {"uri": "s3://x/y"})


def test_lineage_up_and_down(connect, tenants):
    ta, _ = tenants
    a = connect(ta, "lab")
    raw = a.register(f"noetl://{ta}/lab/raw/dataset/events", locations=[{"uri": "file:///r"}])
    clean = a.register(
        f"noetl://{ta}/lab/clean/dataset/events",
        inputs=[raw.uri],
        execution_id="exec_1",
        step="clean",
        locations=[{"uri": "file:///c"}],
    )
    report = a.register(
        f"noetl://{ta}/lab/reports/result/daily",
        inputs=[f"noetl://{ta}/lab/clean/dataset/events"],
        locations=[{"uri": "file:///d"}],
    )
    up = a.lineage(report.resource_id, "up", depth=5)
    assert [(e.resource.uri, e.depth) for e in up.edges] == [(clean.uri, 1), (raw.uri, 2)]
    assert a.lineage(report.resource_id, "up").edges[0].resource.resource_id == clean.resource_id  # depth 1
    down = a.lineage(raw.resource_id, "down", depth=3)
    assert [e.resource.uri for e in down.edges] == [clean.uri, report.uri]
    assert down.edges[0].execution_id == "exec_1" and down.edges[0].step == "clean"
    with pytest.raises(NotFound):
        a.register(f"noetl://{ta}/lab/x/dataset/y", inputs=[f"noetl://{ta}/lab/nope/dataset/missing"])


def test_list_and_search(connect, tenants):
    ta, _ = tenants
    a = connect(ta)
    for name in ("alpha_orders", "beta_orders", "gamma_users"):
        a.register(f"noetl://{ta}/lab/sales/dataset/{name}", locations=[{"uri": f"file:///{name}"}])
    a.register(f"noetl://{ta}/lab/sales/dataset/alpha_orders", locations=[{"uri": "file:///alpha2"}])
    a.register(f"noetl://{ta}/other/sales/result/beta_orders", locations=[{"uri": "file:///o"}])
    assert len(a.list(tenant=ta)) == 5
    assert [r.name for r in a.list(q="orders", project="lab", latest=True)] == ["alpha_orders", "beta_orders"]
    assert {r.version for r in a.list(q="alpha")} == {"v1", "v2"}
    assert [r.project for r in a.list(type="result")] == ["other"]
    assert a.list(q="%") == [] and a.list(q="alph_") == []  # LIKE wildcards are literal
    assert len(a.list(tenant=ta, limit=2)) == 2 and len(a.list(tenant=ta, limit=2, offset=4)) == 1


def test_every_mutation_appends_a_catalog_event_in_order(connect, tenants):
    ta, _ = tenants
    a = connect(ta, "lab")
    start = a.events().next_after
    r = a.register(
        f"noetl://{ta}/lab/ns/dataset/e", locations=[{"uri": "file:///e", "checksum": checksum("e")}]
    )
    a.add_location(r.resource_id, {"uri": "s3://b/e"})
    g = a.grant(r.uri, f"tenant:{tenants[1]}")
    a.revoke(g.grant_id)
    page = a.events(after=start)
    names = [e.name for e in page.events]
    assert names == [
        "noetl.catalog.resource.registered",
        "noetl.catalog.resource.replica_available",
        "noetl.catalog.resource.grant_created",
        "noetl.catalog.resource.grant_revoked",
    ]
    seqs = [e.seq for e in page.events]
    assert seqs == sorted(seqs) and page.next_after == seqs[-1]
    assert page.events[0].uri == r.uri and page.events[0].data["locations"][0]["checksum"] == checksum("e")
    assert a.events(after=page.next_after).events == []
    assert [e.name for e in a.events(after=start, limit=2).events] == names[:2]


def test_grants_list_and_revoke(connect, tenants):
    ta, tb = tenants
    a = connect(ta, "lab")
    r = a.register(f"noetl://{ta}/lab/ns/dataset/g", locations=[{"uri": "file:///g"}])
    g1 = a.grant(r.series, f"tenant://{tb}", purpose="postprocessing")
    g2 = a.grant(r.uri, f"project:{tb}/x", permission="write")
    assert g1.subject == f"tenant:{tb}" and g1.resource_id is None and g1.active
    assert g2.subject == f"project:{tb}/x" and g2.resource_id == r.resource_id
    assert {g.grant_id for g in a.grants(r.series)} == {g1.grant_id, g2.grant_id}
    revoked = a.revoke(g1.grant_id)
    assert not revoked.active and revoked.revoked_at
    assert [g.grant_id for g in a.grants()] == [g2.grant_id]
    assert {g.grant_id for g in a.grants(include_inactive=True)} >= {g1.grant_id, g2.grant_id}
    with pytest.raises(InvalidRequest):
        a.grant(r.uri, "user:bob")
    with pytest.raises(NotFound):
        a.revoke("grt_missing")


def test_whoami(connect, tenants):
    ta, _ = tenants
    who = connect(ta, "lab").whoami()
    assert (who.tenant, who.project) == (ta, "lab") and who.key_id


def checksum(ch: str = "a") -> str:
    return "sha256:" + ch * 64


def test_checksums_name_their_algorithm_sha256_or_blake3(connect, tenants):
    ta, _ = tenants
    a = connect(ta, "lab")
    b3 = "blake3:" + "c" * 64
    r = a.register(f"noetl://{ta}/lab/ns/dataset/b3", locations=[{"uri": "file:///b3.arrow", "checksum": b3}])
    assert a.resolve(r.uri).expected_checksum == b3
    for bad in ("md5:" + "c" * 32, "c" * 64, "blake3:" + "C" * 64, "blake3:" + "c" * 63):
        with pytest.raises(InvalidRequest):
            a.register(f"noetl://{ta}/lab/ns/dataset/bad", locations=[{"uri": "file:///x", "checksum": bad}])
