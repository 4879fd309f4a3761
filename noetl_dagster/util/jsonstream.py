"""JSON of big values without their whole text in memory (issue 14.8).

- :func:`json_size_bound` walks a value and returns a lower bound of the length of its
  JSON text, stopping as soon as the bound passes a cap: deciding that a
  100-million-element list is "over 64 KiB" costs one ``len``, not its serialisation.
- :func:`iter_json` yields the text :func:`dumps_bytes` gives, in chunks of about
  ``chunk`` bytes: lists, tuples and dicts are encoded in slices (the slice length adapts
  to the item size), long strings in pieces, big items recursively. Writing a big result
  this way holds one chunk at a time, never a second copy of the result.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from noetl_dagster.util.jsonutil import has_lone_surrogate, replace_lone_surrogates, to_jsonable

CHUNK = 1 << 20  # bytes per chunk: big enough that orjson's per-call cost vanishes
_MAX_DEPTH = 64  # below this, a big item is encoded whole (deep values are small in practice)
_END = object()

try:
    import orjson as _orjson

    _OPTS = _orjson.OPT_NON_STR_KEYS | _orjson.OPT_SERIALIZE_NUMPY

    def dumps_bytes(value: Any) -> bytes:
        """``jsonutil.dumps(value).encode()`` without the intermediate ``str``."""
        try:
            return _orjson.dumps(value, default=to_jsonable, option=_OPTS)
        except TypeError:  # e.g. integers beyond 64 bits, lone surrogates: as jsonutil.dumps does
            return json.dumps(
                replace_lone_surrogates(value), default=to_jsonable, separators=(",", ":")
            ).encode()

except ImportError:  # pragma: no cover

    def dumps_bytes(value: Any) -> bytes:
        return json.dumps(value, default=to_jsonable, separators=(",", ":")).encode()


_FLAT_MAX = 16  # a flat dict of at most this many scalars cannot reach any cap by its keys alone


_NUMBERS = frozenset({int, float})


def _flat_bound(items: list | tuple) -> int:
    """The items' part of the bound when they are all numbers or all strings (0: walk them)."""
    types = set(map(type, items))
    if types <= _NUMBERS:
        return len(items)  # at least one digit each
    if len(types) == 1 and str in types:
        return sum(map(len, items)) + 2 * len(items)  # quotes
    return 0


def json_size_bound(value: Any, cap: int) -> int:
    """A lower bound of ``len(dumps_bytes(value))``; the walk stops once the bound exceeds ``cap``
    (so the answer is ``> cap`` then, not the full bound). Iterative: any nesting depth is fine."""
    if type(value) is dict and len(value) <= _FLAT_MAX:  # the common small result: no walk to set up
        total = 2 * len(value) + 1
        for k, v in value.items():
            t = type(v)
            if t is str:
                total += len(v) + 2
            elif t is int or t is float:
                total += 1
            elif v is None or t is bool:
                total += 4
            else:
                break  # something nested or unusual: the full walk below
            total += len(k) + 2 if type(k) is str else 1
        else:
            return total
    total = 0
    stack: list[Iterator[Any]] = [iter((value,))]
    owners: list[int] = [0]  # id of the container each iterator walks
    active: set[int] = set()  # containers being walked: meeting one again inside itself is a cycle

    def enter(container: Any, items: Iterator[Any]) -> None:
        if id(container) in active:
            raise ValueError("Circular reference detected")  # as json.dumps says it
        active.add(id(container))
        stack.append(items)
        owners.append(id(container))

    while stack:
        v = next(stack[-1], _END)
        if v is _END:
            stack.pop()
            active.discard(owners.pop())
            continue
        t = type(v)
        if t is str:
            total += len(v) + 2  # quotes; every character is at least one UTF-8 byte
        elif t is int or t is float:
            total += 1
        elif v is None or t is bool:
            total += 4
        elif isinstance(v, (list, tuple)):
            total += len(v) + 1  # brackets and commas
            # a long list of numbers or strings: C loops, no walk (past the cap: no look at the items)
            flat = total <= cap and len(v) > 8 and _flat_bound(v)
            if flat:
                total += flat
            else:
                enter(v, iter(v))
        elif isinstance(v, Mapping):
            total += 2 * len(v) + 1  # braces, colons and commas
            enter(v, itertools.chain.from_iterable(v.items()))
        elif isinstance(v, (bytes, bytearray, memoryview)):
            total += 4 * memoryview(v).nbytes // 3  # base64
        elif isinstance(v, (set, frozenset)):
            total += len(v) + 1
            enter(v, iter(v))
        elif hasattr(v, "__len__") and not hasattr(
            v, "model_dump"
        ):  # arrays, tables: one byte per item at least
            try:
                total += len(v) + 1
            except TypeError:  # numpy 0-d arrays
                total += 1
        else:
            stack.append(iter((to_jsonable(v),)))
            owners.append(0)
        if total > cap:
            return total
    return total


def iter_json(value: Any, chunk: int = CHUNK, _depth: int = 0) -> Iterator[bytes]:
    """The JSON text of ``value`` (as :func:`dumps_bytes`) in pieces of about ``chunk`` bytes."""
    t = type(value)
    if _depth < _MAX_DEPTH:
        if t is str and len(value) > chunk:
            yield b'"'
            for i in range(0, len(value), chunk):  # JSON escapes are per character: pieces concatenate
                yield dumps_bytes(value[i : i + chunk])[1:-1]
            yield b'"'
            return
        if (t is list or t is tuple) and json_size_bound(value, chunk) > chunk:
            yield from _iter_seq(value, chunk, _depth)
            return
        if t is dict and json_size_bound(value, chunk) > chunk:
            yield from _iter_dict(value, chunk, _depth)
            return
    yield dumps_bytes(value)


def _first_batch(items: Iterable[Any], count: int, chunk: int) -> int:
    """How many items to encode per slice at first: from a lower bound of the first few."""
    bound = json_size_bound(list(items), chunk) if count else 1
    per_item = max(bound // max(count, 1), 1)
    return max(1, min(chunk // per_item, chunk // 8))


def _next_batch(k: int, produced: int, chunk: int) -> int:
    return max(1, min(k * 2, k * chunk // max(produced, 1)))


def _iter_seq(seq: list[Any] | tuple[Any, ...], chunk: int, depth: int) -> Iterator[bytes]:
    yield b"["
    n = len(seq)
    k = _first_batch(seq[:16], min(n, 16), chunk)
    i, sep = 0, False
    while i < n:
        if sep:
            yield b","
        sep = True
        if k == 1:  # items about a chunk each: one at a time, a big one in pieces
            yield from iter_json(seq[i], chunk, depth + 1)
            i += 1
            k = 2
            continue
        part = dumps_bytes(seq[i : i + k])
        yield part[1:-1]
        i += k
        k = _next_batch(k, len(part), chunk)
    yield b"]"


def _iter_dict(d: dict[Any, Any], chunk: int, depth: int) -> Iterator[bytes]:
    yield b"{"
    items = iter(d.items())
    k = _first_batch(
        itertools.chain.from_iterable(itertools.islice(iter(d.items()), 16)), 2 * min(len(d), 16), chunk
    )
    k = max(1, k // 2)  # a bound per key or value, so per item about half as many
    sep = False
    while True:
        batch = list(itertools.islice(items, k))
        if not batch:
            break
        if sep:
            yield b","
        sep = True
        if k == 1:
            key, val = batch[0]
            head = dumps_bytes({key: 0})  # b'{"key":0}': the key as this encoder spells it
            yield head[1:-2]
            yield from iter_json(val, chunk, depth + 1)
            k = 2
            continue
        part = dumps_bytes(dict(batch))
        yield part[1:-1]
        k = _next_batch(k, len(part), chunk)
    yield b"}"


def json_contains(value: Any, needles: Iterable[str], chunk: int = CHUNK) -> bool:
    """Whether any needle occurs in the JSON text of ``value``, scanning it chunk by chunk."""
    wanted = [n.encode("utf-8", "surrogatepass") for n in needles if n]
    if not wanted:
        return False
    keep = max(len(n) for n in wanted) - 1
    tail = b""
    for piece in iter_json(value, chunk):
        buf = tail + piece if tail else piece
        if any(n in buf for n in wanted):
            return True
        tail = buf[-keep:] if keep else b""
    return False


def _texts_clean(items: Any, types: set[type]) -> bool:
    """Whether the str among ``items`` (whose types are ``types``) hold no lone surrogate."""
    if str not in types or (types == _STR and all(map(str.isascii, items))):
        return True
    return not any(type(x) is str and has_lone_surrogate(x) for x in items)


def is_plain_json(value: Any) -> bool:
    """Whether ``loads(dumps(value)) == value`` with the same types: only dicts with str keys,
    lists, str, bool, None, int and finite float (no tuples, sets, bytes, dates, NaN), and no
    str holding a lone surrogate (the encoders write U+FFFD for it)."""
    stack: list[Iterator[Any]] = [iter((value,))]
    while stack:
        if len(stack) > _PLAIN_DEPTH:  # deeper than JSON text is ever read back (or a cycle): not plain
            return False
        v = next(stack[-1], _END)
        if v is _END:
            stack.pop()
            continue
        t = type(v)
        if t is str:
            if not v.isascii() and has_lone_surrogate(v):
                return False
            continue
        if t is int or t is bool or v is None:
            continue
        if t is float:
            if v - v != 0.0:  # inf and nan
                return False
        elif t is list:
            types = set(map(type, v))  # C-speed pass; walk only lists holding more than scalars
            if not types <= _SCALARS:
                stack.append(iter(v))
            elif not _texts_clean(v, types):
                return False
        elif t is dict:
            if not _STR.issuperset(map(type, v)) or not _texts_clean(v, _STR_SET):
                return False
            values = v.values()
            types = set(map(type, values))
            if not types <= _SCALARS:
                stack.append(iter(values))
            elif not _texts_clean(values, types):
                return False
        else:
            return False
    return True


_SCALARS = frozenset({str, int, bool, type(None)})
_PLAIN_DEPTH = 1000
_STR = frozenset({str})
_STR_SET = {str}
