"""JSON encoding shared by every store: tolerant of the values tools return."""

from __future__ import annotations

import datetime as _dt
import json
import re
import sys
import uuid
from collections.abc import Mapping
from typing import Any


def to_jsonable(value: Any) -> Any:
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    decimal = sys.modules.get(
        "decimal"
    )  # a Decimal exists only once decimal is imported (~1 ms: not at start-up)
    if decimal is not None and isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        from base64 import b64encode  # noqa: PLC0415 - rare, not at start-up

        return {"$bytes_b64": b64encode(bytes(value)).decode()}
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
        except TypeError:  # e.g. integers beyond 64 bits, lone surrogates (written as U+FFFD)
            return json.dumps(replace_lone_surrogates(value), default=to_jsonable, separators=(",", ":"))

    def dumps_bytes(value: Any) -> bytes:
        """``dumps(value)`` as UTF-8 (surrogatepass): orjson's own bytes, no str round trip."""
        try:
            return _orjson.dumps(value, default=to_jsonable, option=_OPTS)
        except TypeError:
            return dumps(value).encode("utf-8", "surrogatepass")

    def sorted_json(value: Any) -> bytes:
        """UTF-8 JSON with keys sorted (a digest's input: equal values, equal bytes)."""
        try:
            return _orjson.dumps(value, default=to_jsonable, option=_OPTS | _orjson.OPT_SORT_KEYS)
        except TypeError:  # non-string keys of mixed types, integers beyond 64 bits, lone surrogates
            return json.dumps(replace_lone_surrogates(value), default=to_jsonable, separators=(",", ":"),
                              sort_keys=True, ensure_ascii=False).encode("utf-8", "replace")  # fmt: skip

    _LONG_INT = re.compile(r"\d{19}")  # orjson reads integers beyond 64 bits as floats
    _LONG_INT_B = re.compile(rb"\d{19}")

    def loads(text: str | bytes) -> Any:
        long_int = (_LONG_INT_B if isinstance(text, (bytes, bytearray)) else _LONG_INT).search(text)  # type: ignore[arg-type]
        if long_int is not None:  # rare: keep big integers exact (replay must equal the live run)
            return json.loads(text)
        return _orjson.loads(text)

except ImportError:  # pragma: no cover
    _orjson = None  # type: ignore[assignment]
    _OPTS = 0

    def dumps(value: Any, **kw: Any) -> str:
        return json.dumps(value, default=to_jsonable, separators=(",", ":"), **kw)

    def dumps_bytes(value: Any) -> bytes:
        return dumps(value).encode("utf-8", "surrogatepass")

    def sorted_json(value: Any) -> bytes:
        return json.dumps(value, default=to_jsonable, separators=(",", ":"), sort_keys=True,
                          ensure_ascii=False).encode("utf-8", "replace")  # fmt: skip

    def loads(text: str | bytes) -> Any:
        return json.loads(text)


def plain(value: Any) -> Any:
    """A deep copy made of plain JSON types (dict/list/str/int/float/bool/None)."""
    return json.loads(dumps(value))


# -- lone surrogates --------------------------------------------------------------------------
# A str may hold a lone UTF-16 surrogate ("\udcff": a JSON escape in a --workload or an HTTP body, a
# python tool's result); UTF-8 cannot encode it and Postgres JSONB refuses it, so the event log keeps
# U+FFFD in its place. The recorder applies the same replacement before the live state sees a value
# (issue 29), so a live run and its replay hold the same text.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_NO_TEXT = frozenset({int, float, bool, type(None)})
_END = object()


def _text_free(items: Any) -> bool:
    """Whether a sequence of values surely holds no lone surrogate, decided at C speed when it is
    all numbers (and such), or all ASCII str; False means "look closer"."""
    types = set(map(type, items))
    if types <= _NO_TEXT:
        return True
    return types == {str} and all(map(str.isascii, items))


def has_lone_surrogate(value: Any) -> bool:
    """Whether a str anywhere in ``value`` (dict keys included) holds a lone surrogate.
    ASCII text (``str.isascii`` is O(1)) and lists of numbers are passed over at C speed; a
    value nested deeper than the interpreter's recursion limit (a cycle) raises RecursionError."""
    stack: list[Any] = [iter((value,))]
    limit = sys.getrecursionlimit()
    while stack:
        v = next(stack[-1], _END)
        if v is _END:
            stack.pop()
            continue
        t = type(v)
        if t is str:
            if not v.isascii() and _LONE_SURROGATE.search(v) is not None:
                return True
        elif t is dict:
            if not _text_free(v):  # the keys
                keys = [k for k in v if type(k) is str]
                if any(not k.isascii() and _LONE_SURROGATE.search(k) for k in keys):
                    return True
            values = v.values()
            if not _text_free(values):
                stack.append(iter(values))
        elif (t is list or t is tuple) and not _text_free(v):
            stack.append(iter(v))
        if len(stack) > limit:
            raise RecursionError("value nested too deeply (a cycle?)")
    return False


def replace_lone_surrogates(value: Any) -> Any:
    """``value`` itself when it holds no lone surrogate, else a copy with each replaced by U+FFFD
    (what a store gives back). Meant for event bodies (results in them are at most the inline
    limit: bigger ones are payloads, whose encoder applies the same rule): orjson, which refuses
    lone surrogates, decides the common case at C speed. A value too deep to walk (a cycle) is
    returned as it is: the encoder refuses it on its own terms."""
    if _orjson is not None:
        try:
            _orjson.dumps(value, option=_OPTS)
            return value
        except TypeError:  # a lone surrogate, or a type orjson leaves to `default`: look closer
            pass
    try:
        if not has_lone_surrogate(value):
            return value
    except RecursionError:
        return value
    return _replaced(value)


def _replaced(value: Any) -> Any:
    t = type(value)
    if t is str:
        return _LONE_SURROGATE.sub("\ufffd", value)
    if t is dict:
        return {_replaced(k): _replaced(v) for k, v in value.items()}
    if t is list:
        return [_replaced(v) for v in value]
    if t is tuple:
        return tuple(_replaced(v) for v in value)
    return value
