"""DELETE /v1/ephemeral-playbooks/{id} (issue 21.3) through a real uvicorn server, on SQLite and Postgres:
the same refusals as Registry.delete_ephemeral (409 before the generating execution is archived and for
any other kind), then a tombstone that keeps the URI, idempotent, recorded as a catalog event."""

from __future__ import annotations

import uuid

import httpx
import pytest

from noetl_registry.client import HttpRegistryClient
from noetl_registry.errors import Conflict


def _setup(registry, http_url, tenant):
    _, key = registry.create_api_key(tenant, "lab")
    http = httpx.Client(base_url=http_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    client = HttpRegistryClient(http_url, key)
    parent = f"exec-{uuid.uuid4().hex[:12]}"
    row = client.register(
        f"noetl://{tenant}/lab/playbooks/ephemeral_playbook/{uuid.uuid4().hex[:16]}",
        kind="ephemeral_playbook",
        metadata={
            "playbook_id": "sha256:abc",
            "parent_execution_id": parent,
            "definition": "apiVersion: noetl.io/v2\n",
        },
        execution_id=parent,
    )
    return http, client, parent, row


def test_delete_is_refused_before_archival_then_tombstones(registry, http_url, tenants):
    ta, _ = tenants
    http, client, parent, row = _setup(registry, http_url, ta)
    try:
        r = http.delete(f"/v1/ephemeral-playbooks/{row.resource_id}")
        assert r.status_code == 409 and r.json()["code"] == "conflict"
        assert f"generating execution {parent} is not archived yet" in r.json()["detail"]
        assert client.get(row.resource_id).status == "active"  # nothing changed
        with pytest.raises(Conflict, match="not archived"):
            client.delete_ephemeral(row.resource_id)

        archive = client.register(
            f"noetl://{ta}/lab/archives/execution_archive/{parent}",
            kind="execution_archive",
            execution_id=parent,
        )
        r = http.delete(f"/v1/ephemeral-playbooks/{row.resource_id}")
        assert r.status_code == 200, r.text
        tomb = r.json()
        assert tomb["status"] == "deleted" and tomb["uri"] == row.uri
        assert "definition" not in tomb["metadata"] and tomb["metadata"]["archive"] == archive.uri
        assert (
            tomb["metadata"]["playbook_id"] == "sha256:abc"
            and tomb["metadata"]["parent_execution_id"] == parent
        )
        assert client.get(row.resource_id).status == "deleted"
        assert client.delete_ephemeral(row.resource_id).status == "deleted"  # idempotent
        deleted = [
            e
            for e in client.events(limit=1000).events
            if e.name == "noetl.catalog.resource.ephemeral_deleted"
        ]
        assert [e.resource_id for e in deleted] == [row.resource_id]  # once, not on the repeat
    finally:
        http.close()
        client.close()


def test_other_kinds_unknown_ids_other_tenants_and_no_key_are_refused(registry, http_url, tenants):
    ta, tb = tenants
    http, client, _, row = _setup(registry, http_url, ta)
    _, other_key = registry.create_api_key(tb, "lab")
    try:
        table = client.register(f"noetl://{ta}/lab/sales/table/orders", kind="table")
        r = http.delete(f"/v1/ephemeral-playbooks/{table.resource_id}")
        assert r.status_code == 409 and "only ephemeral_playbook rows can be deleted" in r.json()["detail"]
        assert client.get(table.resource_id).status == "active"

        r = http.delete("/v1/ephemeral-playbooks/res_missing")
        assert r.status_code == 404 and r.json()["code"] == "not_found"

        r = httpx.delete(f"{http_url}/v1/ephemeral-playbooks/{row.resource_id}")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"

        r = httpx.delete(f"{http_url}/v1/ephemeral-playbooks/{row.resource_id}",
                         headers={"Authorization": f"Bearer {other_key}"})  # fmt: skip
        assert r.status_code == 403 and "no live grant" in r.json()["detail"]  # another tenant's row
        assert client.get(row.resource_id).status == "active"
    finally:
        http.close()
        client.close()


def test_the_route_is_in_the_openapi_document(http_url):
    doc = httpx.get(f"{http_url}/openapi.json").json()
    op = doc["paths"]["/v1/ephemeral-playbooks/{resource_id}"]["delete"]
    assert "archived" in op["description"]
