"""Local stand-ins for the services the NoETL e2e fixtures call over the network.

Each stub is a small threaded HTTP server on a loopback port, written from what
the fixtures send and assert (not a copy of any upstream server). ``StubSet``
starts them all and gives the host → URL map used for ``--http-override`` and
for rewriting workload URLs.

* ``paginated-api`` — NoETL's pagination test server: page / offset / cursor
  pagination over 35 items, a flaky endpoint that fails a page's first attempt,
  a rate-limited endpoint (429 + Retry-After), error injection, heavy payloads,
  and a concurrency probe that counts overlapping requests.
* ``httpbin`` — ``/get``, ``/post`` (any method), ``/anything/...``,
  ``/status/<code>``, ``/delay/<s>``, ``/headers``, ``/json``, ``/uuid``.
* ``jsonplaceholder`` — ``/posts`` (100), ``/users`` (10), ``/comments``, ``/todos`` and ``/<kind>/<id>``.
* ``open-meteo`` — ``/v1/forecast`` with deterministic ``current`` values.
* ``noetl-api`` — ``/health`` and ``/api/health`` of a NoETL server.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from noetl_dagster.util.http_body import BoundedBodyHandler

TOTAL_ITEMS = 35
PAGE_SIZE = 10


class Request:
    def __init__(self, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: bytes):
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        try:
            return json.loads(self.body) if self.body else None
        except ValueError:
            return None

    def int_arg(self, name: str, default: int) -> int:
        try:
            return int(float(self.query.get(name, default)))
        except (TypeError, ValueError):
            return default


class Reply:
    def __init__(
        self,
        status: int = 200,
        body: Any = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ):
        self.status = status
        self.body = body
        self.headers = dict(headers or {})
        self.raw = raw

    def encode(self) -> tuple[bytes, str]:
        if self.raw is not None:
            return self.raw, self.headers.pop("Content-Type", "text/plain; charset=utf-8")
        return json.dumps(self.body).encode(), "application/json"


Route = Callable[[Request], Reply]


class StubServer:
    """One service on one loopback port; routes are (method | '*', path prefix) → handler."""

    name = "stub"
    hosts: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        stub = self

        class Handler(BoundedBodyHandler):
            max_body = 16 * 1024 * 1024  # a conformance request is small; anything this big is hostile
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                parts = urlsplit(self.path)
                body = self.body
                query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
                req = Request(
                    self.command, parts.path, query, {k.lower(): v for k, v in self.headers.items()}, body
                )
                with stub._lock:
                    stub.requests.append((self.command, self.path))
                try:
                    reply = stub.dispatch(req)
                except Exception as e:  # noqa: BLE001 - a stub bug answers 500, visibly
                    reply = Reply(500, {"error": f"stub failure: {type(e).__name__}: {e}"})
                data, ctype = reply.encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.headers.pop("Content-Type", ctype))
                self.send_header("Content-Length", str(len(data)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _serve

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"stub-{self.name}", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def routes(self) -> list[tuple[str, str, Route]]:
        return []

    def dispatch(self, req: Request) -> Reply:
        best: tuple[int, Route] | None = None
        for method, prefix, fn in self.routes():
            if method not in ("*", req.method):
                continue
            exact = prefix.endswith("$")
            p = prefix.rstrip("$")
            if (exact and req.path.rstrip("/") == p.rstrip("/")) or (not exact and req.path.startswith(p)):
                if best is None or len(p) > best[0]:
                    best = (len(p), fn)
        if best is None:
            return Reply(404, {"error": f"{self.name} stub: no route for {req.method} {req.path}"})
        return best[1](req)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class PaginatedApi(StubServer):
    name = "paginated-api"
    hosts = (
        "paginated-api.test-server.svc.cluster.local:5555",
        "paginated-api.test-server.svc.cluster.local",
        "localhost:30555",
        "127.0.0.1:32555",
        "localhost:5555",
    )

    def __init__(self) -> None:
        self.flaky_attempts: dict[int, int] = defaultdict(int)
        self.rate_last: dict[str, float] = {}
        self.probe = {"started": 0, "completed": 0, "active": 0, "max_active": 0}
        self.state_lock = threading.Lock()
        super().__init__()

    def routes(self) -> list[tuple[str, str, Route]]:
        return [
            ("GET", "/health$", lambda r: Reply(200, {"status": "ok"})),
            ("GET", "/api/v1/assessments$", self.assessments),
            ("GET", "/api/v1/users$", self.users),
            ("GET", "/api/v1/events$", self.events),
            ("GET", "/api/v1/flaky$", self.flaky),
            ("POST", "/api/v1/flaky/reset$", self.flaky_reset),
            ("GET", "/api/v1/rate-limited$", self.rate_limited),
            ("GET", "/api/v1/errors$", self.errors),
            ("GET", "/api/v1/heavy$", self.heavy),
            ("GET", "/api/v1/concurrency/probe$", self.concurrency_probe),
            ("POST", "/api/v1/concurrency/reset$", self.concurrency_reset),
            ("GET", "/api/v1/concurrency/stats$", self.concurrency_stats),
            ("GET", "/api/v1/patient/", self.patient_records),
        ]

    # the PFT patient-domain contract (pft_flow_test/test_pft_page_continuation): one record per page,
    # `paging.hasMore` the only signal for the next page; 1-3 pages per (data type, patient)
    PATIENT_DOMAINS = ("assessments", "conditions", "medications", "vital_signs")

    def patient_records(self, req: Request) -> Reply:
        domain = req.path.rstrip("/").rsplit("/", 1)[-1]
        if domain not in self.PATIENT_DOMAINS:
            return Reply(404, {"error": f"paginated-api stub: no patient domain {domain!r}"})
        patient, (page, size) = req.int_arg("patientId", 0), self._page(req)
        total = 1 + (patient + self.PATIENT_DOMAINS.index(domain)) % 3
        start = (page - 1) * size
        rows = [{"id": f"{domain}-{patient}-{i}", "patientId": patient, "type": domain, "seq": i}
                for i in range(start + 1, min(start + size, total) + 1)]  # fmt: skip
        paging = {"hasMore": start + size < total, "page": page, "pageSize": size, "total": -(-total // size)}
        return Reply(200, {"data": {"data": rows, "paging": paging}})

    @staticmethod
    def _page(req: Request) -> tuple[int, int]:
        return max(1, req.int_arg("page", 1)), max(1, req.int_arg("pageSize", PAGE_SIZE))

    def assessments(self, req: Request) -> Reply:
        page, size = self._page(req)
        start = (page - 1) * size
        items = [
            {"id": i, "name": f"Assessment {i}", "score": 50 + (i % 50)}
            for i in range(start + 1, min(start + size, TOTAL_ITEMS) + 1)
        ]
        return Reply(
            200,
            {
                "data": items,
                "paging": {
                    "hasMore": start + size < TOTAL_ITEMS,
                    "page": page,
                    "pageSize": size,
                    "total": TOTAL_ITEMS,
                },
            },
        )

    def users(self, req: Request) -> Reply:
        offset, limit = max(0, req.int_arg("offset", 0)), max(1, req.int_arg("limit", PAGE_SIZE))
        users = [
            {"id": i, "username": f"user{i}", "email": f"user{i}@example.com"}
            for i in range(offset + 1, min(offset + limit, TOTAL_ITEMS) + 1)
        ]
        return Reply(
            200,
            {
                "users": users,
                "has_more": offset + limit < TOTAL_ITEMS,
                "offset": offset,
                "limit": limit,
                "total": TOTAL_ITEMS,
            },
        )

    def events(self, req: Request) -> Reply:
        limit = max(1, req.int_arg("limit", PAGE_SIZE))
        cursor = req.query.get("cursor") or ""
        try:
            page = int(base64.b64decode(cursor).decode()) if cursor else 1
        except ValueError:
            return Reply(400, {"error": f"bad cursor {cursor!r}"})
        start = (page - 1) * limit
        events = [
            {
                "id": i,
                "type": "user_action",
                "timestamp": f"2024-01-{(i % 28) + 1:02d}T12:00:00Z",
                "data": {"action": f"event_{i}"},
            }
            for i in range(start + 1, min(start + limit, TOTAL_ITEMS) + 1)
        ]
        nxt = base64.b64encode(str(page + 1).encode()).decode() if start + limit < TOTAL_ITEMS else None
        return Reply(200, {"events": events, "next_cursor": nxt, "limit": limit})

    def flaky(self, req: Request) -> Reply:
        page, size = self._page(req)
        fail_on = {int(p) for p in (req.query.get("fail_on") or "").split(",") if p.strip().isdigit()}
        with self.state_lock:
            self.flaky_attempts[page] += 1
            attempt = self.flaky_attempts[page]
        if page in fail_on and attempt == 1:
            return Reply(500, {"detail": f"Simulated failure on page {page} (attempt {attempt})"})
        start = (page - 1) * size
        items = [
            {"id": i, "value": f"item_{i}"} for i in range(start + 1, min(start + size, TOTAL_ITEMS) + 1)
        ]
        return Reply(
            200,
            {
                "data": items,
                "paging": {"hasMore": start + size < TOTAL_ITEMS, "page": page, "pageSize": size},
            },
        )

    def flaky_reset(self, req: Request) -> Reply:
        with self.state_lock:
            self.flaky_attempts.clear()
        return Reply(200, {"status": "reset", "message": "Flaky endpoint counters cleared"})

    def rate_limited(self, req: Request) -> Reply:
        rps = max(0.001, float(req.query.get("requests_per_second") or 1))
        window = 1.0 / rps
        now = time.monotonic()
        with self.state_lock:
            last = self.rate_last.get("global")
            if last is not None and now - last < window:
                retry_after = max(1, int(window - (now - last) + 0.999))
                return Reply(429, {"error": "rate limited"}, {"Retry-After": str(retry_after)})
            self.rate_last["global"] = now
        return self.assessments(req)

    def errors(self, req: Request) -> Reply:
        kind = req.query.get("error_type", "server")
        status = {
            "auth": 401,
            "forbidden": 403,
            "not_found": 404,
            "bad_request": 400,
            "rate_limit": 429,
            "server": 500,
            "unavailable": 503,
        }.get(kind, 500)
        return Reply(status, {"error": kind, "status": status})

    def heavy(self, req: Request) -> Reply:
        page, size = self._page(req)
        kb = max(0, req.int_arg("payload_kb", 10))
        max_pages = max(1, req.int_arg("max_pages", 3))
        start = (page - 1) * size
        items = []
        for i in range(start + 1, start + size + 1):
            seed = hashlib.sha256(str(i).encode()).hexdigest()
            items.append(
                {
                    "id": i,
                    "name": f"Item {i}",
                    "score": 50 + (i % 50),
                    "category": ["a", "b", "c"][i % 3],
                    "payload": (seed * (kb * 1024 // 64 + 1))[: kb * 1024],
                }
            )
        return Reply(
            200,
            {
                "data": items,
                "paging": {"hasMore": page < max_pages, "page": page, "pageSize": size},
                "meta": {"payload_kb_per_item": kb},
            },
        )

    def concurrency_probe(self, req: Request) -> Reply:
        delay = max(0.0, min(30.0, float(req.query.get("delay_seconds") or 0)))
        with self.state_lock:
            self.probe["started"] += 1
            self.probe["active"] += 1
            self.probe["max_active"] = max(self.probe["max_active"], self.probe["active"])
        try:
            time.sleep(delay)
        finally:
            with self.state_lock:
                self.probe["active"] -= 1
                self.probe["completed"] += 1
        return Reply(200, {"status": "ok", "delay_seconds": delay, "label": req.query.get("label")})

    def concurrency_reset(self, req: Request) -> Reply:
        with self.state_lock:
            self.probe = {"started": 0, "completed": 0, "active": 0, "max_active": 0}
        return Reply(200, {"status": "reset"})

    def concurrency_stats(self, req: Request) -> Reply:
        with self.state_lock:
            return Reply(200, dict(self.probe))


class HttpBin(StubServer):
    name = "httpbin"
    hosts = ("httpbin.org",)

    def routes(self) -> list[tuple[str, str, Route]]:
        return [
            ("GET", "/get$", self.echo),
            ("*", "/post$", self.echo),
            ("*", "/put$", self.echo),
            ("*", "/patch$", self.echo),
            ("*", "/delete$", self.echo),
            ("*", "/anything", self.echo),
            ("*", "/status/", self.status),
            ("*", "/delay/", self.delay),
            ("GET", "/headers$", lambda r: Reply(200, {"headers": self._headers(r)})),
            (
                "GET",
                "/json$",
                lambda r: Reply(200, {"slideshow": {"author": "stub", "title": "Sample", "slides": []}}),
            ),
            ("GET", "/uuid$", lambda r: Reply(200, {"uuid": str(uuid.uuid4())})),
            ("GET", "/ip$", lambda r: Reply(200, {"origin": "127.0.0.1"})),
        ]

    @staticmethod
    def _headers(r: Request) -> dict[str, str]:
        return {"-".join(p.capitalize() for p in k.split("-")): v for k, v in r.headers.items()}

    def echo(self, r: Request) -> Reply:
        text = r.body.decode("utf-8", "replace")
        form = {}
        if "x-www-form-urlencoded" in r.headers.get("content-type", ""):
            form = {k: v[-1] for k, v in parse_qs(text).items()}
        return Reply(
            200,
            {
                "args": r.query,
                "data": text,
                "files": {},
                "form": form,
                "headers": self._headers(r),
                "json": r.json(),
                "method": r.method,
                "origin": "127.0.0.1",
                "url": f"https://httpbin.org{r.path}",
            },
        )

    def status(self, r: Request) -> Reply:
        try:
            code = int(r.path.rsplit("/", 1)[1].split(",")[0])
        except ValueError:
            return Reply(400, {"error": "bad status"})
        return Reply(code, raw=b"")

    def delay(self, r: Request) -> Reply:
        try:
            seconds = min(10.0, float(r.path.rsplit("/", 1)[1]))
        except ValueError:
            seconds = 0.0
        time.sleep(seconds)
        return self.echo(r)


def _lorem(seed: int, words: int) -> str:
    vocab = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et dolore magna aliqua".split()
    return " ".join(vocab[(seed * 7 + i * 3) % len(vocab)] for i in range(words))


class JsonPlaceholder(StubServer):
    name = "jsonplaceholder"
    hosts = ("jsonplaceholder.typicode.com",)

    def __init__(self) -> None:
        cities = [
            "Gwenborough",
            "Wisokyburgh",
            "McKenziehaven",
            "South Elvis",
            "Roscoeview",
            "South Christy",
            "Howemouth",
            "Aliyaview",
            "Bartholomebury",
            "Lebsackbury",
        ]
        self.data: dict[str, list[dict[str, Any]]] = {
            "posts": [
                {"userId": (i - 1) // 10 + 1, "id": i, "title": _lorem(i, 6), "body": _lorem(i + 3, 24)}
                for i in range(1, 101)
            ],
            "users": [
                {
                    "id": i,
                    "name": f"User {i}",
                    "username": f"user{i}",
                    "email": f"user{i}@example.com",
                    "phone": f"1-770-736-80{i:02d}",
                    "website": f"user{i}.example.org",
                    "address": {
                        "street": f"{i} Main St",
                        "suite": f"Apt. {100 + i}",
                        "city": cities[i - 1],
                        "zipcode": f"{90000 + i}",
                        "geo": {"lat": f"{-37.3 + i}", "lng": f"{81.1 - i}"},
                    },
                    "company": {"name": f"Company {i}", "catchPhrase": _lorem(i, 4), "bs": _lorem(i + 1, 3)},
                }
                for i in range(1, 11)
            ],
            "comments": [
                {
                    "postId": (i - 1) // 5 + 1,
                    "id": i,
                    "name": _lorem(i, 4),
                    "email": f"c{i}@example.com",
                    "body": _lorem(i + 5, 15),
                }
                for i in range(1, 501)
            ],
            "todos": [
                {"userId": (i - 1) // 20 + 1, "id": i, "title": _lorem(i, 5), "completed": i % 3 == 0}
                for i in range(1, 201)
            ],
        }
        super().__init__()

    def routes(self) -> list[tuple[str, str, Route]]:
        return [("*", f"/{kind}", self.collection) for kind in self.data]

    def collection(self, r: Request) -> Reply:
        parts = [p for p in r.path.split("/") if p]
        rows = self.data[parts[0]]
        if r.method in ("POST",):
            body = r.json() or {}
            return Reply(201, {**body, "id": len(rows) + 1})
        if len(parts) >= 2:
            try:
                item = next(x for x in rows if x["id"] == int(parts[1]))
            except (ValueError, StopIteration):
                return Reply(404, {})
            if len(parts) == 3 and parts[2] in self.data:
                key = parts[0].rstrip("s") + "Id"
                return Reply(200, [x for x in self.data[parts[2]] if x.get(key) == item["id"]])
            return Reply(200, item)
        filters = {k: v for k, v in r.query.items() if not k.startswith("_")}
        out = [x for x in rows if all(str(x.get(k)) == v for k, v in filters.items())]
        if "_limit" in r.query:
            out = out[: r.int_arg("_limit", len(out))]
        return Reply(200, out)


class OpenMeteo(StubServer):
    name = "open-meteo"
    hosts = ("api.open-meteo.com",)

    def routes(self) -> list[tuple[str, str, Route]]:
        return [("GET", "/v1/forecast$", self.forecast)]

    def forecast(self, r: Request) -> Reply:
        try:
            lat, lon = float(r.query["latitude"]), float(r.query["longitude"])
        except (KeyError, ValueError):
            return Reply(400, {"error": True, "reason": "latitude and longitude are required"})
        fields = [f for f in (r.query.get("current") or "").split(",") if f]
        base = round(15 + (lat % 10) - (abs(lon) % 5), 1)  # deterministic per place
        values = {
            "temperature_2m": base,
            "wind_speed_10m": round(abs(lon) % 20, 1),
            "relative_humidity_2m": int(40 + lat % 50),
        }
        body: dict[str, Any] = {"latitude": lat, "longitude": lon, "timezone": "GMT", "elevation": 10.0}
        if fields:
            body["current"] = {
                "time": "2024-01-01T12:00",
                "interval": 900,
                **{f: values.get(f, 0.0) for f in fields},
            }
            body["current_units"] = {f: "°C" if f.startswith("temperature") else "" for f in fields}
        hourly = [f for f in (r.query.get("hourly") or "").split(",") if f]
        if hourly:
            body["hourly"] = {
                "time": [f"2024-01-01T{h:02d}:00" for h in range(24)],
                **{f: [values.get(f, 0.0)] * 24 for f in hourly},
            }
        return Reply(200, body)


class NoetlApi(StubServer):
    name = "noetl-api"
    hosts = (
        "noetl-server-rust.noetl.svc.cluster.local:8082",
        "noetl.noetl.svc.cluster.local:8082",
        "localhost:8082",
    )

    def routes(self) -> list[tuple[str, str, Route]]:
        ok = lambda r: Reply(200, {"status": "ok", "service": "noetl", "stub": True})  # noqa: E731
        return [("GET", "/health$", ok), ("GET", "/api/health$", ok)]


STUB_CLASSES: tuple[type[StubServer], ...] = (PaginatedApi, HttpBin, JsonPlaceholder, OpenMeteo, NoetlApi)


class StubSet:
    """Every stub, started; ``overrides`` maps each original host to its local URL."""

    def __init__(self, classes: tuple[type[StubServer], ...] = STUB_CLASSES):
        self.stubs: dict[str, StubServer] = {}
        try:
            for cls in classes:
                self.stubs[cls.name] = cls()
        except BaseException:
            self.close()
            raise

    @property
    def overrides(self) -> dict[str, str]:
        return {host: stub.url for stub in self.stubs.values() for host in stub.hosts}

    def __getitem__(self, name: str) -> StubServer:
        return self.stubs[name]

    def close(self) -> None:
        for stub in self.stubs.values():
            stub.close()
        self.stubs.clear()

    def __enter__(self) -> StubSet:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
