"""A loopback proxy in front of Postgres that counts what clients send, message by message.

Used by the round-trip guard (tests/storage/test_pg_round_trips.py) and ``bench_throughput
--round-trips``: the server's own statistics (``pg_stat_statements``, ``pg_stat_database``) are
either not loaded or flushed late, and a client-side wrapper would count calls, not what went over
the wire. Each client connection gets its own upstream connection; bytes are forwarded unchanged.

Counted per frontend message type (protocol 3): ``Q`` simple query, ``P`` parse (a statement
prepared), ``B`` bind, ``E`` execute, ``S`` sync, ``X`` terminate; plus ``connections``. A client
waits for the server once per ``Q`` and once per ``S`` (the extended protocol answers at Sync),
so ``round_trips`` is their sum. Connect with ``sslmode=disable`` and ``gssencmode=disable``
(:meth:`WireCounter.url`): an encrypted stream cannot be read.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections import Counter
from urllib.parse import urlsplit, urlunsplit

SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST = 80877103, 80877104, 80877102


class WireCounter:
    """``with WireCounter("127.0.0.1", 5432) as wc: ... wc.url(url) ... wc.snapshot()``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 5432):
        self.upstream = (host, port)
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._closed = False
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, name="pgwire-accept", daemon=True).start()

    def url(self, url: str) -> str:
        """``url`` pointed at this proxy, unencrypted (its other query parameters kept)."""
        parts = urlsplit(url)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        netloc_s = f"{netloc[0]}@{host}" if len(netloc) == 2 else host
        query = "&".join(q for q in (parts.query, "sslmode=disable&gssencmode=disable") if q)
        return urlunsplit((parts.scheme, netloc_s, parts.path, query, parts.fragment))

    def snapshot(self) -> Counter[str]:
        with self._lock:
            out = Counter(self.counts)
        out["round_trips"] = out["Q"] + out["S"]
        return out

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks += [client, server]
            with self._lock:
                self.counts["connections"] += 1
            threading.Thread(target=self._frontend, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _shut(dst)

    def _frontend(self, src: socket.socket, dst: socket.socket) -> None:
        """Client to server: count each complete message, then forward (counted before the server can
        answer it, so a client that got its answer finds it counted)."""
        buf = b""
        started = False  # the untyped start-up messages come first
        try:
            while data := src.recv(65536):
                buf += data
                while True:
                    if not started:
                        if len(buf) < 8:
                            break
                        n, code = struct.unpack("!ii", buf[:8])
                        if len(buf) < n:
                            break
                        buf = buf[n:]
                        if code in (SSL_REQUEST, GSSENC_REQUEST):
                            continue  # refused by the server: the client goes on unencrypted (or fails)
                        started = code != CANCEL_REQUEST
                        continue
                    if len(buf) < 5:
                        break
                    n = struct.unpack("!i", buf[1:5])[0]
                    if len(buf) < n + 1:
                        break
                    kind = chr(buf[0])
                    buf = buf[n + 1 :]
                    with self._lock:
                        self.counts[kind] += 1
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _shut(dst)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for s in self._socks:
            _shut(s)

    def __enter__(self) -> WireCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _shut(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
