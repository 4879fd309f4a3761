"""Every GET route of ``dashboard serve`` asked as another tenant (the tenancy gate at the data endpoints).

The routes come from the server's own table (``interactive.PUBLIC_ROUTES``, ``SCOPED_ROUTES``), not
from a list kept here: a route added without a probe below fails ``test_every_route_has_a_probe``,
so a new endpoint cannot skip this test. For each scoped route: no key is 401; acme's key asking
for globex's execution, a diff of one own and one foreign execution, a guessed id, a query-string
tenant override or a traversal in the path gets globex's data nowhere (404 like an unknown id, 403
for the cluster view, or acme's own rows only) and never a traceback. Real runs, a real SQLite event
store and registry, the real HTTP server on loopback."""

from __future__ import annotations

import threading

import httpx
import pytest

from noetl_analytics import interactive
from noetl_analytics.dashboard_access import KeyAuth
from noetl_analytics.execution_view import ExecutionViews
from noetl_analytics.store import FactsStore, close_all
from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store
from noetl_registry.service import Registry

DOC = {"apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "secret_globex_pb", "path": "t/g"},
       "workflow": [{"step": "start", "tool": [{"t": {"kind": "noop", "input": {"marker": "GLOBEX-ONLY"}}}]}]}  # fmt: skip
FOREIGN = ("globex", "secret_globex_pb", "GLOBEX-ONLY")  # none of these may reach acme


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("routes")
    url = f"sqlite:///{d / 'events.db'}"
    ids = {}
    for tenant in ("acme", "globex"):
        doc = {
            **DOC,
            "metadata": {
                **DOC["metadata"],
                "name": f"{tenant}_pb" if tenant == "acme" else DOC["metadata"]["name"],
            },
        }
        ids[tenant] = run_playbook(
            load_playbook_dict(doc), None, event_store=url, data_dir=d, tenant=tenant
        ).execution_id
    reg = Registry(f"sqlite:///{d / 'registry.db'}")
    keys = {t: reg.create_api_key(t)[1] for t in ("acme", "globex")}
    views = ExecutionViews(open_event_store(url), data_dir=str(d))
    server = interactive.make_server(
        FactsStore(f"chdb://{d / 'facts'}"), port=0, auth=KeyAuth(reg), executions=views
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"ids": ids, "keys": keys, "url": f"http://127.0.0.1:{server.server_address[1]}"}
    server.shutdown()
    server.server_close()
    reg.close()
    close_all()


def probes(ids: dict[str, str]) -> dict[str, list[tuple[str, dict[str, str]]]]:
    """Per scoped route: requests acme must not get globex's data from."""
    g, a = ids["globex"], ids["acme"]
    guessed = g[:-4] + ("0000" if not g.endswith("0000") else "1111")
    return {
        "/": [("/", {"tenant": "globex"})],
        "/api/data": [("/api/data", {"tenant": "globex", "scope_tenant": "globex"})],
        "/api/cluster": [("/api/cluster", {})],
        "/api/executions": [("/api/executions", {"tenant": "globex", "playbook": "secret_globex_pb", "step": "start"})],
        "/api/execution": [("/api/execution", {"id": g}), ("/api/execution", {"id": guessed}),
                           ("/api/execution", {"id": g, "tenant": "globex"}), ("/api/execution", {"id": "../" + g})],
        "/api/execution/iterations": [("/api/execution/iterations", {"id": g, "run": "start"})],
        "/api/diff": [("/api/diff", {"a": a, "b": g}), ("/api/diff", {"a": g, "b": a}), ("/api/diff", {"a": g, "b": g})],
        "/executions/<id>": [(f"/executions/{g}", {}), (f"/executions/{a}/../{g}", {}), (f"/executions/%2e%2e%2f{g}", {}),
                             (f"/executions/{guessed}", {})],
        "/diff": [("/diff", {"a": a, "b": g}), ("/diff", {"a": g, "b": a})],
    }  # fmt: skip


def _get(world, path, params=None, who=None):
    headers = {"Authorization": f"Bearer {world['keys'][who]}"} if who else {}
    return httpx.get(
        world["url"] + path, params=params or {}, headers=headers, follow_redirects=False, timeout=60
    )


def test_every_route_has_a_probe(world):
    assert set(probes(world["ids"])) == set(interactive.SCOPED_ROUTES)
    for route, requests in probes(world["ids"]).items():
        for path, _ in requests:
            assert interactive.route_of(httpx.URL(path).path) == route, (route, path)


@pytest.mark.parametrize("route", interactive.SCOPED_ROUTES)
def test_a_scoped_route_refuses_a_missing_key_and_another_tenant(world, route):
    for path, params in probes(world["ids"])[route]:
        assert _get(world, path, params).status_code == 401, path
        r = _get(world, path, params, who="acme")
        assert r.status_code in (200, 403, 404), (path, params, r.status_code, r.text[:300])
        assert "Traceback" not in r.text and "internal error" not in r.text, r.text[:300]
        for foreign in FOREIGN:
            assert foreign not in r.text, (path, params, foreign, r.text[:300])
        if route in ("/api/execution", "/executions/<id>", "/api/diff", "/diff", "/api/execution/iterations"):
            assert r.status_code == 404, (path, params, r.status_code)


def test_the_owner_still_reads_its_own(world):
    g = world["ids"]["globex"]
    r = _get(world, "/api/execution", {"id": g}, who="globex")
    assert r.status_code == 200 and r.json()["execution"]["tenant"] == "globex"
    assert _get(world, f"/executions/{g}", who="globex").status_code == 200


@pytest.mark.parametrize("path", sorted(interactive.PUBLIC_ROUTES))
def test_public_routes_carry_no_data(world, path):
    r = _get(world, path)
    assert r.status_code in (200, 204)
    for foreign in FOREIGN:
        assert foreign not in r.text
