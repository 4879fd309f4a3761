"""``loop.cursor`` driver ``nats_stream``: a JetStream durable pull consumer shared by executions.

``claim`` is the subject filter; options: ``stream`` (required), ``durable`` (default
``noetl_<stream>``: executions naming the same durable share its messages), ``url`` (default the
credential's ``url`` or ``nats://127.0.0.1:4222``), ``fetch_timeout`` (seconds, default 1),
``drain_timeout`` (how long an empty fetch waits for messages other consumers hold unacknowledged;
default 2 x lease + 5 s), ``max_deliver``. The lease is the consumer's ``ack_wait``
(``frame.lease_seconds``): a message whose holder died (kill -9) is delivered again once it runs
out; a heartbeat sends ``in_progress`` (extends it), an ack ``ack_sync`` (confirmed by the server),
a failed row ``nak`` (redelivered). A row is the JSON payload (else ``{data: text}``) plus
``_subject`` and ``_seq``; its key is ``<stream>:<stream sequence>``.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from noetl_dagster.engine.ports import CursorRequest, CursorRow, CursorSource
from noetl_dagster.tools.registry import ToolError

DEFAULT_URL = "nats://127.0.0.1:4222"


class NatsStreamCursor(CursorSource):
    def __init__(self, req: CursorRequest):
        opts = dict(req.options or {})
        self.stream = opts.get("stream")
        if not self.stream:
            raise ToolError(
                "cursor nats_stream: options.stream (the JetStream stream) is required", kind="config_error"
            )
        record = req.credential(req.auth) if isinstance(req.auth, str) and "://" not in req.auth else {}
        self.url = (
            opts.get("url")
            or record.get("url")
            or (req.auth if isinstance(req.auth, str) else None)
            or DEFAULT_URL
        )
        self.subject = req.claim.strip()
        self.durable = str(opts.get("durable") or re.sub(r"[^A-Za-z0-9_-]", "_", f"noetl_{self.stream}"))
        self.fetch_timeout = float(opts.get("fetch_timeout", 1.0))
        self.drain_timeout = float(opts.get("drain_timeout", req.lease_seconds * 2 + 5))
        self.lease = req.lease_seconds
        self.max_deliver = int(opts.get("max_deliver", -1))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="noetl-nats-cursor")
        self._thread.start()
        self._lock = threading.Lock()
        try:
            self._call(self._connect())
        except ToolError:
            self.close()
            raise
        except Exception as e:  # noqa: BLE001 - connection / JetStream errors end the loop with a message
            self.close()
            raise ToolError(
                f"cursor nats_stream {self.url}: {type(e).__name__}: {e}", kind="connection_error"
            ) from None

    def _call(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _connect(self) -> None:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig

        self._nc = await nats.connect(
            self.url, connect_timeout=5, max_reconnect_attempts=2, allow_reconnect=False
        )
        js = self._nc.jetstream()
        cfg = ConsumerConfig(durable_name=self.durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=self.lease,
                             max_deliver=self.max_deliver, filter_subject=self.subject)  # fmt: skip
        self._sub = await js.pull_subscribe(
            self.subject, durable=self.durable, stream=self.stream, config=cfg
        )

    async def _claim(self, max_rows: int) -> list[Any]:
        import nats.errors

        deadline = time.monotonic() + self.drain_timeout
        while True:
            try:
                msgs = await self._sub.fetch(max(1, max_rows), timeout=self.fetch_timeout)
            except (TimeoutError, nats.errors.TimeoutError):
                msgs = []
            if msgs:
                return msgs
            info = await self._sub.consumer_info()
            # drained: nothing left to deliver and nothing held by a consumer that may die
            if not info.num_pending and not info.num_ack_pending:
                return []
            if time.monotonic() > deadline:
                return []

    def claim(self, max_rows: int) -> list[CursorRow]:
        with self._lock:
            msgs = self._call(self._claim(max_rows))
        return [CursorRow(f"{self.stream}:{m.metadata.sequence.stream}", _row(m), m) for m in msgs]

    def ack(self, rows: Sequence[CursorRow]) -> None:
        with self._lock:
            for r in rows:
                self._call(r.handle.ack_sync(timeout=5))

    def fail(self, rows: Sequence[CursorRow], error: Mapping[str, Any] | None) -> None:
        with self._lock:
            for r in rows:
                self._call(r.handle.nak())

    def heartbeat(self, rows: Sequence[CursorRow]) -> None:
        with self._lock:
            for r in rows:
                self._call(r.handle.in_progress())

    def close(self) -> None:
        nc = getattr(self, "_nc", None)
        if nc is not None:
            try:
                self._call(nc.close(), timeout=5)
            except Exception:  # noqa: BLE001, S110 - closing is best effort
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


def _row(msg: Any) -> dict[str, Any]:
    text = msg.data.decode("utf-8", "replace")
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    row = dict(value) if isinstance(value, dict) else {"data": value if value is not None else text}
    row.setdefault("_subject", msg.subject)
    row.setdefault("_seq", msg.metadata.sequence.stream)
    return row
