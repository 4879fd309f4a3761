"""A generated playbook's network calls are scoped by its grant (engine.trust, ``allow_hosts``).

``executor.spec.generated.allow_hosts`` lists the hosts (``host``, ``host:port``, ``*.domain``) a
generated child may request; none listed, none allowed. The gate checks the rendered URL at
dispatch (a URL computed at run time too), the http tool checks it again as httpx reads it and on
every redirect hop. Real executions against real local HTTP servers (pytest-server).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pytest_httpserver import HTTPServer

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.engine.replay import replay
from noetl_dagster.engine.trust import Gate, Grant
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.event_stores import open_event_store


def child_doc(url: str) -> dict:
    return {
        "apiVersion": "noetl.io/v2",
        "kind": "Playbook",
        "metadata": {"name": "fetcher", "path": "generated/fetcher"},
        "workload": {"url": url},
        "workflow": [{"step": "start", "tool": [{"get": {"kind": "http", "url": "{{ workload.url }}"}}]}],
    }


def parent_doc(child: dict, generated: dict) -> dict:
    return {
        "apiVersion": "noetl.io/v2",
        "kind": "Playbook",
        "metadata": {"name": "parent", "path": "tests/parent"},
        "executor": {"spec": {"generated": generated}},
        "workflow": [{"step": "run_child", "tool": [{"child": {"kind": "playbook", "definition": child}}]}],
    }


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("NOETL_HTTP_OVERRIDES", raising=False)
    store_url = f"sqlite:///{tmp_path / 'events.db'}"

    def go(child: dict, generated: dict):
        res = run_playbook(load_playbook_dict(parent_doc(child, generated)), None,
                           event_store=store_url, data_dir=tmp_path / "home")  # fmt: skip
        store = open_event_store(store_url)
        kids = [se.event for se in store.iter_all()
                if se.event.name == "playbook.execution.requested" and se.event.parent_execution_id == res.execution_id]  # fmt: skip
        inner = replay(store, kids[0].execution_id).result("start") if kids else None
        return res, kids, inner

    return go


def _server():
    server = HTTPServer(host="127.0.0.1")
    server.start()
    yield server
    server.clear()
    server.stop()


server = pytest.fixture(_server)
other_server = pytest.fixture(_server)


def _listen(server: HTTPServer) -> str:
    server.expect_request("/data").respond_with_json({"ok": 1})
    return server.url_for("/data")


def test_no_allow_hosts_refuses_every_host_at_run_time(run, server):
    """The URL is a template: only the run-time gate sees it. Nothing reaches the server."""
    url = _listen(server)
    res, kids, inner = run(child_doc(url), {"allow_kinds": ["http"]})
    assert res.results["run_child"]["error"]["kind"] == "playbook_failed"
    err = inner["error"]
    assert err["kind"] == "trust_refused", err
    host = f"127.0.0.1:{server.port}"
    assert err["message"] == f"generated playbook: task 'get': host {host!r} is not in allow_hosts ([])"
    assert "\n" not in err["message"]
    assert server.log == []


def test_an_allowed_host_is_reached_and_recorded_on_the_request(run, server):
    url = _listen(server)
    res, kids, inner = run(child_doc(url), {"allow_kinds": ["http"], "allow_hosts": ["127.0.0.1"]})
    assert res.status == "completed", res.results
    assert res.results["run_child"]["data"] == {"ok": 1}
    assert len(server.log) == 1
    assert kids[0].data["allowed_hosts"] == ["127.0.0.1"]


def test_a_host_entry_with_a_port_allows_that_port_only(run, server, other_server):
    _listen(server)
    url = _listen(other_server)
    entry = f"127.0.0.1:{server.port}"
    res, kids, inner = run(child_doc(url), {"allow_kinds": ["http"], "allow_hosts": [entry]})
    assert inner["error"]["kind"] == "trust_refused", inner
    assert (
        f"host '127.0.0.1:{other_server.port}' is not in allow_hosts (['{entry}'])"
        in inner["error"]["message"]
    )
    assert other_server.log == []


def test_a_redirect_to_a_host_outside_the_grant_is_not_followed(run, server, other_server):
    secret = _listen(other_server)
    server.expect_request("/hop").respond_with_data("", status=302, headers={"Location": secret})
    entry = f"127.0.0.1:{server.port}"
    res, kids, inner = run(
        child_doc(server.url_for("/hop")), {"allow_kinds": ["http"], "allow_hosts": [entry]}
    )
    assert inner["error"]["kind"] == "trust_refused", inner
    assert f"host '127.0.0.1:{other_server.port}' is not in allow_hosts" in inner["error"]["message"]
    assert len(server.log) == 1
    assert other_server.log == []


def test_a_redirect_within_the_grant_is_followed(run, server):
    target = _listen(server)
    server.expect_request("/hop").respond_with_data("", status=302, headers={"Location": target})
    res, kids, inner = run(
        child_doc(server.url_for("/hop")), {"allow_kinds": ["http"], "allow_hosts": ["127.0.0.1"]}
    )
    assert res.status == "completed", res.results
    assert res.results["run_child"]["data"] == {"ok": 1}
    assert len(server.log) == 2


def test_a_literal_host_outside_the_grant_is_refused_before_the_child_starts(run, server):
    url = _listen(server)
    child = child_doc(url)
    child["workflow"][0]["tool"][0]["get"]["url"] = url
    res, kids, inner = run(child, {"allow_kinds": ["http"], "allow_hosts": ["example.com"]})
    err = res.results["run_child"]["error"]
    assert err["kind"] == "generated_playbook_refused", err
    assert (
        "host '127.0.0.1:" in err["message"] and "is not in allow_hosts (['example.com'])" in err["message"]
    )
    assert kids == [] and server.log == []


def test_the_unrestricted_parent_is_not_scoped(tmp_path, monkeypatch, server):
    monkeypatch.setenv("NOETL_DAGSTER_HOME", str(tmp_path / "home"))
    doc = child_doc(_listen(server))
    res = run_playbook(load_playbook_dict(doc), None, event_store=f"sqlite:///{tmp_path / 'e.db'}",
                       data_dir=tmp_path / "home")  # fmt: skip
    assert res.status == "completed", res.results
    assert len(server.log) == 1


def test_any_kinds_network_url_meets_the_same_rule(tmp_path):
    """Not only kind http: a URL in any tool's config (a qdrant or mcp server) is checked."""
    gate = Gate(
        Grant(frozenset({"qdrant", "mcp"}), frozenset(), frozenset({"*.corp.example"})), "acme", str(tmp_path)
    )
    gate.check("qdrant", {"url": "https://vec.corp.example:6333", "collection": "c"}, "task 'q'")
    for kind, cfg in (
        ("qdrant", {"url": "http://169.254.169.254/latest"}),
        ("mcp", {"url": "https://corp.example.evil.net/sse"}),
    ):
        with pytest.raises(Exception, match="is not in allow_hosts") as e:
            gate.check(kind, cfg, "task 'q'")
        assert getattr(e.value, "kind", None) == "trust_refused"
    # data is data: a URL in a body is not a request target
    Gate(Grant(frozenset({"http"}), frozenset(), frozenset({"api.example"})), "acme", str(tmp_path)).check(
        "http", {"url": "https://api.example/x", "json": {"link": "https://elsewhere.example/"}}, "task 'h'"
    )


HOSTS = st.sampled_from(
    ["api.example", "API.Example.", "sub.api.example", "api.example.evil", "127.0.0.1", "::1", "exämple.de"]
)
ENTRIES = st.sampled_from(
    ["api.example", "*.api.example", "api.example:8443", "127.0.0.1", "[::1]:8080", "xn--exmple-cua.de"]
)


@settings(max_examples=300, deadline=None)
@given(host=HOSTS, port=st.sampled_from([None, 80, 443, 8080, 8443]), scheme=st.sampled_from(["http", "https"]),
       entries=st.frozensets(ENTRIES, max_size=3), sep=st.sampled_from(["", "\\@evil.net", "#@x", "?@x"]))  # fmt: skip
def test_host_rule_matches_the_host_httpx_requests(host, port, scheme, entries, sep):
    """Generated URLs, with the tricks a parser difference would let through: the gate's decision
    is the decision for the host and port httpx would actually connect to."""
    import httpx  # noqa: PLC0415

    from noetl_dagster.engine.trust import host_refusal  # noqa: PLC0415

    netloc = (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    url = f"{scheme}://{netloc}{sep}/p"
    try:
        target = httpx.URL(url)
    except httpx.InvalidURL:
        return
    real_host = target.raw_host.decode("ascii").strip("[]").rstrip(".").lower()  # the name as sent (punycode)
    real_port = target.port or (443 if scheme == "https" else 80)

    def listed(entry: str) -> bool:
        e_host, _, e_port = (
            entry.rpartition(":") if entry.count(":") == 1 or entry.startswith("[") else (entry, "", "")
        )
        e_host = e_host.strip("[]")
        if e_port and int(e_port) != real_port:
            return False
        return real_host == e_host or (e_host.startswith("*.") and real_host.endswith(e_host[1:]))

    expected = any(listed(e) for e in entries)
    assert (host_refusal(str(target), entries) is None) == expected, (url, str(target), entries)
    assert (host_refusal(url, entries) is None) == expected, (url, entries)


def _hosts_of(server: HTTPServer) -> str:
    return f"127.0.0.1:{server.port}"


def _refusals(tmp_path, server: HTTPServer) -> set[tuple[str | None, str | None]]:
    """(execution, step) of every recorded trust refusal naming ``server`` (all executions of the log)."""
    import json  # noqa: PLC0415

    needle = f"host '127.0.0.1:{server.port}' is not in allow_hosts"
    out = set()
    for se in open_event_store(f"sqlite:///{tmp_path / 'events.db'}").iter_all():
        e = se.event
        if (
            e.name == "task.done"
            and needle in json.dumps(e.data, default=str)
            and "trust_refused" in json.dumps(e.data, default=str)
        ):
            out.add((e.execution_id, e.step))
    return out


def test_every_construct_that_calls_http_meets_the_host_rule(run, server, other_server, tmp_path):
    """A task loop's iterations, a workbook entry and a nested generated child: each call passes the
    gate with its own URL. The allowed server is reached by every construct, the other by none."""
    good, bad = _listen(server), _listen(other_server)
    child = {
        "apiVersion": "noetl.io/v2",
        "kind": "Playbook",
        "metadata": {"name": "constructs", "path": "generated/constructs"},
        "workload": {"urls": [good, bad]},
        "workbook": [{"name": "fetch", "tool": {"kind": "http", "url": "{{ u }}"}}],
        "workflow": [
            {"step": "start", "next": {"arcs": [{"step": "each"}, {"step": "wb_good"}, {"step": "wb_bad"}]}},
            {"step": "each", "loop": {"in": "{{ workload.urls }}", "iterator": "u"},
             "tool": [{"get": {"kind": "http", "url": "{{ iter.u }}"}}]},
            {"step": "wb_good", "tool": [{"call": {"kind": "workbook", "name": "fetch", "input": {"u": good}}}]},
            {"step": "wb_bad", "tool": [{"call": {"kind": "workbook", "name": "fetch", "input": {"u": bad}}}]},
        ],
    }  # fmt: skip
    child["workflow"][0]["next"]["spec"] = {"mode": "inclusive"}
    res, kids, _ = run(child, {"allow_kinds": ["http", "workbook"], "allow_hosts": [_hosts_of(server)]})
    assert len(kids) == 1
    # the allowed server got the loop's first iteration and the good workbook call, nothing else
    assert len(server.log) == 2, [str(r.url) for r, _ in server.log]
    assert other_server.log == []
    assert res.results["run_child"]["error"]["kind"] == "playbook_failed"  # the child failed on its refusals
    assert {step for _, step in _refusals(tmp_path, other_server)} >= {"each", "wb_bad"}


def test_a_nested_generated_child_gets_the_meet_of_the_hosts(run, server, other_server, tmp_path):
    """The middle generated playbook lists hosts for its own children: only those its own grant has
    stay (a restriction only narrows): allowed by both -> reached; by one of the two -> refused."""
    good, bad = _listen(server), _listen(other_server)
    grandchild = child_doc(good)
    middle = {
        "apiVersion": "noetl.io/v2",
        "kind": "Playbook",
        "metadata": {"name": "middle", "path": "generated/middle"},
        "executor": {"spec": {"generated": {"allow_kinds": ["http"], "allow_hosts": [_hosts_of(server), _hosts_of(other_server)]}}},
        "workflow": [{"step": "start", "tool": [{"inner": {"kind": "playbook", "definition": grandchild}}]}],
    }  # fmt: skip
    # the parent allows the good server only: the grandchild reaches it
    res, kids, inner = run(middle, {"allow_kinds": ["playbook", "http"], "allow_hosts": [_hosts_of(server)]})
    assert res.status == "completed", res.results
    assert len(server.log) == 1
    # the grandchild asks for the other server, which the middle lists but the parent never granted
    middle["workflow"][0]["tool"][0]["inner"]["definition"] = child_doc(bad)
    res, kids, inner = run(middle, {"allow_kinds": ["playbook", "http"], "allow_hosts": [_hosts_of(server)]})
    assert res.status == "failed" and other_server.log == []
    assert res.results["run_child"]["error"]["kind"] == "playbook_failed"
    assert len(_refusals(tmp_path, other_server)) == 1  # in the grandchild, at its call


def test_a_listed_name_that_resolves_to_loopback_is_refused(run, server):
    """Issue 41.4: the egress proxy refused a listed *name* resolving to the worker's loopback (its own
    services) or link-local addresses (a metadata endpoint); `kind: http` reached it. One rule at the
    gate now (engine.trust.resolve_checked): the address written as such is still allowed."""
    url = _listen(server).replace("127.0.0.1", "localhost")
    res, kids, inner = run(
        child_doc(url), {"allow_kinds": ["http"], "allow_hosts": [f"localhost:{server.port}"]}
    )
    assert inner["error"]["kind"] == "trust_refused", inner
    assert (
        "resolves to 127.0.0.1" in inner["error"]["message"] or "resolves to ::1" in inner["error"]["message"]
    )
    assert server.log == []
    res, kids, inner = run(child_doc(url.replace("localhost", "127.0.0.1")),
                           {"allow_kinds": ["http"], "allow_hosts": [f"127.0.0.1:{server.port}"]})  # fmt: skip
    assert res.status == "completed" and len(server.log) == 1
