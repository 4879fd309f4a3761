"""Tenancy: tenant B sees nothing of tenant A without a live grant; denials are audited;
hostile names and SQL are rejected or inert. SQLite and Postgres, in-process and HTTP."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from noetl_registry.errors import Forbidden, InvalidRequest, NotFound, Unauthorized


@pytest.fixture
def shared(connect, tenants):
    """Tenant A with a resource and a lineage edge; a client for tenant B."""
    ta, tb = tenants
    a = connect(ta, "lab")
    b = connect(tb, "x")
    raw = a.register(
        f"noetl://{ta}/lab/raw/dataset/reads",
        locations=[{"uri": "s3://a/raw", "checksum": "sha256:" + "1" * 64}],
    )
    out = a.register(
        f"noetl://{ta}/lab/genomics/result/variants",
        inputs=[raw.uri],
        locations=[{"uri": "s3://a/variants", "checksum": "sha256:" + "2" * 64}],
    )
    return a, b, raw, out


def test_without_a_grant_tenant_b_cannot_resolve_list_get_grant_or_see_lineage(shared, tenants):
    a, b, raw, out = shared
    ta, tb = tenants
    with pytest.raises(Forbidden):
        b.resolve(out.uri)
    with pytest.raises(Forbidden):
        b.resolve(out.series)  # latest
    with pytest.raises(Forbidden):
        b.get(out.resource_id)
    with pytest.raises(Forbidden):
        b.lineage(out.resource_id, "up")
    with pytest.raises(Forbidden):
        b.grant(out.uri, f"tenant:{tb}")  # granting yourself access
    with pytest.raises(Forbidden):
        b.add_location(out.resource_id, {"uri": "s3://evil/copy"})
    with pytest.raises(Forbidden):
        b.register(f"noetl://{ta}/lab/genomics/result/variants", locations=[{"uri": "s3://evil/v"}])
    assert b.list(tenant=ta) == [] and b.list(q="variants") == []
    assert {e.tenant for e in b.events().events} == {tb}  # A's catalog events are A's
    with pytest.raises(NotFound):
        b.revoke(a.grant(out.uri, f"tenant:{ta}").grant_id)  # someone else's grant id is "not found"
    assert a.resolve(out.uri).allowed  # the owner still can


def test_a_missing_resource_of_another_tenant_is_forbidden_not_not_found(shared, tenants):
    _, b, _, _ = shared
    ta, _ = tenants
    with pytest.raises(Forbidden):
        b.resolve(f"noetl://{ta}/lab/genomics/result/does_not_exist@v1")  # no existence oracle


def test_grant_allows_then_revocation_and_expiry_refuse(shared, tenants):
    a, b, raw, out = shared
    ta, tb = tenants
    g = a.grant(out.uri, f"tenant:{tb}")
    plan = b.resolve(out.uri)
    assert plan.allowed and plan.via_grant == g.grant_id and plan.expected_checksum == "sha256:" + "2" * 64
    assert [r.uri for r in b.list(tenant=ta)] == [out.uri]  # exactly what was shared
    assert b.get(out.resource_id).uri == out.uri
    lineage = b.lineage(out.resource_id, "up")
    assert lineage.edges == [] and lineage.hidden == 1  # the ungranted input stays hidden
    with pytest.raises(Forbidden):
        b.resolve(raw.uri)
    with pytest.raises(Forbidden):
        b.add_location(out.resource_id, {"uri": "s3://b/copy"})  # read grant, not write
    a.revoke(g.grant_id)
    with pytest.raises(Forbidden):
        b.resolve(out.uri)

    expired = a.grant(out.uri, f"tenant:{tb}", expires_at=datetime.now(UTC) - timedelta(seconds=1))
    assert not expired.active
    with pytest.raises(Forbidden):
        b.resolve(out.uri)
    a.grant(out.uri, f"tenant:{tb}", expires_at=datetime.now(UTC) + timedelta(hours=1))
    assert b.resolve(out.uri).allowed


def test_version_grant_does_not_open_other_versions_and_series_grant_does(shared, tenants):
    a, b, _, out = shared
    _, tb = tenants
    v2 = a.register(out.series, locations=[{"uri": "s3://a/variants2"}])
    a.grant(out.uri, f"tenant:{tb}")  # v1 only
    assert b.resolve(out.uri).allowed
    with pytest.raises(Forbidden):
        b.resolve(v2.uri)
    with pytest.raises(Forbidden):
        b.resolve(out.series)  # latest is v2
    a.grant(out.series, f"project:{tb}/x")
    assert b.resolve(out.series).version == "v2"


def test_project_scoped_keys_and_project_subjects(connect, tenants):
    ta, tb = tenants
    lab = connect(ta, "lab")
    other_project = connect(ta, "ops")
    whole_tenant = connect(ta)
    r = lab.register(f"noetl://{ta}/lab/ns/dataset/p", locations=[{"uri": "file:///p"}])
    assert whole_tenant.resolve(r.uri).allowed  # a tenant-wide key spans projects
    with pytest.raises(Forbidden):
        other_project.resolve(r.uri)  # private to the project by default
    with pytest.raises(Forbidden):
        other_project.register(f"noetl://{ta}/lab/ns/dataset/q")
    lab.grant(r.uri, f"project:{ta}/ops")
    assert other_project.resolve(r.uri).allowed
    b_x = connect(tb, "x")
    lab.grant(r.uri, f"project:{tb}/y")
    with pytest.raises(Forbidden):
        b_x.resolve(r.uri)  # granted to project y of tenant B, not x


def test_write_grant_lets_another_tenant_add_versions(connect, tenants):
    ta, tb = tenants
    a, b = connect(ta, "lab"), connect(tb)
    r = a.register(f"noetl://{ta}/lab/shared/dataset/inbox", locations=[{"uri": "file:///1"}])
    a.grant(r.series, f"tenant:{tb}", permission="write")
    r2 = b.register(r.series, locations=[{"uri": "file:///2"}])
    assert r2.version == "v2" and r2.tenant == ta
    b.add_location(r2.resource_id, {"uri": "s3://b/2"})


def test_denials_are_audited_for_owner_and_actor(shared, tenants):
    a, b, _, out = shared
    ta, tb = tenants
    start = a.audit().next_after
    with pytest.raises(Forbidden):
        b.resolve(out.uri)
    entries = [e for e in a.audit(after=start).entries if e.uri == out.uri]
    assert entries and not entries[-1].allowed
    assert (entries[-1].actor_tenant, entries[-1].owner_tenant, entries[-1].action) == (
        tb,
        ta,
        "resolve:read",
    )
    assert any(e.uri == out.uri and not e.allowed for e in b.audit().entries)


@pytest.mark.parametrize(
    "uri_tail",
    [
        "../../other_tenant/lab/ns/dataset/x@v1",
        "ns/dataset/..%2f..%2fetc@v1",
        "ns/dataset/x'; DROP TABLE registry_resource; --@v1",
        'ns/dataset/x" OR 1=1 --@v1',
        "ns/dataset/x@v1; DELETE FROM registry_grant",
    ],
)
def test_traversal_and_injection_in_uris_are_rejected(shared, tenants, uri_tail):
    a, _, _, _ = shared
    ta, _ = tenants
    for call in (lambda u: a.register(u), lambda u: a.resolve(u), lambda u: a.grant(u, f"tenant:{ta}")):
        with pytest.raises(InvalidRequest):
            call(f"noetl://{ta}/lab/{uri_tail}")


def test_injection_strings_elsewhere_are_inert(shared, tenants):
    a, b, _, out = shared
    ta, _ = tenants
    evil = "' OR '1'='1"
    assert a.list(q=evil) == [] and b.list(q=evil) == []
    assert a.list(q="x'; DROP TABLE registry_resource; --") == []
    with pytest.raises(InvalidRequest):
        a.grant(out.uri, f"tenant:{evil}")
    with pytest.raises(InvalidRequest):
        a.register(f"noetl://{ta}/lab/ns/dataset/ok", metadata={}, locations=[{"uri": "file:///x y"}])
    with pytest.raises((NotFound, ValueError)):
        a.get("res_x' OR '1'='1")
    a.register(
        f"noetl://{ta}/lab/ns/dataset/meta",
        metadata={"note": "'); DROP TABLE registry_event; --"},
        locations=[{"uri": "file:///m"}],
    )
    assert a.resolve(f"noetl://{ta}/lab/ns/dataset/meta").metadata["note"].startswith("');")
    assert a.resolve(out.uri).allowed and a.events().events  # tables intact


def test_bad_and_revoked_keys_are_unauthorized(registry, transport, request, tenants):
    from noetl_registry.client import HttpRegistryClient, open_registry

    ta, _ = tenants
    key_id, key = registry.create_api_key(ta, "lab")
    forged = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")

    def client(k):
        if transport == "http":
            return HttpRegistryClient(request.getfixturevalue("http_url"), k)
        return open_registry(registry, k)

    for bad in (forged, "nrk_nope_nope", "not-a-key"):
        with pytest.raises(Unauthorized):
            client(bad).whoami() if transport == "http" else client(bad)
    registry.revoke_api_key(key_id)
    with pytest.raises(Unauthorized):
        client(key).whoami() if transport == "http" else client(key)


def test_http_requires_a_bearer_key(registry, request):
    import httpx

    url = request.getfixturevalue("http_url")
    r = httpx.get(f"{url}/v1/resources/resolve", params={"uri": "noetl://a/b/c/d/e@v1"})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{url}/healthz").json()["ok"] is True
