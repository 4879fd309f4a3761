"""Every route of the registry's FastAPI app asked by another tenant, enumerated from ``app.routes``.

A route without a probe below fails ``test_every_route_has_a_probe``, so a new endpoint cannot skip
this test. globex's key asks for acme's resource, grant and lineage by id and by URI, with query
overrides (``?tenant=acme``) and a traversal in the path; no key is 401 on every /v1 route. The
answer is a refusal (403/404/409/422) or globex's own data: acme's URI, name and metadata appear in
no body (an id the caller sent may be echoed)."""

from __future__ import annotations

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from noetl_registry.app import create_app
from noetl_registry.service import Registry

SECRET = ("noetl://acme/p/ns", "secret_table", "ACME-META", "s3://acme-bucket")
PUBLIC = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/openapi.json"), ("GET", "/docs"),
          ("GET", "/docs/oauth2-redirect"), ("GET", "/redoc")}  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    reg = Registry(f"sqlite:///{tmp_path_factory.mktemp('routes') / 'registry.db'}")
    app = create_app(reg)
    client = TestClient(app)
    keys = {t: reg.create_api_key(t)[1] for t in ("acme", "globex")}
    acme = {"Authorization": f"Bearer {keys['acme']}"}
    res = client.post("/v1/resources", headers=acme, json={
        "uri": "noetl://acme/p/ns/table/secret_table", "metadata": {"m": "ACME-META"},
        "locations": [{"uri": "s3://acme-bucket/t.parquet", "format": "parquet"}]}).json()  # fmt: skip
    eph = client.post("/v1/resources", headers=acme, json={
        "uri": "noetl://acme/p/ns/ephemeral_playbook/secret_table_gen", "kind": "ephemeral_playbook",
        "metadata": {"m": "ACME-META"}}).json()  # fmt: skip
    grant = client.post("/v1/grants", headers=acme, json={
        "resource_uri": "noetl://acme/p/ns/table/secret_table", "subject": "tenant:initech"}).json()  # fmt: skip
    yield {"app": app, "client": client, "keys": keys, "rid": res["resource_id"], "eph": eph["resource_id"],
           "gid": grant["grant_id"]}  # fmt: skip
    reg.close()


def probes(w) -> dict[tuple[str, str], list[tuple[str, dict | None]]]:
    rid, eph, gid, uri = w["rid"], w["eph"], w["gid"], "noetl://acme/p/ns/table/secret_table"
    return {
        ("GET", "/v1/whoami"): [("/v1/whoami", None)],
        ("POST", "/v1/resources"): [("/v1/resources", {"uri": uri, "metadata": {"x": 1}}),
                                    ("/v1/resources", {"uri": "noetl://globex/p/ns/table/mine", "inputs": [uri]})],
        ("GET", "/v1/resources/resolve"): [(f"/v1/resources/resolve?uri={uri}", None)],
        ("GET", "/v1/access"): [(f"/v1/access?uri={uri}", None),
                                ("/v1/access?uri=noetl://acme/p/payloads/project/all", None)],
        ("GET", "/v1/resources"): [("/v1/resources?tenant=acme", None), ("/v1/resources?q=secret", None),
                                   ("/v1/resources?tenant=acme&project=p&namespace=ns&latest=true", None)],
        ("GET", "/v1/resources/{resource_id}"): [(f"/v1/resources/{rid}", None), (f"/v1/resources/{eph}", None),
                                                 ("/v1/resources/..%2F..%2Fetc%2Fpasswd", None)],
        ("POST", "/v1/resources/{resource_id}/locations"): [(f"/v1/resources/{rid}/locations",
                                                             {"uri": "s3://evil/x", "format": "parquet"})],
        ("DELETE", "/v1/ephemeral-playbooks/{resource_id}"): [(f"/v1/ephemeral-playbooks/{eph}", None),
                                                              (f"/v1/ephemeral-playbooks/{rid}", None)],
        ("GET", "/v1/resources/{resource_id}/lineage"): [(f"/v1/resources/{rid}/lineage?direction=down&depth=10", None)],
        ("POST", "/v1/grants"): [("/v1/grants", {"resource_uri": uri, "subject": "tenant:globex"})],
        ("GET", "/v1/grants"): [(f"/v1/grants?resource_uri={uri}", None), ("/v1/grants?include_inactive=true", None)],
        ("DELETE", "/v1/grants/{grant_id}"): [(f"/v1/grants/{gid}", None)],
        ("GET", "/v1/events"): [("/v1/events?after=0", None)],
        ("GET", "/v1/audit"): [("/v1/audit", None)],
    }  # fmt: skip


def _routes(app) -> set[tuple[str, str]]:
    out = set()
    for r in app.routes:
        for m in getattr(r, "methods", None) or ():
            if m != "HEAD":
                out.add((m, r.path))
    return out


def test_every_route_has_a_probe(world):
    assert _routes(world["app"]) == set(probes(world)) | PUBLIC
    assert all(isinstance(r, APIRoute) for r in world["app"].routes if r.path.startswith("/v1"))


def _sent(path: str, body: dict | None) -> set[str]:
    from urllib.parse import parse_qsl, urlsplit

    out = {path, *(v for _, v in parse_qsl(urlsplit(path).query))}
    stack: list = [body]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            out.add(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return out


def _send(world, method, path, body, key=None):
    headers = {"Authorization": f"Bearer {world['keys'][key]}"} if key else {}
    return world["client"].request(
        method, path, headers=headers, **({"json": body} if body is not None else {})
    )


def test_every_v1_route_refuses_a_missing_key_and_leaks_nothing_to_another_tenant(world):
    every = [pb for requests in probes(world).values() for pb in requests]
    # what globex sent may come back to it (an echoed URI; the audit lists all its own requests)
    sent = sorted(set().union(*(_sent(path, body) for path, body in every)), key=len, reverse=True)
    sent = [x for x in sent if len(x) > 12]  # not `p`, `ns`, `acme`: they are inside the secrets
    for (method, _), requests in probes(world).items():
        for path, body in requests:
            anonymous = _send(world, method, path, body)  # 401, or 404 for a path no route matches
            assert anonymous.status_code == 401 or anonymous.json()["code"] == "http_error", (method, path)
            r = _send(world, method, path, body, key="globex")
            assert r.status_code in (200, 201, 403, 404, 409, 422), (method, path, r.status_code, r.text)
            text = r.text
            for echoed in sent:
                text = text.replace(echoed, "")
            for secret in SECRET:
                at = text.find(secret)
                assert at < 0, (method, path, text[max(0, at - 300) : at + 80])
    # acme's rows are unchanged: no location added, the ephemeral row not deleted, the grant live
    got = _send(world, "GET", f"/v1/resources/{world['rid']}", None, key="acme").json()
    assert [loc["uri"] for loc in got["locations"]] == ["s3://acme-bucket/t.parquet"]
    assert (
        _send(world, "GET", f"/v1/resources/{world['eph']}", None, key="acme").json()["status"] != "deleted"
    )
    grants = _send(world, "GET", "/v1/grants", None, key="acme").json()
    assert [g["grant_id"] for g in grants] == [world["gid"]]


def test_access_answers_whether_the_caller_may_read_and_nothing_else(world):
    """``GET /v1/access`` (the payload locator's grant question, storage/locator.py): acme owns its
    table, globex may not read it, and may read acme's payloads once acme grants them."""
    uri = "noetl://acme/p/ns/table/secret_table"
    assert _send(world, "GET", f"/v1/access?uri={uri}", None, key="acme").json() == {"allowed": True}
    got = _send(world, "GET", f"/v1/access?uri={uri}", None, key="globex")
    assert got.status_code == 200 and got.json() == {"allowed": False}
    payloads = "noetl://acme/p/payloads/execution/e1"
    assert _send(world, "GET", f"/v1/access?uri={payloads}", None, key="globex").json() == {"allowed": False}
    grant = _send(
        world, "POST", "/v1/grants", {"resource_uri": payloads, "subject": "tenant:globex"}, key="acme"
    )
    assert grant.status_code == 201, grant.text
    assert _send(world, "GET", f"/v1/access?uri={payloads}", None, key="globex").json() == {"allowed": True}
    _send(world, "DELETE", f"/v1/grants/{grant.json()['grant_id']}", None, key="acme")
    assert _send(world, "GET", f"/v1/access?uri={payloads}", None, key="globex").json() == {"allowed": False}
