"""Request bodies are capped before they are read, on every server the project starts (issue 41.4).

Each server runs in a child process on 127.0.0.1 and is attacked over a raw socket, as the issue's
probe did: ``Content-Length: -1`` then a large body (``POST /login`` read it all: a 300 MB body grew
the dashboard by 300 MB without any key), a chunked body over the cap, a Content-Length smaller than
the body. Each answers 400/413 and its peak resident memory (VmHWM, /proc) grows by far less than
what was sent: the bound is generous (the cap is KiBs to a few MiBs; the attempt is 300 MB).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

pytestmark = pytest.mark.slow

ATTEMPT = 300 * 1024 * 1024
GROWTH = 50 * 1024 * 1024
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DASHBOARD = """
import sys
from noetl_analytics.dashboard_access import KeyAuth
from noetl_analytics.interactive import make_server
from noetl_analytics.store import FactsStore
from noetl_registry.service import Registry
d = sys.argv[1]
server = make_server(FactsStore(f"chdb://{d}/facts"), port=0, auth=KeyAuth(Registry(f"sqlite:///{d}/registry.db")))
print(server.server_address[1], flush=True)
server.serve_forever()
"""

STUB = """
import time
from noetl_dagster.conformance.stubs import HttpBin
stub = HttpBin()
print(stub.url.rsplit(":", 1)[1].rstrip("/"), flush=True)
while True:
    time.sleep(60)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp_path, which: str) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    if which == "registry":
        port = _free_port()
        args = [
            "-m",
            "noetl_registry.cli",
            "serve",
            "--db",
            f"sqlite:///{tmp_path / 'reg.db'}",
            "--port",
            str(port),
        ]
        p = subprocess.Popen(
            [sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
    else:
        script = DASHBOARD if which == "dashboard" else STUB
        p = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
        port = int(p.stdout.readline().strip() or 0)
    for _ in range(600):  # until it accepts connections (the registry prints nothing on stdout)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            return p, port
        except OSError:
            if p.poll() is not None:
                break
            time.sleep(0.1)
    p.kill()
    raise AssertionError(f"{which} did not start: {p.stderr.read()[-2000:]}")


def _hwm(pid: int) -> int:
    """Peak resident bytes of ``pid`` so far (VmHWM): a body read whole shows here even once freed."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _headers(path: str, extra: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            f"{extra}\r\n").encode()  # fmt: skip


def _status(port: int, head: bytes, body: bytes) -> int:
    """The status line's code for ``head`` + ``body``, read while the body is still being sent (a
    server refusing mid-body closes the connection under the sender); the write side is closed
    after, so a server that reads to the end of the stream answers too."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:

        def send() -> None:
            try:
                s.sendall(head + body)
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        data = b""
        try:
            while b"\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        sender.join(60)
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0


def _flood(port: int, head: bytes, chunk: bytes) -> None:
    """Send ``head`` then ``chunk`` until ATTEMPT bytes went out or the server closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        try:
            s.sendall(head)
            sent = 0
            while sent < ATTEMPT:
                s.sendall(chunk)
                sent += len(chunk)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
        except OSError:  # refused mid-body: the server closed (reset) the connection, as it should
            pass


_MB = b"k=" + b"x" * (1024 * 1024 - 2)
_CHUNK = b"%x\r\n" % len(_MB) + _MB + b"\r\n"
CASES = {
    # name: (headers after the request line, small body for the status, flood chunk, statuses)
    "negative length": ("Content-Length: -1\r\n", b"key=x", _MB, (400,)),
    "signed length": ("Content-Length: +5\r\n", b"key=x", _MB, (400,)),
    "chunked over the cap": ("Transfer-Encoding: chunked\r\n", _CHUNK * 20 + b"0\r\n\r\n", _CHUNK, (413,)),
    "length over the cap": ("Content-Length: 314572800\r\n", b"key=x", _MB, (413,)),
    "length and chunked": ("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"key=x", _MB, (400,)),
}
SERVERS = {"dashboard": "/login", "registry": "/v1/resources", "stub": "/post"}


@pytest.fixture(scope="module", params=sorted(SERVERS))
def server(request, tmp_path_factory):
    p, port = _start(tmp_path_factory.mktemp(request.param), request.param)
    yield request.param, p, port
    p.kill()
    p.wait(30)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_body_is_refused_before_it_is_read(server, case):
    which, p, port = server
    extra, small, chunk, statuses = CASES[case]
    head = _headers(SERVERS[which], extra)
    got = _status(port, head, small)
    if which == "registry" and case in ("negative length", "signed length", "length and chunked"):
        statuses = (400, 422)  # uvicorn's HTTP parser refuses the framing before the app (its own 400)
    assert got in statuses, (which, case, got)
    before = _hwm(p.pid)
    _flood(port, head, chunk)
    assert p.poll() is None, f"{which} died"
    grown = _hwm(p.pid) - before
    assert grown < GROWTH, f"{which} grew by {grown >> 20} MiB on a {ATTEMPT >> 20} MiB body ({case})"
    assert _status(port, _headers(SERVERS[which], "Content-Length: 0\r\n"), b"") not in (0, 500), (
        "still serving"
    )


def test_a_length_smaller_than_the_body_reads_only_the_length(server):
    """The rest of the stream is never a body: on HTTP/1.0 the connection closes after the answer; on
    keep-alive it is the next request line, refused past 64 KiB (no request is smuggled in it)."""
    which, p, port = server
    before = _hwm(p.pid)
    _flood(port, _headers(SERVERS[which], "Content-Length: 5\r\n"), _MB)
    assert p.poll() is None
    assert _hwm(p.pid) - before < GROWTH


def test_bounded_body_reader_rules():
    """The framing rules on their own (the stub and the dashboard share them)."""
    import io
    from email.message import Message

    from noetl_dagster.util.http_body import BodyRefused, read_body

    def body(headers: dict[str, str], raw: bytes, cap: int = 10) -> bytes | int:
        m = Message()
        for k, v in headers.items():
            m[k] = v
        try:
            return read_body(m, io.BytesIO(raw), cap)
        except BodyRefused as e:
            return e.status

    assert body({}, b"ignored") == b""
    assert body({"Content-Length": "3"}, b"abcdef") == b"abc"
    assert body({"Content-Length": "3, 3"}, b"abc") == b"abc"
    for bad in ("-1", "+3", "1_0", " ", "0x3", "3, 4", "٣"):
        assert body({"Content-Length": bad}, b"abc") == 400, bad
    assert body({"Content-Length": "11"}, b"x" * 11) == 413
    assert body({"Content-Length": "9" * 400}, b"x") == 413
    assert body({"Content-Length": "5"}, b"abc") == 400  # the stream ended first
    assert body({"Transfer-Encoding": "chunked"}, b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n") == b"abcde"
    assert body({"Transfer-Encoding": "chunked"}, b"6\r\nabcdef\r\n6\r\nghijkl\r\n0\r\n\r\n") == 413
    assert body({"Transfer-Encoding": "chunked"}, b"fffffffffffffffffff\r\n") == 400
    assert body({"Transfer-Encoding": "chunked"}, b"-1\r\nabc\r\n0\r\n\r\n") == 400
    assert body({"Transfer-Encoding": "gzip, chunked"}, b"") == 501
    assert body({"Transfer-Encoding": "chunked", "Content-Length": "3"}, b"abc") == 400


def test_a_stalled_body_is_cut_off():
    """A client that declares a body and stops sending (slowloris) loses its connection after the
    handler's timeout instead of holding a thread forever (the base class had no timeout)."""
    from http.server import ThreadingHTTPServer

    from example_project.stub import _Handler as ExampleStub
    from noetl_analytics.interactive import _Handler as Dashboard
    from noetl_dagster.conformance.stubs import HttpBin
    from noetl_dagster.util.http_body import BoundedBodyHandler

    stub = HttpBin()
    try:
        for cls in (Dashboard, ExampleStub, stub._server.RequestHandlerClass):
            assert issubclass(cls, BoundedBodyHandler) and 0 < cls.timeout <= 120, cls
    finally:
        stub.close()

    class Handler(BoundedBodyHandler):
        timeout = 1

        def do_POST(self) -> None:  # noqa: N802
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_a) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with socket.create_connection(srv.server_address, timeout=120) as s:
            s.sendall(_headers("/", "Content-Length: 100\r\n") + b"abc")
            assert s.recv(100) == b""  # closed by the server, no answer (the client's 120 s never run out)
    finally:
        srv.shutdown()
        srv.server_close()


def test_expect_100_continue_is_answered_by_the_refusal():
    """A client asking `Expect: 100-continue` for a body over the cap gets the 413 at once, not a
    `100 Continue` inviting it to send (http.server answered 100 before any check)."""
    from noetl_dagster.conformance.stubs import HttpBin

    stub = HttpBin()
    try:
        port = int(stub.url.rsplit(":", 1)[1].rstrip("/"))
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(_headers("/post", "Content-Length: 999999999\r\nExpect: 100-continue\r\n"))
            assert s.recv(12) == b"HTTP/1.1 413"
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(_headers("/post", "Content-Length: 2\r\nExpect: 100-continue\r\n"))
            assert s.recv(12) == b"HTTP/1.1 100"  # a body under the cap is still invited
    finally:
        stub.close()
