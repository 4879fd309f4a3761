"""Network bytes of object-store traffic (S3 through s3fs/aiobotocore, GCS through gcsfs, Azure Blob
through adlfs) in the running task's measured usage (issue 18.1; ``engine/usage.py``).

Both clients speak HTTP/1.1 through aiohttp, so every exchange is counted from the aiohttp
response once the request is sent and the response head has arrived:

- out: the request line, the request headers as aiohttp sent them (``Host``, ``User-Agent``,
  ``Authorization``, ``Content-Length``… — ``request_info.headers``) and the body
  (``Content-Length``; aiobotocore sends every S3 body with one);
- in: the status line, the raw response headers (``raw_headers``, byte for byte) and the body
  bytes that arrived on the connection (``StreamReader.total_bytes`` when the body ends: the
  whole body even if the reader stopped early, and no decompression, aiobotocore asks for
  ``Accept-Encoding: identity``).

That is the HTTP message bytes exactly (the test compares them with a TCP relay's counts),
except interim ``100 Continue`` responses, which aiohttp does not show the client (25 bytes
each), and TLS record overhead on https endpoints. The bytes go to
:func:`~noetl_dagster.engine.usage.count` with the endpoint host's class from
:func:`~noetl_dagster.engine.usage.in_cluster` (cached per host): in-cluster or egress exactly as
for HTTP and Postgres.

Hooks: S3 through aiobotocore's documented ``AioConfig(http_session_cls=...)`` (a subclass of
its aiohttp session that counts after ``send``), GCS through an aiohttp ``TraceConfig``
(``on_request_end``) in gcsfs's ``session_kwargs``. The client's event loop runs the request
in a copy of the calling task's context (fsspec's ``sync``), so the bytes land in the right
task's usage; outside a task nothing is counted.
"""

from __future__ import annotations

import contextvars
from functools import lru_cache
from itertools import chain
from typing import Any

from noetl_dagster.engine.usage import count, in_cluster

_EOL = 2  # CRLF


@lru_cache(maxsize=256)
def _egress(host: str | None) -> bool:
    """``not in_cluster(host)``, remembered per endpoint host (the IP parse costs more than the count)."""
    return not in_cluster(host)


def _count(host: str | None, sent: int, received: int) -> None:
    """:func:`~noetl_dagster.engine.usage.count_network` with the host's class cached."""
    if _egress(host):
        count(net_out_bytes=sent, net_in_bytes=received, egress_bytes=sent)
    else:
        count(net_out_bytes=sent, net_in_bytes=received)


def _request_bytes(resp: Any) -> int:
    """Request line + headers + body of the request ``resp`` answers (HTTP/1.1 framing)."""
    info = resp.request_info
    # "METHOD /path?query HTTP/1.1\r\n"
    n = len(info.method) + 1 + len(info.url.raw_path_qs.encode()) + len(" HTTP/1.1") + _EOL
    headers = info.headers
    # "Name: value\r\n" per header, then an empty line
    n += len("".join(chain.from_iterable(headers.items())).encode()) + 4 * len(headers) + _EOL
    length = headers.get("Content-Length")
    if length and length.isdigit():
        n += int(length)
    return n


def _response_head_bytes(resp: Any) -> int:
    """Status line + raw headers of ``resp`` as received."""
    v = resp.version
    status = f"HTTP/{v.major}.{v.minor} {resp.status} {resp.reason or ''}" if v else f"HTTP/1.1 {resp.status}"
    n = len(status.encode()) + _EOL
    raw = resp.raw_headers
    return n + sum(map(len, chain.from_iterable(raw))) + 4 * len(raw) + _EOL


def count_exchange(resp: Any) -> None:
    """Count one object-store HTTP exchange (an ``aiohttp.ClientResponse`` whose head has arrived)
    in the running task's usage: request and response head now, the response body when it ends."""
    try:
        host = resp.request_info.url.host
        _count(host, _request_bytes(resp), _response_head_bytes(resp))
    except (AttributeError, TypeError, ValueError):  # not an aiohttp response: nothing to count
        return
    content = getattr(resp, "content", None)
    if content is None or not hasattr(content, "on_eof"):
        return
    ctx = contextvars.copy_context()  # the body may end in a callback outside the task's context

    def _body_done() -> None:
        ctx.run(_count, host, 0, int(getattr(content, "total_bytes", 0) or 0))

    content.on_eof(_body_done)


@lru_cache(maxsize=1)
def s3_session_cls() -> type:
    """aiobotocore's aiohttp session, counting each exchange (for ``AioConfig(http_session_cls=...)``)."""
    from aiobotocore.httpsession import AIOHTTPSession  # noqa: PLC0415 - s3fs's client, optional

    class CountingAIOHTTPSession(AIOHTTPSession):
        async def send(self, request: Any) -> Any:
            response = await super().send(request)
            count_exchange(getattr(response, "raw", None))
            return response

    CountingAIOHTTPSession.__module__ = __name__
    CountingAIOHTTPSession.__qualname__ = "CountingAIOHTTPSession"
    return CountingAIOHTTPSession


def s3_config_kwargs(config_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """``config_kwargs`` for ``s3fs.S3FileSystem`` with the counting session (unless one is given)."""
    out = dict(config_kwargs or {})
    out.setdefault("http_session_cls", s3_session_cls())
    return out


@lru_cache(maxsize=1)  # one object: fsspec caches filesystems by their arguments
def aiohttp_trace_config() -> Any:
    """An ``aiohttp.TraceConfig`` counting each exchange (gcsfs: ``session_kwargs={"trace_configs": [...]}``)."""
    import aiohttp  # noqa: PLC0415

    async def _on_request_end(_session: Any, _ctx: Any, params: Any) -> None:
        count_exchange(params.response)

    tc = aiohttp.TraceConfig()
    tc.on_request_end.append(_on_request_end)
    tc.freeze()
    return tc


def azure_response_hook(response: Any) -> None:
    """Count one Azure Blob exchange (adlfs's client: ``raw_response_hook``, which the storage SDK
    calls for every attempt, retries too) from the aiohttp response under azure-core's transport."""
    count_exchange(getattr(getattr(response, "http_response", None), "internal_response", None))
