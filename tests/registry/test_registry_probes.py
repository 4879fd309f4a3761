"""Issue 15 probes, on SQLite and Postgres: grant expiry at the edges of the calendar,
out-of-range and hostile parameters (every failure a 4xx with a JSON body), size limits."""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime, timedelta, timezone

import httpx
import psycopg
import pytest

from noetl_registry import store as store_mod
from noetl_registry.client import HttpRegistryClient
from noetl_registry.errors import Forbidden, InvalidRequest
from noetl_registry.models import Principal, iso
from noetl_registry.service import Registry

PG_ADMIN_URL = os.environ.get("NOETL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture
def owner_and_partner(registry, http_url, tenants):
    """Raw httpx clients for tenant A (owner of one resource) and tenant B."""
    ta, tb = tenants
    _, key_a = registry.create_api_key(ta, "lab")
    _, key_b = registry.create_api_key(tb, "x")
    a = httpx.Client(base_url=http_url, headers={"Authorization": f"Bearer {key_a}"})
    b = httpx.Client(base_url=http_url, headers={"Authorization": f"Bearer {key_b}"})
    r = a.post(
        "/v1/resources", json={"uri": f"noetl://{ta}/lab/ns/dataset/edge", "locations": [{"uri": "s3://a/e"}]}
    )
    assert r.status_code == 201, r.text
    yield a, b, r.json()["uri"], tb
    a.close()
    b.close()


def _grant(a: httpx.Client, uri: str, tb: str, expires_at: str) -> httpx.Response:
    return a.post(
        "/v1/grants", json={"resource_uri": uri, "subject": f"tenant:{tb}", "expires_at": expires_at}
    )


def _assert_json_4xx(r: httpx.Response, *statuses: int) -> dict:
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    if statuses:
        assert r.status_code in statuses, (r.status_code, r.text)
    body = r.json()
    assert isinstance(body["detail"], str) and body["code"], body
    return body


@pytest.mark.parametrize(
    "expires_at",
    [
        "0999-01-01T00:00:00Z",
        "0001-01-01T00:00:00Z",
        "0999-12-31T23:59:59.999999Z",
        "1999-12-31T23:59:59Z",
        # an offset that puts the instant in the past although its local text reads later than "now" in UTC
        "2000-01-01T00:00:00-12:00",
        "0500-06-15T12:00:00+14:00",
    ],
)
def test_expired_grants_refuse_whatever_the_year_or_offset(owner_and_partner, expires_at):
    a, b, uri, tb = owner_and_partner
    g = _grant(a, uri, tb, expires_at)
    assert g.status_code == 201, g.text
    assert g.json()["active"] is False
    r = b.get("/v1/resources/resolve", params={"uri": uri})
    assert r.status_code == 403, r.text  # before the fix, '999-…' > '2026-…' as text kept 0999 alive
    listed = b.get("/v1/resources", params={"q": "edge"}).json()["resources"]
    assert listed == []
    assert all(not gr["active"] for gr in a.get("/v1/grants", params={"include_inactive": True}).json())


@pytest.mark.parametrize(
    "expires_at",
    [
        "9999-12-31T23:59:59Z",
        "9999-12-31T23:59:59.999999+00:00",
        "9999-12-31T23:59:59+14:00",
        "5000-01-01T00:00:00-11:00",
    ],
)
def test_far_future_grants_are_live(owner_and_partner, expires_at):
    a, b, uri, tb = owner_and_partner
    g = _grant(a, uri, tb, expires_at)
    assert g.status_code == 201, g.text
    assert g.json()["active"] is True
    assert b.get("/v1/resources/resolve", params={"uri": uri}).json()["via_grant"] == g.json()["grant_id"]


def test_offsets_near_now_compare_as_instants(owner_and_partner):
    a, b, uri, tb = owner_and_partner
    soon_gone = (datetime.now(UTC) - timedelta(minutes=5)).astimezone(timezone(timedelta(hours=14)))
    assert _grant(a, uri, tb, soon_gone.isoformat()).json()["active"] is False
    assert b.get("/v1/resources/resolve", params={"uri": uri}).status_code == 403
    later = (datetime.now(UTC) + timedelta(minutes=5)).astimezone(timezone(timedelta(hours=-12)))
    assert _grant(a, uri, tb, later.isoformat()).json()["active"] is True
    assert b.get("/v1/resources/resolve", params={"uri": uri}).status_code == 200


@pytest.mark.parametrize(
    "expires_at",
    [
        "2016-12-31T23:59:60Z",  # a leap second: not representable, refused rather than rounded
        "0000-01-01T00:00:00Z",
        "10000-01-01T00:00:00Z",
        "2026-02-30T00:00:00Z",
        "2026-01-01T00:00:00",  # no offset
        "9999-12-31T23:00:00-05:00",  # past 9999 in UTC
        "0001-01-01T00:00:00+05:00",  # before 0001 in UTC
        "not a date",
        "+275760-09-13T00:00:00Z",
    ],
)
def test_unrepresentable_expiry_is_a_clean_422(owner_and_partner, expires_at):
    a, _, uri, tb = owner_and_partner
    _assert_json_4xx(_grant(a, uri, tb, expires_at), 422)


def test_in_process_grant_expiry_before_year_1000(registry, tenants):
    ta, tb = tenants
    owner, partner = Principal(ta, "lab"), Principal(tb, "x")
    from noetl_registry.models import GrantRequest, LocationIn, RegisterRequest

    r = registry.register(
        owner,
        RegisterRequest(uri=f"noetl://{ta}/lab/ns/dataset/old", locations=[LocationIn(uri="file:///o")]),
    )
    g = registry.grant(
        owner,
        GrantRequest(resource_uri=r.uri, subject=f"tenant:{tb}", expires_at=datetime(999, 1, 1, tzinfo=UTC)),
    )
    assert g.expires_at == "0999-01-01T00:00:00.000000Z" and not g.active
    with pytest.raises(Forbidden):
        registry.resolve(partner, r.uri)


def test_iso_is_fixed_width_for_every_year():
    assert iso(datetime(1, 1, 1, tzinfo=UTC)) == "0001-01-01T00:00:00.000000Z"
    assert iso(datetime(999, 12, 31, 23, 59, 59, tzinfo=UTC)) < iso(datetime(2026, 1, 1, tzinfo=UTC))


def _v1_database(db_url: str):
    """Open a store with only migration 1, as a database written by the previous release."""
    saved = list(store_mod.MIGRATIONS)
    store_mod.MIGRATIONS[:] = saved[:1]
    try:
        return store_mod.open_store(db_url)
    finally:
        store_mod.MIGRATIONS[:] = saved


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_migration_2_turns_old_text_expiry_into_instants(backend, tmp_path):
    if backend == "sqlite":
        url, drop = f"sqlite:///{tmp_path / 'old.db'}", None
    else:
        name = f"noetl_registry_mig_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        url, drop = f"{PG_ADMIN_URL.rpartition('/')[0]}/{name}", name
    try:
        old = _v1_database(url)
        assert old.schema_version() == 1
        rows = [
            ("g_old", "999-01-01T00:00:00.000000Z"),  # what the old iso() wrote for year 999
            ("g_bad", "garbage"),
            ("g_live", "9999-01-01T00:00:00.000000Z"),
        ]
        with old.write() as tx:
            for gid, text in rows:
                tx.exec(
                    "INSERT INTO registry_grant (grant_id, owner_tenant, owner_project, target_uri, series_id,"
                    " subject, subject_tenant, permission, conditions, expires_at, created_at)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        gid,
                        "ta",
                        "lab",
                        "noetl://ta/lab/n/d/x",
                        "noetl://ta/lab/n/d/x",
                        "tenant:tb",
                        "tb",
                        "read",
                        "{}",
                        text,
                        iso(datetime.now(UTC)),
                    ),
                )
        old.close()
        reg = Registry(url)
        assert reg.store.schema_version() == len(store_mod.MIGRATIONS)
        active = {g.grant_id: g.active for g in reg.list_grants(Principal("ta"), include_inactive=True)}
        assert active == {"g_old": False, "g_bad": False, "g_live": True}
        with reg.store.read() as tx:
            assert tx.one("SELECT expires_at FROM registry_grant WHERE grant_id = 'g_old'")[0].startswith(
                "0999-"
            )
        assert (
            reg._grant_for(
                reg.store.read().__enter__(), Principal("tb"), "noetl://ta/lab/n/d/x", None, ("read",)
            )
            == "g_live"
        )
        reg.close()
    finally:
        if drop:
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{drop}" WITH (FORCE)')


# --------------------------------------------------------------- hostile parameters
@pytest.mark.parametrize(
    "path,params",
    [
        ("/v1/resources", {"offset": 10**30}),
        ("/v1/resources", {"offset": -1}),
        ("/v1/resources", {"offset": 2**63}),
        ("/v1/resources", {"offset": 10**7}),  # over the configured max_offset
        ("/v1/resources", {"limit": 10**30}),
        ("/v1/resources", {"limit": 0}),
        ("/v1/events", {"after": 10**30}),
        ("/v1/events", {"after": 2**63}),
        ("/v1/events", {"after": -5}),
        ("/v1/audit", {"after": 10**30}),
        ("/v1/audit", {"limit": "1e400"}),
        ("/v1/resources/res_x/lineage", {"depth": 10**30}),
        ("/v1/resources", {"q": "a\x00b"}),
        ("/v1/resources", {"tenant": "t" * 10_000}),
        ("/v1/resources/resolve", {"uri": "noetl://a/b/c/d/" + "e/" * 3000 + "f@v1"}),
        ("/v1/resources/resolve", {"uri": "noetl://a/b/c/d/" + "e/" * 600 + "f@v1"}),  # over max_uri_length
        ("/v1/resources/resolve", {"uri": "noetl://a/b/c/d/e@v1", "purpose": "p" * 1000}),
        ("/v1/resources/resolve", {"uri": "noetl://a/b/c/d/e\x00@v1"}),
        ("/v1/resources/res_%00x", {}),
        ("/v1/grants/grt_%00", {}),
    ],
)
def test_out_of_range_and_hostile_query_values_are_json_4xx(owner_and_partner, path, params):
    a, _, _, _ = owner_and_partner
    r = a.request("DELETE" if path.startswith("/v1/grants/") else "GET", path, params=params)
    assert "%00" not in path or "%00" in str(r.request.url)
    _assert_json_4xx(r)


@pytest.mark.parametrize(
    "body",
    [
        {"uri": "NOETL", "metadata": {"k": "v\x00"}},
        {"metadata": {"k\x00": 1}},
        {"metadata": {"n": float("nan")}},
        {"metadata": {"n": float("inf")}},
        {"metadata": {"big": "x" * (70 << 10)}},  # over max_metadata_bytes (64 KiB)
        {"locations": [{"uri": "s3://a/1", "size_bytes": 10**30}]},
        {"locations": [{"uri": "s3://a/1", "rows": -1}]},
        {"locations": [{"uri": "s3://a/1", "format": "f" * 5000}]},
        {"locations": [{"uri": f"s3://a/{i}"} for i in range(65)]},  # over max_locations
        {"inputs": ["noetl://x/y/z/w/v@v1"] * 300},  # over max_inputs
        {"step": "s" * 1000},
        {"kind": "\ud800"},
        {"metadata": json.loads('{"a":' * 40 + "1" + "}" * 40)},  # nested deeper than 32 levels
    ],
)
def test_hostile_bodies_are_json_4xx(owner_and_partner, tenants, body):
    a, _, _, _ = owner_and_partner
    ta, _ = tenants
    payload = {"uri": f"noetl://{ta}/lab/ns/dataset/hostile", "locations": [{"uri": "s3://a/h"}]}
    payload.update({k: v for k, v in body.items() if k != "uri"})
    text = json.dumps(payload, allow_nan=True)  # NaN/Infinity as Python's json writes them
    r = a.post(
        "/v1/resources",
        content=text.encode("utf-8", "surrogatepass"),
        headers={"content-type": "application/json"},
    )
    _assert_json_4xx(r)
    assert a.get("/v1/resources", params={"q": "hostile"}).json()["resources"] == []


def test_grant_conditions_and_far_future_offsets_never_500(owner_and_partner):
    a, _, uri, tb = owner_and_partner
    for expires in ("9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59", "99999-01-01T00:00:00Z"):
        _assert_json_4xx(_grant(a, uri, tb, expires), 422)
    r = a.post(
        "/v1/grants",
        json={"resource_uri": uri, "subject": f"tenant:{tb}", "conditions": {"x": "y" * (70 << 10)}},
    )
    _assert_json_4xx(r, 422)
    r = a.post("/v1/grants", json={"resource_uri": uri, "subject": "tenant:\u0000"})
    _assert_json_4xx(r, 422)


def test_request_body_limit_is_413_and_configurable(registry, tenants):
    from fastapi.testclient import TestClient

    from noetl_registry.app import create_app
    from noetl_registry.common import Limits

    ta, _ = tenants
    _, key = registry.create_api_key(ta, "lab")
    small = TestClient(
        create_app(registry, limits=Limits(max_body_bytes=2048)), headers={"Authorization": f"Bearer {key}"}
    )
    body = {"uri": f"noetl://{ta}/lab/ns/dataset/big", "metadata": {"pad": "x" * 4000}}
    r = small.post("/v1/resources", json=body)
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large"

    def chunks():  # no Content-Length: counted while it streams
        data = json.dumps(body).encode()
        for i in range(0, len(data), 500):
            yield data[i : i + 500]

    r = small.post("/v1/resources", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
    ok = small.post("/v1/resources", json={"uri": f"noetl://{ta}/lab/ns/dataset/small"})
    assert ok.status_code == 201, ok.text
    default = TestClient(create_app(registry), headers={"Authorization": f"Bearer {key}"})
    huge = default.post(
        "/v1/resources", content=b"{" + b" " * (2 << 20) + b"}", headers={"content-type": "application/json"}
    )
    assert huge.status_code == 413


def test_http_client_raises_payload_too_large(registry, tenants):
    from registry_helpers import ServerThread

    from noetl_registry.app import create_app
    from noetl_registry.common import Limits
    from noetl_registry.errors import PayloadTooLarge

    ta, _ = tenants
    _, key = registry.create_api_key(ta, "lab")
    with (
        ServerThread(create_app(registry, limits=Limits(max_body_bytes=2048))) as srv,
        HttpRegistryClient(srv.url, key) as c,
    ):
        with pytest.raises(PayloadTooLarge) as err:
            c.register(f"noetl://{ta}/lab/ns/dataset/big", metadata={"pad": "x" * 4000})
        assert isinstance(err.value, InvalidRequest) and err.value.status == 413
        assert c.register(f"noetl://{ta}/lab/ns/dataset/fits").version == "v1"


def test_in_process_limits_raise_invalid_request(registry, tenants):
    ta, _ = tenants
    from noetl_registry.client import open_registry

    c = open_registry(registry, tenant=ta, project="lab")
    with pytest.raises(InvalidRequest):
        c.list(offset=10**30)
    with pytest.raises(InvalidRequest):
        c.events(after=10**30)
    with pytest.raises(InvalidRequest):
        c.register(f"noetl://{ta}/lab/ns/dataset/m", metadata={"k": "x" * (70 << 10)})
    with pytest.raises(InvalidRequest):
        c.resolve("noetl://" + "a" * 5000)


def test_http_client_maps_limit_errors(owner_and_partner, http_url, registry, tenants):
    ta, _ = tenants
    _, key = registry.create_api_key(ta, "lab")
    with HttpRegistryClient(http_url, key) as c, pytest.raises(InvalidRequest):
        c.list(offset=10**30)
