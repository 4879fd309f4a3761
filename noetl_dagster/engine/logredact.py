"""Secrets out of Python logs (issue 14.6).

While an execution's redactor knows secrets, every log record made in the process
(any logger: httpx logs request URLs with their query strings, user code in a
``python`` step may log what it was given, Dagster's loggers) has its message
redacted when the record is created: a log-record factory, so it works whatever
handlers (console, files, pytest's caplog, Dagster's) are attached later.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import logging


class _Redacts(Protocol):
    def __bool__(self) -> bool: ...

    def text(self, s: str) -> str: ...


_live: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()
_installed = False


def watch(redactor: _Redacts) -> None:
    """Redact this redactor's secrets from every log record while it lives."""
    global _installed
    import logging  # noqa: PLC0415 - here, not at start-up: no record exists before it is imported

    with _lock:
        _live.add(redactor)
        if _installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            if _live:
                _scrub(record)
            return record

        logging.setLogRecordFactory(factory)
        _installed = True


def _scrub(record: logging.LogRecord) -> None:
    redactors = [r for r in list(_live) if r]
    if not redactors:
        return
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a malformed record stays as it is (logging reports it)
        return
    clean = message
    for r in redactors:
        clean = r.text(clean)
    if clean != message:
        record.msg, record.args = clean, None
