"""Request bodies of the project's ``http.server`` servers, bounded before they are read.

:class:`BoundedBodyHandler` checks the framing of every request in ``parse_request`` (so every
route of a subclass inherits it) and reads the body there, at most ``max_body`` bytes, whatever the
headers say: a Content-Length that is not plain digits (``-1``, ``+5``, ``1_0``, two different
values) or both Content-Length and Transfer-Encoding is a 400; a Content-Length over the cap a 413
without reading a byte; a chunked body is decoded chunk by chunk and refused (413) once the chunks
pass the cap; any other transfer coding is a 501. A request without either header has no body.
The connection closes after a refusal, so unread bytes are dropped with it, never parsed as the
next request. A client that stops sending mid-body is cut off after ``timeout`` seconds.
(The registry service, on uvicorn, has the same rules in its ASGI guard: registry_service/noetl_registry/app.py.)
"""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

_DIGITS = frozenset(b"0123456789")
_MAX_CHUNK_LINE = 1024  # a chunk-size line with its extensions; past it the framing is hostile


class BodyRefused(Exception):
    """The request's body is refused: ``status`` (400, 413, 501) and a one-line reason."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def declared_length(values: list[str], max_body: int) -> int | None:
    """The body length one or more Content-Length header values declare (None: no header);
    BodyRefused (400) when it is not plain digits or the values differ, (413) over ``max_body``."""
    if not values:
        return None
    distinct = {part.strip() for value in values for part in value.split(",")}
    if len(distinct) != 1 or not (text := distinct.pop()) or not set(text.encode()) <= _DIGITS:
        raise BodyRefused(400, "bad Content-Length")
    length = int(text[:20]) if len(text) <= 20 else max_body + 1  # 20 digits: past any cap already
    if length > max_body:
        raise BodyRefused(413, f"request body over {max_body} bytes")
    return length


def read_chunked(rfile, max_body: int) -> bytes:
    """A ``Transfer-Encoding: chunked`` body, at most ``max_body`` bytes: BodyRefused (413) as soon as
    the declared chunks pass it, (400) on broken framing; the trailer is read and dropped."""
    out = bytearray()
    while True:
        line = rfile.readline(_MAX_CHUNK_LINE + 1)
        if len(line) > _MAX_CHUNK_LINE or not line.endswith(b"\n"):
            raise BodyRefused(400, "bad chunked framing")
        size_text = line.split(b";", 1)[0].strip()
        if not size_text or len(size_text) > 16 or not set(size_text) <= frozenset(b"0123456789abcdefABCDEF"):
            raise BodyRefused(400, "bad chunk size")
        size = int(size_text, 16)
        if size == 0:
            break
        if len(out) + size > max_body:
            raise BodyRefused(413, f"request body over {max_body} bytes")
        data = rfile.read(size)
        if len(data) != size or rfile.readline(3) not in (b"\r\n", b"\n"):
            raise BodyRefused(400, "bad chunked framing")
        out += data
    for _ in range(64):  # the trailer: header lines up to an empty one
        line = rfile.readline(_MAX_CHUNK_LINE + 1)
        if line in (b"\r\n", b"\n", b""):
            return bytes(out)
        if len(line) > _MAX_CHUNK_LINE:
            break
    raise BodyRefused(400, "bad chunked trailer")


def framing(headers, max_body: int) -> int | None:
    """What the headers declare, checked before a byte of the body is read: its length, or None for a
    chunked body (bounded as it is read); BodyRefused as the module says."""
    coding = headers.get_all("Transfer-Encoding") or []
    lengths = headers.get_all("Content-Length") or []
    if coding and lengths:
        raise BodyRefused(400, "both Content-Length and Transfer-Encoding")
    if coding:
        if [c.strip().lower() for c in ",".join(coding).split(",")] != ["chunked"]:
            raise BodyRefused(501, "only the chunked transfer coding is supported")
        return None
    return declared_length(lengths, max_body) or 0


def read_body(headers, rfile, max_body: int) -> bytes:
    """The request body under ``headers`` from ``rfile``, bounded as the module says."""
    length = framing(headers, max_body)
    if length is None:
        return read_chunked(rfile, max_body)
    if not length:
        return b""
    data = rfile.read(length)
    if len(data) != length:
        raise BodyRefused(400, "the body ended before its Content-Length")
    return data


class BoundedBodyHandler(BaseHTTPRequestHandler):
    """A handler whose requests carry ``self.body`` (bytes), read in ``parse_request`` under
    ``max_body``; a refused body answers its status and closes the connection before any ``do_*``."""

    max_body = 1024 * 1024
    timeout = 60  # seconds a client may stall (headers or body) before its connection is closed
    body = b""

    def handle_expect_100(self) -> bool:
        # `Expect: 100-continue` asks whether to send the body: not when it would be refused
        try:
            framing(self.headers, self.max_body)
        except BodyRefused as e:
            self.close_connection = True
            self.send_error(e.status, e.reason)
            return False
        return super().handle_expect_100()

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        try:
            self.body = read_body(self.headers, self.rfile, self.max_body)
        except BodyRefused as e:
            self.close_connection = True
            self.send_error(e.status, e.reason)
            return False
        return True  # a stalled body: TimeoutError, which handle_one_request turns into a closed connection
