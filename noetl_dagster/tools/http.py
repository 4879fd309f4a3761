"""``kind: http`` on httpx.

Inputs: ``method`` (default GET), ``url`` | ``endpoint``, ``headers``, ``params``,
a body as ``json`` | ``payload`` | ``body`` | ``form`` | ``data``, ``timeout``
(seconds, or ``{connect, read, write, pool}``; default 30), ``follow_redirects``
(default true), ``verify`` | ``verify_ssl`` (default true) and ``auth``.

``data`` follows NoETL: query string for GET/DELETE/HEAD, JSON body otherwise;
``data: {query: …, body: …}`` sets both explicitly. A string body is sent as is.
A mapping body with ``Content-Type: application/x-www-form-urlencoded`` is form-encoded.

``auth`` is a keychain/credential name or an inline mapping; either resolves to
one of ``{type: bearer, token}``, ``{type: basic, username, password}`` or
``{type: header, header, value}`` (``access_token`` / ``id_token`` / ``api_key``
count as a bearer token when no type is given).

Result: ``{status_code, headers, data, body}`` with ``data`` the parsed JSON
body, else the text (``body`` is the same value, for playbooks written against
the Rust engine's result shape). A non-2xx answer is an error outcome
(``http.status``/``http.headers``, the response as the error's result) whose
``error.kind`` is ``server_error`` (5xx), ``rate_limit`` (429), ``auth`` (401,
403) or ``client_error`` (other statuses); 408, 425, 429, 5xx, timeouts
(``timeout``) and connection errors (``connection_error``) are retryable. One
pooled ``httpx.Client`` per execution.

Host overrides: ``NOETL_HTTP_OVERRIDES`` (a JSON object, or ``HOST=URL`` pairs
separated by commas) sends requests for ``HOST`` (or ``HOST:PORT``) to ``URL``
instead, keeping path and query — how the conformance run points fixtures at
local stub servers (``noetl-dagster conformance --http-override``).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from noetl_dagster.engine.usage import count_network
from noetl_dagster.tools.configs import HttpConfig
from noetl_dagster.tools.credentials import lookup_credential
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool

DEFAULT_TIMEOUT = 30.0
RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
QUERY_METHODS = frozenset({"GET", "DELETE", "HEAD", "OPTIONS"})
# Enough for a parallel loop's max_in_flight (default 16) with room for nested pipelines.
POOL_LIMITS = httpx.Limits(max_connections=64, max_keepalive_connections=32)


OVERRIDES_ENV = "NOETL_HTTP_OVERRIDES"
_overrides_cache: tuple[str, dict[str, str]] = ("", {})


def parse_overrides(text: str) -> dict[str, str]:
    """``{"host[:port]": "http://127.0.0.1:8000"}`` from JSON or ``host=url,host=url``."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError(f"{OVERRIDES_ENV} must be a JSON object")
        return {str(k).lower(): str(v) for k, v in value.items()}
    out: dict[str, str] = {}
    for pair in text.replace("\n", ",").split(","):
        if not pair.strip():
            continue
        host, sep, url = pair.partition("=")
        if not sep or not host.strip() or not url.strip():
            raise ValueError(f"bad http override {pair.strip()!r}: expected HOST=URL")
        out[host.strip().lower()] = url.strip()
    return out


def http_overrides() -> dict[str, str]:
    global _overrides_cache
    raw = os.environ.get(OVERRIDES_ENV, "")
    if raw != _overrides_cache[0]:
        _overrides_cache = (raw, parse_overrides(raw))
    return _overrides_cache[1]


def rewrite_url(url: str, overrides: Mapping[str, str]) -> str:
    """``url`` with its scheme and host replaced when ``overrides`` names the host."""
    if not overrides:
        return url
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        port = parts.port
    except ValueError:
        return url
    target = (overrides.get(f"{host}:{port}") if port else None) or overrides.get(host)
    if not target:
        return url
    rest = parts.path  # "http://host" stays without a trailing slash, so "{{ base }}/x" keeps one
    if parts.query:
        rest += "?" + parts.query
    return target.rstrip("/") + rest


_client_lock = threading.Lock()
_ssl_context: ssl.SSLContext | None = None


def _verified_ssl() -> ssl.SSLContext:
    # loading the CA bundle costs tens of milliseconds: once per process, not per execution
    global _ssl_context
    if _ssl_context is None:
        _ssl_context = httpx.create_ssl_context()
    return _ssl_context


def _client(ctx: ToolContext, verify: bool) -> httpx.Client:
    # the lock makes the parallel iterations of a loop share one client instead of racing to build several
    with _client_lock:
        return ctx.resource(
            f"http.client:verify={verify}",
            lambda: httpx.Client(verify=_verified_ssl() if verify else False, limits=POOL_LIMITS),
        )


def _timeout(value: Any) -> httpx.Timeout:
    if value is None or value == "":
        return httpx.Timeout(DEFAULT_TIMEOUT)
    if isinstance(value, Mapping):
        known = {k: float(v) for k, v in value.items() if k in ("connect", "read", "write", "pool")}
        return httpx.Timeout(float(value.get("total", DEFAULT_TIMEOUT)), **known)
    try:
        return httpx.Timeout(float(value))
    except (TypeError, ValueError):
        raise ToolError(
            f"http: timeout must be a number of seconds, got {value!r}", kind="config_error"
        ) from None


def _flag(value: Any, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() not in ("false", "0", "no", "off", "")
    return bool(value)


def auth_headers(auth: Any, ctx: ToolContext) -> tuple[dict[str, str], httpx.Auth | None]:
    """Headers (and an httpx auth) for a credential name or an inline auth mapping."""
    if auth is None or auth == "":
        return {}, None
    if isinstance(auth, str):
        record = lookup_credential(ctx, auth, "http")
        label = f"credential {auth!r}"
    elif isinstance(auth, Mapping):
        ref = None if auth.get("type") else (auth.get("credential") or auth.get("name"))
        record = dict(auth)
        if ref:  # {credential: name, ...overrides}
            overrides = {k: v for k, v in auth.items() if k not in ("credential", "name")}
            record = {**lookup_credential(ctx, str(ref), "http"), **overrides}
        label = f"credential {ref!r}" if ref else "inline auth"
    else:
        raise ToolError(
            f"http: auth must be a credential name or a mapping, got {type(auth).__name__}",
            kind="config_error",
        )
    kind = str(record.get("type") or record.get("kind") or "").lower()
    token = (
        record.get("token") or record.get("access_token") or record.get("id_token") or record.get("api_key")
    )
    if kind in ("basic",) or (
        not kind and record.get("username") is not None and record.get("password") is not None
    ):
        user, pw = record.get("username") or record.get("user"), record.get("password")
        if user is None or pw is None:
            raise ToolError(f"http: {label} (basic) needs username and password", kind="auth_error")
        ctx.redact(str(pw))
        # the Authorization header a server may echo back: base64 of user:password
        ctx.redact(base64.b64encode(f"{user}:{pw}".encode()).decode())
        return {}, httpx.BasicAuth(str(user), str(pw))
    if kind in ("header", "api_key", "apikey"):
        header = record.get("header") or record.get("header_name") or "X-API-Key"
        value = record.get("value") or token
        if not value:
            raise ToolError(f"http: {label} (header) has no value", kind="auth_error")
        ctx.redact(str(value))
        return {str(header): str(value)}, None
    if kind in ("bearer", "oauth2", "token", "") and token:
        ctx.redact(str(token))
        return {"Authorization": f"Bearer {token}"}, None
    raise ToolError(
        f"http: {label} has no usable auth (need a bearer token, basic username/password, or header/value)",
        kind="auth_error",
    )


def _body(method: str, inputs: Mapping[str, Any], headers: Mapping[str, str]) -> tuple[dict[str, Any], Any]:
    """httpx keyword arguments for the body, and extra query params from ``data``."""
    extra_params: Any = None
    body: Any = None
    for key in ("json", "payload", "body", "form"):
        if inputs.get(key) is not None:
            body = inputs[key]
            if key == "form":
                return {"data": body}, None
            break
    data = inputs.get("data")
    if data is not None:
        if (
            isinstance(data, Mapping)
            and ("query" in data or "body" in data)
            and set(data) <= {"query", "body"}
        ):
            extra_params = data.get("query")
            if body is None:
                body = data.get("body")
        elif method in QUERY_METHODS:
            extra_params = data
        elif body is None:
            body = data
    if body is None:
        return {}, extra_params
    ctype = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    if isinstance(body, (bytes, bytearray)):
        return {"content": bytes(body)}, extra_params
    if isinstance(body, str):
        return {"content": body.encode()}, extra_params
    if "x-www-form-urlencoded" in ctype and isinstance(body, Mapping):
        return {
            "data": {k: v if isinstance(v, str) else json.dumps(v) for k, v in body.items()}
        }, extra_params
    return {"json": body}, extra_params


def _merge_params(*parts: Any) -> Any:
    merged: dict[str, Any] = {}
    for p in parts:
        if p is None or p == "":
            continue
        if not isinstance(p, Mapping):
            raise ToolError(f"http: params must be a mapping, got {type(p).__name__}", kind="config_error")
        for k, v in p.items():
            if v is None:
                continue
            merged[str(k)] = v if isinstance(v, (str, int, float, list)) else json.dumps(v)
    return merged or None


def _parse(resp: httpx.Response) -> Any:
    if not resp.content:
        return None
    ctype = resp.headers.get("content-type", "")
    if "json" in ctype:
        try:
            return resp.json()
        except ValueError:
            return resp.text
    text = resp.text
    stripped = text.lstrip()
    if stripped[:1] in ("{", "["):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def error_kind(status: int) -> str:
    if status == 429:
        return "rate_limit"
    if status in (401, 403):
        return "auth"
    if status >= 500:
        return "server_error"
    return "client_error"


MAX_REDIRECTS = 20  # httpx's default


def _follow_checked(client: httpx.Client, resp: httpx.Response, check_url: Any) -> httpx.Response:
    """Follow redirects one hop at a time, each hop's URL checked before it is requested (httpx
    builds the hop: method, body and the headers it keeps across origins, as when it follows)."""
    for _ in range(MAX_REDIRECTS):
        nxt = resp.next_request
        if nxt is None:
            return resp
        check_url(str(nxt.url))
        resp.close()
        resp = client.send(nxt, follow_redirects=False)
    if resp.next_request is None:
        return resp
    raise ToolError(f"http: more than {MAX_REDIRECTS} redirects", kind="client_error")


def http_tool(inputs: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """HTTP request with httpx; non-2xx is an error outcome."""
    url = inputs.get("url") or inputs.get("endpoint")
    if not url or not isinstance(url, str):
        raise ToolError("http: 'url' (or 'endpoint') is required", kind="config_error")
    # a generated playbook's request passed the trust gate (allow_hosts) at dispatch; the URL as httpx
    # reads it (no parser difference) and every redirect hop pass it here
    check_url = getattr(ctx, "check_url", None) if getattr(ctx, "restricted", False) else None
    if check_url is not None:
        try:
            check_url(str(httpx.URL(url)))
        except httpx.InvalidURL as e:
            raise ToolError(f"http: invalid url {url!r}: {e}", kind="config_error") from None
    url = rewrite_url(url, http_overrides())
    method = str(inputs.get("method") or "GET").upper()
    headers = {str(k): str(v) for k, v in (inputs.get("headers") or {}).items() if v is not None}
    auth_hdrs, basic = auth_headers(inputs.get("auth"), ctx)
    headers.update(auth_hdrs)
    body_kw, data_params = _body(method, inputs, headers)
    params = _merge_params(inputs.get("params"), data_params)
    verify = _flag(inputs.get("verify", inputs.get("verify_ssl")), True)
    client = _client(ctx, verify)
    follow = _flag(inputs.get("follow_redirects"), True)
    try:
        resp = client.request(
            method,
            url,
            headers=headers,
            params=params,
            auth=basic,
            timeout=_timeout(inputs.get("timeout", inputs.get("timeout_seconds"))),
            follow_redirects=follow and check_url is None,
            **body_kw,
        )
        if follow and check_url is not None:
            resp = _follow_checked(client, resp, check_url)
    except httpx.TimeoutException as e:
        raise ToolError(
            f"http: {method} {url} timed out ({type(e).__name__})",
            kind="timeout",
            retryable=True,
            code="timeout",
        ) from None
    except httpx.InvalidURL as e:
        raise ToolError(f"http: invalid url {url!r}: {e}", kind="config_error") from None
    except httpx.UnsupportedProtocol as e:
        raise ToolError(f"http: unsupported url {url!r}: {e}", kind="config_error") from None
    except httpx.TransportError as e:
        raise ToolError(
            f"http: {method} {url} failed: {type(e).__name__}: {e}",
            kind="connection_error",
            retryable=True,
            code="connection_error",
        ) from None

    # body bytes on the wire (compressed as received); headers are not counted
    sent = resp.request.headers.get("content-length")
    count_network(
        resp.request.url.host, int(sent) if sent and sent.isdigit() else 0, resp.num_bytes_downloaded
    )
    data = _parse(resp)
    result = {"status_code": resp.status_code, "headers": dict(resp.headers), "data": data, "body": data}
    if not 200 <= resp.status_code < 300:
        raise ToolError(
            f"http: {method} {url} answered {resp.status_code} {resp.reason_phrase}",
            kind=error_kind(resp.status_code),
            retryable=resp.status_code in RETRYABLE_STATUS or resp.status_code >= 500,
            code=resp.status_code,
            details={"http": {"status": resp.status_code, "headers": result["headers"]}},
            result=result,
        )
    return result


register_tool(
    "http",
    http_tool,
    config=HttpConfig,
    description="HTTP request (httpx); result {status_code, headers, data}",
)
