"""Facts exports while another process holds the embedded store: handed to that owner.

chdb allows one process per path, so a long-lived owner of the embedded store
(``dashboard serve``) runs an :class:`OwnerService`: a loopback HTTP endpoint
(127.0.0.1, a port from the OS) published with a random token in the store's
owner file (:mod:`noetl_analytics.store_owner`, mode 0600). ``POST /export``
runs the exporter inside the owner, under the lock its other users of the store
share, and answers the export report. :func:`export_facts` is the one export
path of ``facts export`` and the Dagster export run: it exports itself when it
can open the store, hands the export to the owner when the owner takes exports,
and otherwise fails naming the holder. The owner may also export on a cadence
itself (:class:`ExportLoop`). With a ClickHouse server URL every process opens
the store itself: no owner, no hand-off.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import threading
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from noetl_analytics.exporter import FactExporter
from noetl_analytics.pricing import PriceConfigError, PriceTable
from noetl_analytics.store import FactsStore, FactsStoreError, FactsStoreHeld, owner_lock
from noetl_analytics.store_owner import Holder
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.util.http_body import BoundedBodyHandler

MAX_REQUEST_BYTES = 1 << 20  # a price table is a few kB
HAND_OFF_TIMEOUT = float(os.environ.get("NOETL_DAGSTER_HANDOFF_TIMEOUT", "600"))


def export_facts(
    url: str | None = None,
    *,
    database: str | None = None,
    events_url: str | None = None,
    data_dir: str | None = None,
    prices: PriceTable | None = None,
    batch_events: int = 20_000,
    max_events: int | None = None,
) -> dict[str, Any]:
    """Export new events into the facts store here, or in the process holding it; the report as a
    dict, with ``exported_by`` naming the process that ran it."""
    log = open_event_store(events_url, data_dir=data_dir)
    try:
        try:
            store = FactsStore(url, data_dir=data_dir, database=database)
        except FactsStoreHeld as e:
            if e.holder is None or not e.holder.endpoint:
                raise
            request = {"events": log.url, "database": database, "batch_events": batch_events,
                       "max_events": max_events, "prices": _price_file(prices)}  # fmt: skip
            return hand_off(e.holder, request)
        try:
            report = FactExporter(store, log, batch_events=batch_events, prices=prices).export(max_events)
        finally:
            if store.embedded:
                store.release()  # the next process (a served dashboard, the CLI) may open it
        return {**report.to_dict(), "exported_by": f"pid {os.getpid()} (this process)"}
    finally:
        log.close()


def _price_file(prices: PriceTable | None) -> str | None:
    """The file a price table was read from, for the owner to read (None: the owner's own)."""
    if prices is None or not Path(prices.source).is_file():
        return None
    return str(Path(prices.source).resolve())


def hand_off(holder: Holder, request: dict[str, Any]) -> dict[str, Any]:
    """Run ``request`` (see :meth:`OwnerService.export`) in the holder's process."""
    http = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
    call = urllib.request.Request(
        f"{holder.endpoint}/export", data=json.dumps(request).encode(), method="POST",
        headers={"Authorization": f"Bearer {holder.token}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with http.open(call, timeout=HAND_OFF_TIMEOUT) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:500]
        try:
            detail = json.loads(detail)["error"]
        except (ValueError, KeyError, TypeError):
            pass
        raise FactsStoreError(f"{holder.describe()} holds the embedded facts store and refused the export:"
                              f" {detail}") from None  # fmt: skip
    except OSError as e:
        raise FactsStoreError(f"{holder.describe()} holds the embedded facts store and did not take the export"
                              f" at {holder.endpoint}: {e}") from None  # fmt: skip


def export_into(store: FactsStore, request: dict[str, Any], data_dir: str | None = None) -> dict[str, Any]:
    """Export from ``request["events"]`` (an event store URL) into ``request["database"]`` (default:
    ``store``'s), with the price table read from ``request["prices"]`` (a file; default: the table
    the store holds)."""
    price_file = request.get("prices")
    prices = PriceTable.load(price_file) if price_file else None
    batch = int(request.get("batch_events") or 20_000)
    limit = request.get("max_events")
    database = request.get("database") or store.database
    if database != store.database:
        store = FactsStore(store.url, database=database)
    log = open_event_store(request.get("events"), data_dir=data_dir)
    try:
        exporter = FactExporter(store, log, batch_events=batch, prices=prices)
        return exporter.export(None if limit is None else int(limit)).to_dict()
    finally:
        log.close()


class LocalExports:
    """Exports run in this process, one at a time with the other users of ``store`` (``lock``)."""

    def __init__(self, store: FactsStore, lock: threading.Lock, *, data_dir: str | None = None):
        self.store, self.lock, self.data_dir = store, lock, data_dir

    def describe(self) -> str:
        return f"pid {os.getpid()} (this process)"

    def export(self, request: dict[str, Any]) -> dict[str, Any]:
        with self.lock:  # the store answers one caller at a time (the dashboard's requests too)
            report = export_into(self.store, request, self.data_dir)
        return {**report, "exported_by": self.describe()}

    def stop(self) -> None:
        pass


class OwnerService(LocalExports):
    """The export endpoint of the process that holds an embedded store (see the module doc)."""

    def __init__(self, store: FactsStore, lock: threading.Lock, *, data_dir: str | None = None):
        held = owner_lock(store.url)
        if held is None:
            raise FactsStoreError(f"{store!r} is not an embedded store held by this process")
        super().__init__(store, lock, data_dir=data_dir)
        self._held = held
        self.token = secrets.token_urlsafe(32)
        service = self

        class Handler(BoundedBodyHandler):
            max_body = MAX_REQUEST_BYTES

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                status, answer = service.answer(self.path, self.headers.get("Authorization", ""), self.body)
                raw = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def describe(self) -> str:
        return self._held.holder.describe()

    def start(self) -> OwnerService:
        threading.Thread(target=self.server.serve_forever, daemon=True, name="facts-owner").start()
        self._held.publish(self.endpoint, self.token)
        return self

    def stop(self) -> None:
        self._held.publish(None, None)
        self.server.shutdown()
        self.server.server_close()

    def answer(self, path: str, authorization: str, body: bytes) -> tuple[int, dict[str, Any]]:
        if path != "/export":
            return 404, {"error": "not found"}
        if not hmac.compare_digest(authorization.encode(), f"Bearer {self.token}".encode()):
            return 401, {"error": "the owner file's token is required"}
        try:
            request = json.loads(body or b"{}")
            if not isinstance(request, dict):
                raise ValueError("the request must be a JSON object")
            return 200, self.export(request)
        except (ValueError, TypeError, PriceConfigError, FactsStoreError) as e:
            return 400, {"error": str(e)}
        except Exception as e:  # noqa: BLE001 - one line back to the requester, the owner goes on
            return 500, {"error": f"{type(e).__name__}: {e}"}


class ExportLoop:
    """The owner's own exporter: every ``seconds``, the events the log gained since the last look."""

    def __init__(self, service: LocalExports, events_url: str | None, seconds: float, *,
                 prices: PriceTable | None = None):  # fmt: skip
        if seconds <= 0:
            raise ValueError("the export interval must be positive")
        self.service, self.events_url, self.seconds = service, events_url, seconds
        self.prices = _price_file(prices)
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._seen = -1
        self._thread = threading.Thread(target=self._run, daemon=True, name="facts-export-loop")

    def start(self) -> ExportLoop:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.seconds + 60)

    def tick(self) -> dict[str, Any] | None:
        log = open_event_store(self.events_url, data_dir=self.service.data_dir)
        try:
            last, url = log.tail_last(), log.url
        finally:
            log.close()
        if last == self._seen:  # nothing new: no query on the store
            return None
        report = self.service.export({"events": url, "prices": self.prices})
        self._seen = last
        return report

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
                self.last_error = None
            except Exception as e:  # noqa: BLE001 - the dashboard keeps serving; the next tick retries
                self.last_error = f"{type(e).__name__}: {e}"
            self._stop.wait(self.seconds)
