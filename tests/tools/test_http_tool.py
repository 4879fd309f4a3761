"""kind: http against a real local HTTP server (pytest-httpserver)."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from werkzeug.wrappers import Response

from noetl_dagster.engine.keychain import EnvProvider, Keychain
from noetl_dagster.tools.http import http_tool
from noetl_dagster.tools.registry import ToolError, get_tool


def test_registered():
    assert get_tool("http").fn is http_tool


def test_get_json_with_params_and_headers(httpserver, make_ctx):
    httpserver.expect_request(
        "/users", method="GET", query_string={"page": "2", "q": "a b"}, headers={"X-Trace": "t1"}
    ).respond_with_json({"users": [{"id": 1}]}, headers={"X-Total": "1"})
    out = http_tool(
        {
            "url": httpserver.url_for("/users"),
            "params": {"page": 2, "q": "a b"},
            "headers": {"X-Trace": "t1"},
        },
        make_ctx(),
    )
    assert out["status_code"] == 200
    assert out["data"] == {"users": [{"id": 1}]}
    assert out["headers"]["x-total"] == "1"


@pytest.mark.parametrize("key", ["json", "payload", "body", "data"])
def test_post_body_aliases_send_json(httpserver, make_ctx, key):
    httpserver.expect_request("/items", method="POST", json={"name": "x", "n": 1}).respond_with_json(
        {"ok": True}, status=201
    )
    out = http_tool(
        {"method": "post", "endpoint": httpserver.url_for("/items"), key: {"name": "x", "n": 1}}, make_ctx()
    )
    assert out == {"status_code": 201, "headers": out["headers"], "data": {"ok": True}, "body": {"ok": True}}


def test_data_on_get_becomes_the_query_string(httpserver, make_ctx):
    httpserver.expect_request("/s", query_string={"city": "Paris", "limit": "5"}).respond_with_json([1, 2])
    out = http_tool({"url": httpserver.url_for("/s"), "data": {"city": "Paris", "limit": 5}}, make_ctx())
    assert out["data"] == [1, 2]


def test_data_query_and_body_split(httpserver, make_ctx):
    httpserver.expect_request("/x", method="PUT", query_string={"v": "1"}, json={"a": [1]}).respond_with_json(
        {}
    )
    http_tool(
        {"url": httpserver.url_for("/x"), "method": "PUT", "data": {"query": {"v": 1}, "body": {"a": [1]}}},
        make_ctx(),
    )


def test_form_encoded_body(httpserver, make_ctx):
    httpserver.expect_request("/f", method="POST", data="a=1&b=two").respond_with_data("ok")
    out = http_tool(
        {
            "url": httpserver.url_for("/f"),
            "method": "POST",
            "headers": {"Content-Type": "application/x-www-form-urlencoded"},
            "data": {"a": "1", "b": "two"},
        },
        make_ctx(),
    )
    assert out["data"] == "ok"


def test_text_and_json_looking_text_bodies(httpserver, make_ctx):
    httpserver.expect_request("/t").respond_with_data("plain words", content_type="text/plain")
    httpserver.expect_request("/j").respond_with_data('{"a": 1}', content_type="text/plain")
    httpserver.expect_request("/e").respond_with_data("", status=204)
    ctx = make_ctx()
    assert http_tool({"url": httpserver.url_for("/t")}, ctx)["data"] == "plain words"
    assert http_tool({"url": httpserver.url_for("/j")}, ctx)["data"] == {"a": 1}
    empty = http_tool({"url": httpserver.url_for("/e")}, ctx)
    assert (empty["status_code"], empty["data"]) == (204, None)


def test_404_is_a_non_retryable_error_with_http_details_and_the_response(httpserver, make_ctx):
    httpserver.expect_request("/missing").respond_with_json({"detail": "nope"}, status=404)
    with pytest.raises(ToolError) as info:
        http_tool({"url": httpserver.url_for("/missing")}, make_ctx())
    e = info.value
    assert (e.kind, e.retryable, e.code) == ("client_error", False, 404)
    assert e.details["http"]["status"] == 404
    assert e.details["http"]["headers"]["content-type"] == "application/json"
    assert e.result["data"] == {"detail": "nope"}
    assert "answered 404" in e.message


@pytest.mark.parametrize(
    "status, kind", [(429, "rate_limit"), (500, "server_error"), (502, "server_error"), (503, "server_error")]
)
def test_429_and_5xx_are_retryable(httpserver, make_ctx, status, kind):
    httpserver.expect_request("/busy").respond_with_data("busy", status=status, headers={"Retry-After": "1"})
    with pytest.raises(ToolError) as info:
        http_tool({"url": httpserver.url_for("/busy")}, make_ctx())
    assert info.value.retryable and info.value.details["http"]["status"] == status and info.value.kind == kind
    assert info.value.details["http"]["headers"]["retry-after"] == "1"


def test_429_then_success_on_the_next_attempt(httpserver, make_ctx):
    """What a retry policy sees: the first call fails retryably, the repeat succeeds."""
    httpserver.expect_ordered_request("/flaky").respond_with_data("slow down", status=429)
    httpserver.expect_ordered_request("/flaky").respond_with_json({"ok": 1})
    ctx = make_ctx()
    with pytest.raises(ToolError) as info:
        http_tool({"url": httpserver.url_for("/flaky")}, ctx)
    assert info.value.retryable
    assert http_tool({"url": httpserver.url_for("/flaky")}, ctx)["data"] == {"ok": 1}


def test_timeout_is_retryable(httpserver, make_ctx):
    def slow(_request):
        time.sleep(1.0)
        return Response("late")

    httpserver.expect_request("/slow").respond_with_handler(slow)
    started = time.monotonic()
    with pytest.raises(ToolError) as info:
        http_tool({"url": httpserver.url_for("/slow"), "timeout": 0.2}, make_ctx())
    assert time.monotonic() - started < 0.9
    assert (info.value.kind, info.value.retryable, info.value.code) == ("timeout", True, "timeout")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connection_refused_is_retryable(make_ctx):
    with pytest.raises(ToolError) as info:
        http_tool({"url": f"http://127.0.0.1:{free_port()}/x", "timeout": 2}, make_ctx())
    assert (info.value.kind, info.value.retryable) == ("connection_error", True)
    assert "ConnectError" in info.value.message


def test_missing_url_and_bad_timeout_are_config_errors(make_ctx):
    with pytest.raises(ToolError, match="'url' \\(or 'endpoint'\\) is required"):
        http_tool({"method": "GET"}, make_ctx())
    with pytest.raises(ToolError, match="timeout must be a number"):
        http_tool({"url": "http://127.0.0.1:1/", "timeout": "soon"}, make_ctx())


def test_redirects_followed_by_default_and_optionally_not(httpserver, make_ctx):
    httpserver.expect_request("/old").respond_with_data("", status=302, headers={"Location": "/new"})
    httpserver.expect_request("/new").respond_with_json({"here": True})
    ctx = make_ctx()
    assert http_tool({"url": httpserver.url_for("/old")}, ctx)["data"] == {"here": True}
    with pytest.raises(ToolError) as info:
        http_tool({"url": httpserver.url_for("/old"), "follow_redirects": False}, ctx)
    assert info.value.details["http"]["status"] == 302


def keychain_with(**records) -> Keychain:
    return Keychain(
        [],
        providers=[EnvProvider({f"NOETL_CREDENTIAL_{k.upper()}": json.dumps(v) for k, v in records.items()})],
    )


def test_auth_bearer_basic_and_header_from_the_keychain(httpserver, make_ctx):
    httpserver.expect_request("/b", headers={"Authorization": "Bearer tok-bearer-1"}).respond_with_json(
        {"who": "b"}
    )
    httpserver.expect_request(
        "/u", headers={"Authorization": "Basic YWxpY2U6cGE1NXdvcmQ="}
    ).respond_with_json({"who": "u"})
    httpserver.expect_request("/h", headers={"X-Api-Key": "hk-22"}).respond_with_json({"who": "h"})
    ctx = make_ctx(
        keychain_with(
            api={"type": "bearer", "token": "tok-bearer-1"},
            basic_cred={"type": "basic", "username": "alice", "password": "pa55word"},
            hdr={"type": "header", "header": "X-Api-Key", "value": "hk-22"},
        )
    )
    assert http_tool({"url": httpserver.url_for("/b"), "auth": "api"}, ctx)["data"] == {"who": "b"}
    assert http_tool({"url": httpserver.url_for("/u"), "auth": "basic_cred"}, ctx)["data"] == {"who": "u"}
    assert http_tool({"url": httpserver.url_for("/h"), "auth": "hdr"}, ctx)["data"] == {"who": "h"}
    assert {"tok-bearer-1", "pa55word", "hk-22"} <= ctx.redacted


def test_inline_auth_and_declared_keychain_entry(httpserver, make_ctx):
    httpserver.expect_request("/i", headers={"Authorization": "Bearer inline-tok"}).respond_with_json({})
    httpserver.expect_request("/k", headers={"Authorization": "Bearer decl-tok"}).respond_with_json({})
    ctx = make_ctx(Keychain([{"name": "openai_token", "kind": "bearer", "token": "decl-tok"}], providers=[]))
    http_tool({"url": httpserver.url_for("/i"), "auth": {"type": "bearer", "token": "inline-tok"}}, ctx)
    http_tool({"url": httpserver.url_for("/k"), "auth": "openai_token"}, ctx)
    assert "inline-tok" in ctx.redacted


def test_unknown_or_unusable_auth(make_ctx):
    ctx = make_ctx(keychain_with(odd={"type": "postgres", "db_host": "x"}))
    with pytest.raises(ToolError, match="http: unknown credential 'ghost'"):
        http_tool({"url": "http://127.0.0.1:1/", "auth": "ghost"}, ctx)
    with pytest.raises(ToolError, match="credential 'odd' has no usable auth"):
        http_tool({"url": "http://127.0.0.1:1/", "auth": "odd"}, ctx)


def test_one_pooled_client_per_execution_reused_across_threads(httpserver, make_ctx):
    httpserver.expect_request("/p").respond_with_json({"ok": True})
    ctx = make_ctx()
    errors: list[BaseException] = []

    def call():
        try:
            for _ in range(10):
                http_tool({"url": httpserver.url_for("/p")}, ctx)
        except BaseException as e:  # noqa: BLE001 - surfaced by the assert below
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert list(ctx.factory_calls.values()) == [1]
    assert len(httpserver.log) == 80


@pytest.mark.slow
def test_huge_response_body(httpserver, make_ctx):
    rows = [{"id": i, "name": f"user-{i}", "tags": ["a", "b", "c"]} for i in range(100_000)]
    httpserver.expect_request("/big").respond_with_json(rows)
    out = http_tool({"url": httpserver.url_for("/big")}, make_ctx())
    assert len(out["data"]) == 100_000 and out["data"][-1]["name"] == "user-99999"


@pytest.mark.parametrize(
    "status, kind", [(401, "auth"), (403, "auth"), (400, "client_error"), (409, "client_error")]
)
def test_4xx_kinds_are_not_retryable(httpserver, make_ctx, status, kind):
    httpserver.expect_request("/e").respond_with_json({"e": 1}, status=status)
    with pytest.raises(ToolError) as info:
        http_tool({"url": httpserver.url_for("/e")}, make_ctx())
    assert (info.value.kind, info.value.retryable) == (kind, False)


def test_host_overrides_send_requests_to_another_server(httpserver, make_ctx, monkeypatch):
    httpserver.expect_request("/v1/forecast", query_string={"latitude": "1"}).respond_with_json(
        {"stub": True}
    )
    httpserver.expect_request("/p/x").respond_with_json({"port": True})
    monkeypatch.setenv(
        "NOETL_HTTP_OVERRIDES",
        json.dumps(
            {"api.open-meteo.com": httpserver.url_for("/"), "svc.local:5555": httpserver.url_for("/p")}
        ),
    )
    ctx = make_ctx()
    assert http_tool({"url": "https://api.open-meteo.com/v1/forecast", "params": {"latitude": 1}}, ctx)[
        "data"
    ] == {"stub": True}
    assert http_tool({"url": "http://svc.local:5555/x"}, ctx)["data"] == {"port": True}
    with pytest.raises(ToolError):  # another port of that host is not overridden
        http_tool({"url": "http://svc.local:1/x", "timeout": 1}, ctx)


def test_override_pairs_syntax_and_errors():
    from noetl_dagster.tools.http import parse_overrides, rewrite_url

    o = parse_overrides("httpbin.org=http://127.0.0.1:9, Host.Example:81=http://127.0.0.1:10/base")
    assert o == {"httpbin.org": "http://127.0.0.1:9", "host.example:81": "http://127.0.0.1:10/base"}
    assert rewrite_url("https://httpbin.org/anything/a?b=1", o) == "http://127.0.0.1:9/anything/a?b=1"
    assert rewrite_url("http://host.example:81", o) == "http://127.0.0.1:10/base"
    assert rewrite_url("http://other.org/x", o) == "http://other.org/x"
    with pytest.raises(ValueError, match="expected HOST=URL"):
        parse_overrides("nonsense")
