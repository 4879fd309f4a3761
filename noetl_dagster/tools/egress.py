"""The egress proxy of the OS sandbox (tools/sandbox.py): the only way out of its network namespace.

An HTTP proxy on a unix socket (bind-mounted into the sandbox, where a forwarder listens on
``127.0.0.1:PROXY_PORT`` for ``HTTP(S)_PROXY``): ``CONNECT host:port`` (https and any TLS) and
absolute-form requests (``GET http://host:port/…``, plain http) to a host the grant's
``allow_hosts`` lists (engine.trust.host_refusal: the same rule as ``kind: http``). Anything else is
answered ``403`` with a one-line reason, and reported to ``on_refuse`` (the task's log). Names are
resolved here, by the worker (the sandbox has no DNS), and a name that resolves to a loopback or
link-local address is refused (the worker's own services, a cloud metadata endpoint): only an
allow_hosts entry that writes the address itself reaches one. One proxy serves one task call (or one MCP
session) and is closed with it.
"""

from __future__ import annotations

import os
import socket
import socketserver
import tempfile
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

from noetl_dagster.engine.trust import host_refusal, resolve_checked

MAX_HEAD = 64 * 1024  # request line and headers
CONNECT_TIMEOUT = 30.0
MAX_CONNECTIONS = 64  # per proxy (one task call)


def _pump(a: socket.socket, b: socket.socket) -> None:
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    finally:
        try:
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass


_resolve = resolve_checked  # the gate's rule (kind: http follows it too), with the address it checked


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        conn: socket.socket = self.request
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(65536)
            if not chunk or len(head) + len(chunk) > MAX_HEAD:
                return
            head += chunk
        head, _, rest = head.partition(b"\r\n\r\n")
        line, *headers = head.decode("latin-1").split("\r\n")
        parts = line.split(" ")
        if len(parts) != 3:
            return self._answer(400, "egress: not an HTTP request")
        method, target, version = parts
        if method.upper() == "CONNECT":
            url = f"https://{target}"
        elif target.lower().startswith("http://"):
            url = target
        else:
            return self._answer(400, f"egress: {method} {target[:100]!r} is not a proxy request")
        why = host_refusal(url, self.server.hosts)
        try:
            split = urlsplit(url)
            host, port = split.hostname or "", split.port or 80
        except ValueError:
            why = why or f"egress: bad target {target[:100]!r}"
        if why:
            self.server.refused(f"egress refused: {method} {target[:200]}: {why}")
            return self._answer(403, f"egress refused: {why}")
        try:
            addr, why = _resolve(host, port)
            if why:
                self.server.refused(f"egress refused: {method} {target[:200]}: {why}")
                return self._answer(403, f"egress refused: {why}")
            up = socket.create_connection(
                addr, timeout=CONNECT_TIMEOUT
            )  # the address checked, not a new lookup
        except OSError as e:
            return self._answer(502, f"egress: cannot connect to {host}:{port}: {e.strerror or e}")
        up.settimeout(None)
        with up:
            if method.upper() == "CONNECT":
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:  # origin-form to the server, one request per connection
                path = split.path or "/"
                keep = [h for h in headers if h.split(":", 1)[0].strip().lower()
                        not in ("proxy-connection", "proxy-authorization", "connection", "keep-alive")]  # fmt: skip
                first = f"{method} {path}{'?' + split.query if split.query else ''} {version}\r\n"
                up.sendall(
                    (first + "".join(h + "\r\n" for h in keep) + "Connection: close\r\n\r\n").encode(
                        "latin-1"
                    )
                )
            if rest:
                up.sendall(rest)
            back = threading.Thread(target=_pump, args=(up, conn), daemon=True)
            back.start()
            _pump(conn, up)
            back.join()

    def _answer(self, code: int, text: str) -> None:
        body = (text.replace("\n", " ") + "\n").encode()
        reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}[code]
        head = f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        try:
            self.request.sendall(head.encode() + body)
        except OSError:
            pass


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    hosts: frozenset[str]
    refused: Callable[[str], None]
    slots: threading.BoundedSemaphore  # connections at once: each holds two of the worker's threads

    def process_request(self, request: socket.socket, client_address: object) -> None:
        if not self.slots.acquire(blocking=False):
            self.refused(f"egress refused: more than {MAX_CONNECTIONS} connections at once")
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: socket.socket, client_address: object) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class EgressProxy:
    """``with EgressProxy(hosts, uid=…) as proxy:`` ``proxy.socket_path`` is for sandbox.confine."""

    def __init__(self, hosts: frozenset[str] | None, *, uid: int | None = None,
                 on_refuse: Callable[[str], None] | None = None):  # fmt: skip
        self.hosts = frozenset(hosts or ())
        self.uid = uid
        self.on_refuse = on_refuse
        self.socket_path = ""
        self._dir: str | None = None
        self._server: _Server | None = None

    def __enter__(self) -> EgressProxy:
        self._dir = tempfile.mkdtemp(prefix="noetl-egress-")  # short: a unix socket path is ≤ 107 bytes
        self.socket_path = os.path.join(self._dir, "proxy.sock")
        server = _Server(self.socket_path, _Handler)
        server.hosts = self.hosts
        server.refused = self.on_refuse or (lambda _msg: None)
        server.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        if self.uid is not None and os.geteuid() == 0:  # the sandbox's uid connects; nobody else can
            os.chown(self._dir, self.uid, self.uid)
            os.chown(self.socket_path, self.uid, self.uid)
        self._server = server
        threading.Thread(target=server.serve_forever, name="noetl-egress", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._dir is not None:
            for name in os.listdir(self._dir):
                os.unlink(os.path.join(self._dir, name))
            os.rmdir(self._dir)
