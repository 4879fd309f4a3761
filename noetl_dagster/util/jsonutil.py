"""JSON encoding shared by every store: tolerant of the values tools return."""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
import re
import uuid
from collections.abc import Mapping
from typing import Any


def to_jsonable(value: Any) -> Any:
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes_b64": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if hasattr(value, "tolist"):  # numpy scalars / arrays
        return value.tolist()
    if hasattr(value, "to_pylist"):  # pyarrow
        return value.to_pylist()
    return repr(value)


try:  # orjson is ~5x faster on the event hot path; the stdlib encoder is the fallback
    import orjson as _orjson

    _OPTS = _orjson.OPT_NON_STR_KEYS | _orjson.OPT_SERIALIZE_NUMPY

    def dumps(value: Any, **kw: Any) -> str:
        if kw:
            return json.dumps(value, default=to_jsonable, separators=(",", ":"), **kw)
        try:
            return _orjson.dumps(value, default=to_jsonable, option=_OPTS).decode()
        except TypeError:  # e.g. integers beyond 64 bits
            return json.dumps(value, default=to_jsonable, separators=(",", ":"))

    _LONG_INT = re.compile(r"\d{19}")  # orjson reads integers beyond 64 bits as floats
    _LONG_INT_B = re.compile(rb"\d{19}")

    def loads(text: str | bytes) -> Any:
        long_int = (_LONG_INT_B if isinstance(text, (bytes, bytearray)) else _LONG_INT).search(text)  # type: ignore[arg-type]
        if long_int is not None:  # rare: keep big integers exact (replay must equal the live run)
            return json.loads(text)
        return _orjson.loads(text)

except ImportError:  # pragma: no cover

    def dumps(value: Any, **kw: Any) -> str:
        return json.dumps(value, default=to_jsonable, separators=(",", ":"), **kw)

    def loads(text: str | bytes) -> Any:
        return json.loads(text)


def plain(value: Any) -> Any:
    """A deep copy made of plain JSON types (dict/list/str/int/float/bool/None)."""
    return json.loads(dumps(value))
