"""A named logger whose ``logging`` is imported at its first use (issue 46: ``logging`` is ~4 ms of a
one-step run's start-up, and a run that logs nothing never needs it)."""

from __future__ import annotations

from typing import Any


class LazyLogger:
    """``logging.getLogger(name)``, looked up when a method is first called."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attr: str) -> Any:
        import logging  # noqa: PLC0415 - at the first log call, not at start-up

        return getattr(logging.getLogger(self.name), attr)
