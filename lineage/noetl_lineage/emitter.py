"""Emit OpenLineage events for NoETL events without ever slowing or failing a playbook.

:class:`LineageEmitter` is an event listener: the runner calls it with each
durably appended event; it only enqueues (bounded, dropping with a warning
when full). One background thread converts and emits in order, so a run's
START always leaves before its COMPLETE; transport errors are logged and
counted, never raised.

:func:`listener_from_env` returns the process-wide emitter when openlineage-python
is configured the standard way (``openlineage.yml`` in the working directory or
``~/.openlineage``, ``OPENLINEAGE_CONFIG``, ``OPENLINEAGE__TRANSPORT__*``, or
``OPENLINEAGE_URL``), else None. Transports come from that configuration (file,
http for Marquez and others, console, ...); :func:`file_client` is the embedded
default used by ``noetl-dagster lineage export``.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

from openlineage.client import OpenLineageClient
from openlineage.client.transport.file import FileConfig, FileTransport

from noetl_dagster.engine.events import Event
from noetl_lineage.config import config_fingerprint, is_configured
from noetl_lineage.convert import Describer, LineageConverter

log = logging.getLogger(__name__)

_STOP = object()


class LineageEmitter:
    def __init__(
        self,
        client: OpenLineageClient,
        *,
        converter: LineageConverter | None = None,
        queue_size: int = 100_000,
        name: str = "noetl-lineage",
    ):
        self.client = client
        self.converter = converter or LineageConverter()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._pending = 0
        self._idle = threading.Condition()
        self.emitted = 0
        self.failed = 0
        self.dropped = 0
        self._warned_full = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # the listener interface: never blocks, never raises
    def __call__(self, event: Event) -> None:
        if self._closed:
            return
        with self._idle:
            self._pending += 1
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()
            self.dropped += 1
            if not self._warned_full:
                self._warned_full = True
                log.warning(
                    "lineage: emitter queue full; dropping OpenLineage events (is the transport down?)"
                )

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            try:
                for run_event in self.converter.convert(item):
                    try:
                        self.client.emit(run_event)
                        self.emitted += 1
                    except Exception as e:  # noqa: BLE001 - a transport failure never reaches the playbook
                        self.failed += 1
                        log.warning("lineage: emit failed (%s): %s", type(e).__name__, e)
            except Exception as e:  # noqa: BLE001 - a conversion bug must not kill the thread
                self.failed += 1
                log.warning("lineage: cannot convert %s: %s", getattr(item, "name", item), e)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every enqueued event was handled; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self, timeout: float = 10.0) -> bool:
        if self._closed:
            return True
        done = self.flush(timeout)
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join(timeout=max(0.1, timeout))
        try:
            self.client.close(timeout)
        except Exception:  # noqa: BLE001 - closing is best effort
            pass
        return done

    def stats(self) -> dict[str, int]:
        return {
            "emitted": self.emitted,
            "failed": self.failed,
            "dropped": self.dropped,
            "pending": self._pending,
        }


# -- configuration discovery ------------------------------------------------------------


_emitters: dict[str, LineageEmitter] = {}
_emitters_lock = threading.Lock()


def listener_from_env() -> LineageEmitter | None:
    """The process-wide lineage listener for the current OpenLineage configuration, or None."""
    if not is_configured():
        return None
    key = config_fingerprint()
    with _emitters_lock:
        emitter = _emitters.get(key)
        if emitter is not None and not emitter._closed:
            return emitter
        try:
            client = OpenLineageClient()
        except Exception as e:  # noqa: BLE001 - a bad config disables lineage, never the playbook
            log.warning("lineage: OpenLineage is configured but the client cannot start: %s", e)
            return None
        emitter = LineageEmitter(client, converter=LineageConverter(describe=registry_describer_from_env()))
        _emitters[key] = emitter
        return emitter


def flush_all(timeout: float = 10.0) -> bool:
    with _emitters_lock:
        emitters = list(_emitters.values())
    return all(e.flush(timeout) for e in emitters)


def close_all(timeout: float = 5.0) -> None:
    with _emitters_lock:
        emitters = list(_emitters.values())
        _emitters.clear()
    for e in emitters:
        e.close(timeout)


atexit.register(close_all)


def file_client(path: str | os.PathLike[str], *, append: bool = True) -> OpenLineageClient:
    """A client writing one JSON event per line to ``path`` (the embedded default transport)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return OpenLineageClient(transport=FileTransport(FileConfig(log_file_path=str(path), append=append)))


# -- registry enrichment ----------------------------------------------------------------


def registry_describer(url: str | None) -> Describer:
    """Describe noetl:// datasets from the Resource Registry: columns (schema facet),
    rows/size, and the resources each was derived from (registry lineage)."""
    from noetl_registry.client import open_registry  # noqa: PLC0415 - optional at import time

    clients: dict[tuple[str, str], Any] = {}

    def describe(uri: str, tenant: str, project: str) -> dict[str, Any] | None:
        client = clients.get((tenant, project))
        if client is None:
            client = clients[(tenant, project)] = open_registry(url, tenant=tenant, project=project)
        plan = client.resolve(uri)
        meta = plan.metadata or {}
        info: dict[str, Any] = {
            "columns": meta.get("columns"),
            "rows": plan.rows,
            "size": plan.size_bytes,
            "format": plan.format,
        }
        try:
            edges = client.lineage(plan.resource_id, "up", 1).edges
            info["inputs"] = [edge.resource.uri for edge in edges]
        except Exception as e:  # noqa: BLE001 - lineage is optional enrichment
            log.debug("lineage: registry lineage of %s unavailable: %s", uri, e)
        return info

    return describe


def registry_describer_from_env(data_dir: str | os.PathLike[str] | None = None) -> Describer | None:
    """A describer when a registry is configured (``NOETL_REGISTRY_URL``) or the local one exists."""
    url = os.environ.get("NOETL_REGISTRY_URL")
    if not url:
        local = Path(data_dir or os.environ.get("NOETL_DAGSTER_HOME") or ".noetl") / "registry.db"
        if not local.is_file():
            return None
        url = str(local)
    try:
        return registry_describer(url)
    except Exception as e:  # noqa: BLE001 - no registry, no enrichment
        log.debug("lineage: registry unavailable: %s", e)
        return None
