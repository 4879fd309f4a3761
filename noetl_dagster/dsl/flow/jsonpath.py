"""Guards: JSONPath (jsonpath-ng, extended syntax) evaluated on a task's input.

A guard holds when the expression selects at least one value that is not
``false`` or ``null``. A filter at the root, ``$[?(...)]``, tests the input
itself when the input is an object (and each item when it is a list), so
``$[?(@.status=0)]`` holds for the input ``{"status": 0}``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from jsonpath_ng import Child, Root
from jsonpath_ng.ext import parse as _parse
from jsonpath_ng.ext.filter import Filter


@lru_cache(maxsize=1024)
def compile_path(expr: str) -> Any:
    """Parse a JSONPath expression; ``ValueError`` with the parser's message when it is not valid."""
    try:
        return _parse(expr)
    except Exception as e:  # noqa: BLE001 - jsonpath-ng raises plain Exception subclasses
        raise ValueError(str(e) or type(e).__name__) from None


def select(expr: str, value: Any) -> list[Any]:
    path = compile_path(expr)
    target = value
    if isinstance(path, Child) and isinstance(path.left, Root) and isinstance(path.right, Filter):
        if not isinstance(value, list):
            target = [value]
    return [m.value for m in path.find(target)]


def guard_holds(expr: str, value: Any) -> bool:
    return any(v is not None and v is not False for v in select(expr, value))
