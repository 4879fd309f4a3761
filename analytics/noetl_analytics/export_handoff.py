"""The embedded facts store's other users go through the process that holds it.

chdb allows one process per path, so a long-lived owner of the embedded store
(``dashboard serve``) runs an :class:`OwnerService`: a loopback HTTP endpoint
(127.0.0.1, a port from the OS) published with a random token in the store's
owner file (:mod:`noetl_analytics.store_owner`, mode 0600). ``POST /<op>``
runs one of :data:`OPERATIONS` (export, refresh, budgets, a read-only query)
inside the owner, under the lock its other users of the store share, and
answers JSON. :func:`on_store` is the one path of ``facts export|query|refresh``
and of the Dagster export run, rollups and budget sensor: it works on the store
itself when it can open it, hands the operation to an owner that takes them,
and otherwise fails naming the holder. The owner also exports on a cadence
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
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from clickhouse_connect.driver.exceptions import ClickHouseError

from noetl_analytics.budgets import BudgetConfigError
from noetl_analytics.exporter import FactExporter
from noetl_analytics.pricing import PriceConfigError, PriceTable
from noetl_analytics.store import FactsStore, FactsStoreError, FactsStoreHeld, owner_lock
from noetl_analytics.store_owner import Holder
from noetl_dagster.storage.event_stores import open_event_store
from noetl_dagster.util.http_body import BoundedBodyHandler

MAX_REQUEST_BYTES = 1 << 20  # a price table is a few kB
HAND_OFF_TIMEOUT = float(os.environ.get("NOETL_DAGSTER_HANDOFF_TIMEOUT", "600"))


def on_store(
    op: str,
    request: dict[str, Any],
    local: Callable[[FactsStore], Any],
    *,
    url: str | None = None,
    database: str | None = None,
    data_dir: str | None = None,
) -> Any:
    """``local(store)`` here when this process can open the store (released afterwards, so the next
    process may open it), else ``op`` with ``request`` in the owner that takes hand-offs; with any
    other holder, :class:`FactsStoreHeld` naming it."""
    try:
        store = FactsStore(url, data_dir=data_dir, database=database)
    except FactsStoreHeld as e:
        if e.holder is None or not e.holder.endpoint:
            raise
        return hand_off(e.holder, op, {**request, "database": database})
    try:
        return local(store)
    finally:
        if store.embedded:
            store.release()


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
        request = {"events": log.url, "batch_events": batch_events, "max_events": max_events,
                   "prices": price_file(prices)}  # fmt: skip

        def here(store: FactsStore) -> dict[str, Any]:
            report = FactExporter(store, log, batch_events=batch_events, prices=prices).export(max_events)
            return {**report.to_dict(), "exported_by": f"pid {os.getpid()} (this process)"}

        return on_store("export", request, here, url=url, database=database, data_dir=data_dir)
    finally:
        log.close()


def price_file(prices: PriceTable | None) -> str | None:
    """The file a price table was read from, for the owner to read (None: the owner's own)."""
    if prices is None or not Path(prices.source).is_file():
        return None
    return str(Path(prices.source).resolve())


def hand_off(holder: Holder, op: str, request: dict[str, Any]) -> Any:
    """Run ``op`` (one of :data:`OPERATIONS`) with ``request`` in the holder's process."""
    http = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
    call = urllib.request.Request(
        f"{holder.endpoint}/{op}", data=json.dumps(request).encode(), method="POST",
        headers={"Authorization": f"Bearer {holder.token}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with http.open(call, timeout=HAND_OFF_TIMEOUT) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:2000]
        try:
            detail = json.loads(detail)["error"]
        except (ValueError, KeyError, TypeError):
            pass
        raise FactsStoreError(f"{holder.describe()} holds the embedded facts store and refused the {op}:"
                              f" {detail}") from None  # fmt: skip
    except OSError as e:
        raise FactsStoreError(f"{holder.describe()} holds the embedded facts store and did not take the {op}"
                              f" at {holder.endpoint}: {e}") from None  # fmt: skip


def export_into(store: FactsStore, request: dict[str, Any], data_dir: str | None = None) -> dict[str, Any]:
    """Export from ``request["events"]`` (an event store URL) with the price table read from
    ``request["prices"]`` (a file; default: the table the store holds)."""
    prices = _prices(request)
    batch = int(request.get("batch_events") or 20_000)
    limit = request.get("max_events")
    log = open_event_store(request.get("events"), data_dir=data_dir)
    try:
        exporter = FactExporter(store, log, batch_events=batch, prices=prices)
        return exporter.export(None if limit is None else int(limit)).to_dict()
    finally:
        log.close()


def refresh_into(store: FactsStore, request: dict[str, Any], data_dir: str | None = None) -> dict[str, Any]:
    """Re-price the rollups with ``request["prices"]`` (a file; default as every command's)."""
    from noetl_analytics.allocation import allocation_totals  # noqa: PLC0415
    from noetl_analytics.rollups import loaded_fingerprint, refresh_rollups  # noqa: PLC0415

    before = loaded_fingerprint(store)  # the table the store was priced with: a change is a repricing
    report = refresh_rollups(store, _prices(request) or PriceTable.load(data_dir=data_dir))
    return {"report": report.to_dict(), "totals": allocation_totals(store), "priced_before": before}


def budgets_into(
    store: FactsStore, request: dict[str, Any], data_dir: str | None = None
) -> list[dict[str, Any]]:
    """Each budget of the file ``request["budgets"]`` against the store: name, month, crossed, message, tags."""
    from noetl_analytics.budgets import evaluate, load_budgets  # noqa: PLC0415

    statuses = evaluate(store, load_budgets(str(request.get("budgets") or "")))
    return [{"name": st.budget.name, "month": st.month, "crossed": st.crossed, "message": st.message(),
             "tags": st.tags()} for st in statuses]  # fmt: skip


def query_into(store: FactsStore, request: dict[str, Any], data_dir: str | None = None) -> dict[str, Any]:
    """A read-only query (``request["sql"]``, ``$db`` for the database): columns and JSON rows."""
    columns, rows = store.query(str(request.get("sql") or ""), readonly=True)
    return {"columns": columns, "rows": [[_jsonable(v) for v in r] for r in rows]}


def _jsonable(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def _prices(request: dict[str, Any]) -> PriceTable | None:
    path = request.get("prices")
    return PriceTable.load(path) if path else None


# what an owner runs for other processes (POST /<name>), each with the store of the request's database
OPERATIONS: dict[str, Callable[[FactsStore, dict[str, Any], str | None], Any]] = {
    "export": export_into, "refresh": refresh_into, "budgets": budgets_into, "query": query_into,
}  # fmt: skip


class InProcessStore:
    """:data:`OPERATIONS` run in this process, one at a time with the other users of ``store`` (``lock``)."""

    def __init__(self, store: FactsStore, lock: threading.Lock, *, data_dir: str | None = None):
        self.store, self.lock, self.data_dir = store, lock, data_dir

    def describe(self) -> str:
        return f"pid {os.getpid()} (this process)"

    def run(self, op: str, request: dict[str, Any]) -> Any:
        with self.lock:  # the store answers one caller at a time (the dashboard's requests too)
            database = request.get("database") or self.store.database
            store = (
                self.store
                if database == self.store.database
                else FactsStore(self.store.url, database=database)
            )
            return OPERATIONS[op](store, request, self.data_dir)

    def export(self, request: dict[str, Any]) -> dict[str, Any]:
        return {**self.run("export", request), "exported_by": self.describe()}

    def stop(self) -> None:
        pass


class OwnerService(InProcessStore):
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

    def answer(self, path: str, authorization: str, body: bytes) -> tuple[int, Any]:
        op = path.lstrip("/")
        if op not in OPERATIONS:
            return 404, {"error": "not found"}
        if not hmac.compare_digest(authorization.encode(), f"Bearer {self.token}".encode()):
            return 401, {"error": "the owner file's token is required"}
        try:
            request = json.loads(body or b"{}")
            if not isinstance(request, dict):
                raise ValueError("the request must be a JSON object")
            return 200, self.export(request) if op == "export" else self.run(op, request)
        except (ValueError, TypeError, PriceConfigError, BudgetConfigError, FactsStoreError) as e:
            return 400, {"error": str(e)}
        except ClickHouseError as e:  # the requester's SQL: its first line, as `facts query` prints it
            return 400, {"error": str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}
        except Exception as e:  # noqa: BLE001 - one line back to the requester, the owner goes on
            return 500, {"error": f"{type(e).__name__}: {e}"}


class ExportLoop:
    """The owner's own exporter: every ``seconds``, the events the log gained since the last look."""

    def __init__(self, service: InProcessStore, events_url: str | None, seconds: float, *,
                 prices: PriceTable | None = None):  # fmt: skip
        if seconds <= 0:
            raise ValueError("the export interval must be positive")
        self.service, self.events_url, self.seconds = service, events_url, seconds
        self.prices = price_file(prices)
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
