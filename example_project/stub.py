"""A loopback HTTP service for the example playbooks (no outside network needed).

``ensure_stub()`` starts it once per process on ``127.0.0.1`` (a free port) in
a daemon thread and returns its base URL; the first step of the HTTP example
calls it, so the service lives in the process that runs the steps (the local
runner, or the Dagster run worker with the in-process executor).

Routes:
- ``GET /customers`` -> a list of customers
- ``GET /customers/<id>`` -> one customer's order stats (404 for unknown ids)
- ``GET /flaky?key=K`` -> 503 on the first call for each key, then 200 (retry demo)
- ``POST /echo`` -> the JSON body back with a count
"""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from noetl_dagster.util.http_body import BoundedBodyHandler

CUSTOMERS = [
    {"id": i, "name": name, "country": country}
    for i, (name, country) in enumerate(
        [
            ("Ada", "UK"),
            ("Grace", "US"),
            ("Linus", "FI"),
            ("Margaret", "US"),
            ("Guido", "NL"),
            ("Barbara", "US"),
        ],
        start=1,
    )
]

_lock = threading.Lock()
_server: ThreadingHTTPServer | None = None
_seen_keys: set[str] = set()


class _Handler(BoundedBodyHandler):
    def log_message(self, *args: object) -> None:  # keep test and demo output clean
        pass

    def _send(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        url = urlsplit(self.path)
        parts = [p for p in url.path.split("/") if p]
        if parts == ["customers"]:
            return self._send(200, CUSTOMERS)
        if len(parts) == 2 and parts[0] == "customers" and parts[1].isdigit():
            cid = int(parts[1])
            if not any(c["id"] == cid for c in CUSTOMERS):
                return self._send(404, {"error": f"no customer {cid}"})
            orders = (cid * 7) % 5 + 1
            return self._send(200, {"id": cid, "orders": orders, "spent": round(orders * 19.5 + cid, 2)})
        if parts == ["flaky"]:
            key = (parse_qs(url.query).get("key") or ["-"])[0]
            with _lock:
                first = key not in _seen_keys
                _seen_keys.add(key)
            if first:
                return self._send(503, {"error": "warming up, try again"})
            return self._send(200, {"ok": True, "key": key})
        return self._send(404, {"error": f"no route {url.path}"})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.body or b"null")
        return self._send(
            200, {"received": body, "count": len(body) if isinstance(body, (list, dict)) else 1}
        )


def ensure_stub() -> str:
    """Base URL of this process's stub service (started on first use)."""
    global _server
    with _lock:
        if _server is None:
            _server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
            _server.daemon_threads = True
            threading.Thread(target=_server.serve_forever, name="example-stub", daemon=True).start()
        host, port = _server.server_address[:2]
        return f"http://{host}:{port}"


def stop_stub() -> None:
    global _server
    with _lock:
        if _server is not None:
            _server.shutdown()
            _server.server_close()
            _server = None
