"""Limits of the template sandbox, checked before allocation (issue 29.2, docs/limits.md).

One render gets one budget (thread-local): a deadline, a count of work and a count of
bytes produced. Every sandbox hook calls :func:`tick`; every operation that can grow a
value first computes the size it WOULD produce and passes it to :func:`produce`, which
refuses it past a per-value limit or past the render's byte budget, so nothing big is
ever allocated. Builtins that work in bulk (C loops) charge their input size as work
up front, so no single call can run past the deadline unseen.

The estimates here are upper bounds within a small factor (repr escapes, tojson of
control characters); each operation's result is also checked after the fact.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from string import Formatter
from typing import Any

import jinja2
from jinja2.utils import Namespace

MAX_STR = 16 * 1024 * 1024  # characters in one produced string
MAX_ITEMS = 1_000_000  # items in one produced list/dict (and in the whole rendered value)
MAX_VALUE_DEPTH = 100  # nesting of a rendered value
MAX_VALUE_CHARS = 4 * MAX_STR  # characters of all the strings of a rendered value (shared ones each time)
# < 4,300 digits (Python's int->str limit), so every int the sandbox makes can be printed
MAX_INT_BITS = 14_000
RENDER_SECONDS = 5.0  # wall time of one render
# estimated bytes one render may produce in all, so a rejected render stays under 256 MB
MAX_RENDER_BYTES = 128 * 1024 * 1024
# sandbox operations (calls, lookups, outputs, loop iterations; bulk C work at ~256 bytes each), per render: ~2-4 s of work,
# and since each reference a render adds to an output buffer is one operation, <= 64 MB of them
MAX_RENDER_WORK = 8_000_000
MAX_NEST = 200  # nesting the size estimator follows (str() itself fails near 1,000)


class LimitExceeded(Exception):
    """A template produced (or was about to produce) something beyond a limit."""


_CHECK_EVERY = 512  # work units between two looks at the clock (a unit is one sandbox operation)


class Budget:
    __slots__ = ("at", "work", "alloc", "next_check")

    def __init__(self) -> None:
        self.at: float | None = None  # the running render's deadline; None outside a render
        self.work = 0
        self.alloc = 0
        self.next_check = float("inf")  # the work count at which tick() next checks the limits


_local = threading.local()  # .b: this thread's Budget (one thread-local read per tick, then plain slots)


def budget() -> Budget:
    try:
        return _local.b
    except AttributeError:
        _local.b = b = Budget()
        return b


def begin() -> bool:
    """Start a render's budget; False when one is running already (a nested render shares it)."""
    b = budget()
    if b.at is not None:
        return False
    b.at = time.monotonic() + RENDER_SECONDS
    b.work = b.alloc = 0
    b.next_check = _CHECK_EVERY
    return True


def end() -> None:
    b = budget()
    b.at = None
    b.next_check = float("inf")


def tick(units: int = 1) -> None:
    """Count work; every few hundred units, check the work limit and the deadline
    (outside a render, e.g. constant folding at compile time, nothing is checked)."""
    try:
        b = _local.b
    except AttributeError:
        return  # no render ever ran on this thread
    b.work = w = b.work + units
    if w >= b.next_check:
        checkpoint(b)


def checkpoint(b: Budget) -> None:
    if b.at is None:
        b.next_check = float("inf")
        return
    if b.work > MAX_RENDER_WORK:
        raise LimitExceeded(f"render did more than {MAX_RENDER_WORK:,} operations")
    if b.alloc > MAX_RENDER_BYTES:
        raise LimitExceeded(f"render would produce more than {MAX_RENDER_BYTES // 2**20} MiB")
    if time.monotonic() > b.at:
        raise LimitExceeded(f"render took longer than {RENDER_SECONDS:g} s")
    b.next_check = b.work + _CHECK_EVERY


def produce(n: int, what: str = "value", *, items: bool = False, width: int = 0) -> None:
    """Refuse an operation about to make a string of ``n`` characters of ``width`` bytes (or a
    sequence of ``n`` items of ``width`` bytes, 8 by default) beyond the per-value limit or
    the render's byte budget."""
    limit = MAX_ITEMS if items else MAX_STR
    if n > limit:
        raise LimitExceeded(
            f"{what} would have {n:,} {'items' if items else 'characters'}; the limit is {limit:,}"
        )
    try:
        b = _local.b
    except AttributeError:
        return
    cost = n * (width or (8 if items else 1))
    b.alloc += cost
    b.work = w = b.work + 1 + (cost >> 8)  # C-speed bulk work: ~256 bytes per operation
    if w >= b.next_check or b.alloc > MAX_RENDER_BYTES:
        checkpoint(b)  # before the value is made


def check_result(value: Any, what: str = "value") -> Any:
    """After the fact: no value above the per-value limits leaves an operation (the pre-checks are estimates)."""
    t = type(value)
    if t is str or t is bytes:
        if len(value) > MAX_STR:
            raise LimitExceeded(f"{what} has {len(value):,} characters; the limit is {MAX_STR:,}")
    elif t is list or t is tuple or t is dict:
        if len(value) > MAX_ITEMS:
            raise LimitExceeded(f"{what} has {len(value):,} items; the limit is {MAX_ITEMS:,}")
    elif t is int and value.bit_length() > MAX_INT_BITS:
        raise LimitExceeded(f"{what} is an integer beyond {MAX_INT_BITS:,} bits")
    return value


def width_of(*values: Any) -> int:
    """Bytes per character of a string made from these (CPython: 1 for ASCII, 2 for most other text)."""
    return 1 if all(not isinstance(v, str) or v.isascii() for v in values) else 2


def size(value: Any) -> int:
    try:
        return (
            len(value)
            if isinstance(value, (str, bytes, bytearray, list, tuple, dict, set, frozenset, range))
            else 0
        )
    except TypeError:
        return 0


def int_digits(v: int) -> int:
    return v.bit_length() * 30103 // 100000 + 2


def counted(it: Iterable[Any], item_bytes: int = 0) -> Iterator[Any]:
    """An iterator that counts its items as work, in batches (and charges ``item_bytes`` per
    fresh item it yields: zip() and enumerate() make a tuple per item)."""
    n = 0
    for x in it:
        n += 1
        if n == 64:
            if item_bytes:
                produce(64, "iteration", items=True, width=item_bytes)
            tick(64)
            n = 0
        yield x
    tick(n)


# -- the size of str(value) / tojson(value), estimated before making it ------------------------


def _repr_str_len(s: str) -> int:
    n = len(s)
    if n <= 8:
        return 10 * n + 2
    if s.isprintable():
        return n + 2 + s.count("\\") + s.count("'")
    return n * (4 if s.isascii() else 10) + 2


def _json_str_len(s: str) -> int:
    n = len(s)
    if n <= 8:
        return 6 * n + 2  # short: the worst case costs less than looking
    if s.isascii():
        return n + 2 + s.count('"') + s.count("\\") if s.isprintable() else 6 * n + 2
    return (12 if n and max(s) > "\uffff" else 6) * n + 2


class _Sizer:
    """Walks a value adding up the characters its text would have; stops past ``limit``."""

    __slots__ = ("json", "left", "limit", "what", "nodes", "depth", "active")

    def __init__(self, json: bool, limit: int, what: str):
        self.json, self.limit, self.what = json, limit, what
        self.left, self.nodes, self.depth, self.active = limit, 0, 0, set()

    def add(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise LimitExceeded(f"{self.what} would have more than {self.limit:,} characters")

    def walk(self, v: Any, depth: int, quoted: bool) -> None:
        t = type(v)
        if t is not dict and t is not list:  # the common containers skip the checks below
            if isinstance(v, str):
                self.add(_json_str_len(v) if self.json else (_repr_str_len(v) if quoted else len(v)))
                return
            if v is None or t is bool:
                self.add(5)
                return
            if t is int:
                self.add(int_digits(v))
                return
            if t is float:
                self.add(24)
                return
            if isinstance(v, jinja2.Undefined):
                self.add(4)
                return
            if isinstance(v, (bytes, bytearray)):
                self.add(4 * len(v) + 14)
                return
        self.nodes += 1
        if depth > self.depth:
            self.depth = depth
            if depth > MAX_NEST:
                raise LimitExceeded(f"{self.what}: value nested deeper than {MAX_NEST} levels")
        key = id(v)
        if key in self.active:  # a self-reference prints as [...]
            self.add(5)
            return
        if t is not dict and isinstance(v, Namespace):
            v = v._Namespace__attrs  # type: ignore[attr-defined]
            self.add(12)
        if t is dict or isinstance(v, Mapping):
            self.active.add(key)
            self.add(2 if t is dict else 40)
            strlen = _json_str_len if self.json else _repr_str_len
            short = 6 if self.json else 10  # the worst escape of a short string, cheaper than looking
            n = 0
            for k, x in v.items():  # scalars inline: this loop runs once per key of big values
                n += (len(k) * short + 6 if len(k) <= 8 else strlen(k) + 4) if type(k) is str else 28
                tx = type(x)
                if tx is str:
                    n += len(x) * short + 2 if len(x) <= 8 else strlen(x)
                elif tx is int:
                    n += x.bit_length() * 30103 // 100000 + 2
                elif tx is float or tx is bool or x is None:
                    n += 24
                else:
                    self.add(n)
                    n = 0
                    self.walk(x, depth + 1, True)
                if n > self.left:
                    self.add(n)
            self.add(n)
            self.active.discard(key)
        elif t is list or isinstance(v, (tuple, set, frozenset)) or (self.json and isinstance(v, Iterator)):
            self.active.add(key)
            self.add(2 if t is list or t is tuple else 12)
            strlen = _json_str_len if self.json else _repr_str_len
            short = 6 if self.json else 10
            n = 0
            for x in v:  # scalars inline: this loop runs once per item of big lists
                tx = type(x)
                if tx is str:
                    n += len(x) * short + 4 if len(x) <= 8 else strlen(x) + 2
                elif tx is int:
                    n += x.bit_length() * 30103 // 100000 + 4
                elif tx is float or tx is bool or x is None:
                    n += 26
                else:
                    self.add(n + 2)
                    n = 0
                    self.walk(x, depth + 1, True)
                if n > self.left:
                    self.add(n)
            self.add(n)
            self.active.discard(key)
        elif isinstance(v, (range, Iterator)) or callable(v):
            self.add(80)  # a short repr: range(0, 9), <generator ...>, <function ...>
        else:
            self.add(len(str(v)))  # dates, decimals...: small by construction


def text_len(value: Any, what: str = "value", limit: int = MAX_STR) -> int:
    """Upper estimate of ``len(str(value))``; raises LimitExceeded once it passes ``limit``."""
    if isinstance(value, str):
        return len(value)
    if type(value) is int:
        return int_digits(value)
    if value is None or type(value) in (bool, float):
        return 24
    s = _Sizer(False, limit, what)
    s.walk(value, 0, False)
    tick(1 + s.nodes)
    return limit - s.left


def json_len(value: Any, indent: Any = None, what: str = "tojson") -> int:
    s = _Sizer(True, MAX_STR, what)
    s.walk(value, 0, True)
    tick(1 + s.nodes)
    n = MAX_STR - s.left
    if isinstance(indent, int) and indent > 0:  # a newline and depth * indent per item
        n += s.nodes * (1 + indent * s.depth) + n // 2 * (1 + indent * s.depth) // 2
    return n


def pprint_len(value: Any) -> int:
    s = _Sizer(False, MAX_STR, "pprint")
    s.walk(value, 0, True)
    tick(1 + 4 * s.nodes)  # pformat is Python code: a few operations per node
    n = MAX_STR - s.left
    return n + (n // 2 + s.nodes) * (2 + s.depth)  # a line break and indent per item, pessimistic


# -- % and str.format ------------------------------------------------------------------------

_PCT = re.compile(
    r"%(?:\((?P<key>[^)]*)\))?[-#0 +]*(?P<width>\*|\d+)?(?:\.(?P<prec>\*|\d+))?[hlL]?(?P<conv>[diouxXeEfFgGcrsa%])"
)
_SPEC = re.compile(r"(?:.?[<>=^])?[-+ ]?z?#?0?(?P<width>\d*)[,_]?(?:\.(?P<prec>\d+))?[a-zA-Z%]?$", re.S)


def _num(v: Any) -> int:
    return v if type(v) is int else 0


def _value_len(value: Any, conv: str, prec: int | None) -> int:
    if conv in "sra":
        n = _repr_len(value) if conv in "ra" else text_len(value, "formatted value")
        return min(n, prec) if prec is not None and conv == "s" else n
    if isinstance(value, float):  # %f of 1e308 has 309 digits
        return 330 + (prec or 0)
    return max(int_digits(value) if type(value) is int else 24, prec or 0) + 2


def _repr_len(value: Any) -> int:
    s = _Sizer(False, MAX_STR, "formatted value")
    s.walk(value, 0, True)
    return MAX_STR - s.left


def percent_len(fmt: str, values: Any) -> int:
    """Characters of ``fmt % values``."""
    args = list(values) if isinstance(values, tuple) else [values]
    mapping = values if isinstance(values, Mapping) else None
    total, pos, fields = len(fmt), 0, 0

    def take() -> Any:
        nonlocal pos
        pos += 1
        return args[pos - 1] if pos <= len(args) else None

    for m in _PCT.finditer(fmt):
        fields += 1
        if fields & 1023 == 0:
            tick(64)
        conv = m.group("conv")
        if conv == "%":
            continue
        w, p = m.group("width"), m.group("prec")
        width = _num(take()) if w == "*" else int(w or 0)
        prec = (_num(take()) if p == "*" else int(p)) if p is not None else None
        key = m.group("key")
        value = mapping.get(key) if key is not None and mapping is not None else take()
        total += max(abs(width), _value_len(value, conv, prec))
        if total > MAX_STR:
            break
    return total


def format_len(fmt: str, args: tuple, kwargs: Mapping[str, Any]) -> int:
    """Characters of ``fmt.format(*args, **kwargs)``."""
    ints = [abs(v) for v in (*args, *kwargs.values()) if type(v) is int]
    widest = max(ints, default=0)  # a nested {} width/precision is one of the arguments
    total, auto = 0, 0
    for i, (literal, field, spec, conv) in enumerate(Formatter().parse(fmt)):
        if i & 1023 == 1023:
            tick(64)
        total += len(literal)
        if field is None:
            continue
        head = re.split(r"[.\[]", field, maxsplit=1)[0]
        if head == "":
            value, auto = (args[auto] if auto < len(args) else None), auto + 1
        elif head.isdigit():
            value = args[int(head)] if int(head) < len(args) else None
        else:
            value = kwargs.get(head)
        n = _value_len(value, "r" if conv in ("r", "a") else "s", None)
        if head != field:  # {0.attr} / {0[i]}: a part of the value
            n += 100
        spec = spec or ""
        if "{" in spec:
            n = max(n, widest) + (widest if isinstance(value, float) else 0)
        elif spec:
            m = _SPEC.match(spec)
            if m:
                width, prec = int(m.group("width") or 0), m.group("prec")
                if prec is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
                    n = max(n, 330) + int(prec)
                elif prec is not None and isinstance(value, str):
                    n = min(n, int(prec))
                n = max(n, width)
            else:
                n += len(spec)
        total += n
        if total > MAX_STR:
            break
    return total


# -- join ------------------------------------------------------------------------------------


def join_len(sep: str, items: list[Any], stringify: bool) -> int:
    """Characters of ``sep.join(items)`` (``stringify``: items are str()'d first, as the ``join`` filter does)."""
    total = len(sep) * max(len(items) - 1, 0)
    if total > MAX_STR:
        return total
    tick(1 + len(items) // 2)  # a Python step per item
    for x in items:
        total += len(x) if type(x) is str else (text_len(x, "joined item") if stringify else size(x))
        if total > MAX_STR:
            break
    return total


def materialize(value: Any, what: str) -> list[Any]:
    """A sized list of an iterable (a generator is counted as it is drained)."""
    if isinstance(value, list):
        return value
    if isinstance(value, (str, tuple, dict, set, frozenset, range)):
        produce(len(value), what, items=True)
        return list(value)
    if isinstance(value, jinja2.Undefined):
        return []
    out = []
    for x in value:
        tick()
        out.append(x)
        if len(out) > MAX_ITEMS:
            raise LimitExceeded(f"{what} has more than {MAX_ITEMS:,} items")
    produce(len(out), what, items=True)
    return out


# -- filters: the size each would produce, checked before it runs ------------------------------
# Each estimator takes the filter's arguments (after Jinja's context/environment argument),
# raises LimitExceeded or charges the budget, and may return replacement arguments (a drained
# generator). Every filter of the environment must have an entry (tests check it), so a new
# filter cannot bypass the gate unclassified.

_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_SPACES = " \t\n\r\x0b\x0c"


_SCALARS = (int, float, bool, type(None))


def _text(value: Any, what: str, factor: int = 1) -> int:
    """Characters of ``str(value)``, refused past the limit, charged ``factor`` times."""
    if type(value) in _SCALARS and factor == 1:
        return 24  # short; an int too long to print raises its own ValueError
    n = text_len(value, what)
    produce(n * factor, what, width=width_of(value))
    return n


def _count_any(s: Any, chars: str) -> int:
    return sum(s.count(c) for c in chars) if isinstance(s, str) else size(s)


def _f_text(value: Any, *_a: Any, **_k: Any) -> None:  # a filter that str()s its input, output no larger
    if not isinstance(value, str):
        _text(value, "value")


def _f_case(value: Any, *_a: Any, **_k: Any) -> None:  # upper/title...: up to 3 characters per character
    factor = 1 if isinstance(value, str) and value.isascii() else 3
    if factor > 1 or not isinstance(value, str):
        _text(value, "case mapping", factor)


def _f_center(value: Any, width: Any = 80, *_a: Any, **_k: Any) -> None:
    produce(max(text_len(value, "center"), _num(width)), "center", width=width_of(value))


def _f_indent(s: Any, width: Any = 4, first: bool = False, blank: bool = False) -> None:
    n = text_len(s, "indent")
    lines = _count_any(s, _LINE_BREAKS) + 2
    pad = len(width) if isinstance(width, str) else _num(width)
    tick(lines)
    produce(n + lines * (pad + 1), "indent", width=width_of(s, width))


def _f_wordwrap(
    s: Any, width: Any = 79, break_long_words: bool = True, wrapstring: Any = None, *_a: Any, **_k: Any
) -> None:
    n = text_len(s, "wordwrap")
    wrap = len(wrapstring) if isinstance(wrapstring, str) else 1
    lines = min(n, n // max(_num(width), 1) + _count_any(s, _SPACES)) + 1
    tick(n // 2)  # textwrap is Python code, a few characters per step
    produce(n + lines * wrap, "wordwrap", width=width_of(s, wrapstring))


def _f_truncate(
    s: Any, length: Any = 255, killwords: bool = False, end: Any = "...", leeway: Any = None
) -> None:
    n = text_len(s, "truncate")
    produce(
        min(n, abs(_num(length)) + abs(_num(leeway)) + 5) + text_len(end), "truncate", width=width_of(s, end)
    )


def _f_format(value: Any, *args: Any, **kwargs: Any) -> None:
    fmt = value if isinstance(value, str) else ""
    produce(
        percent_len(fmt, kwargs or args) + text_len(value, "format"), "format", width=width_of(value, *args)
    )


def replace_len(s: Any, old: Any, new: Any, count: Any = -1) -> int:
    if not (isinstance(s, (str, bytes)) and type(old) is type(s) and type(new) is type(s)):
        return text_len(s, "replace")
    occurrences = len(s) + 1 if not old else s.count(old)
    if type(count) is int and count >= 0:
        occurrences = min(occurrences, count)
    return len(s) + occurrences * max(len(new) - len(old), 0)


def as_str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        _text(value, what)
        value = str(value)
    return value


def _f_replace(s: Any, old: Any, new: Any, count: Any = None) -> tuple:
    s, old, new = as_str(s, "replace"), as_str(old, "replace"), as_str(new, "replace")
    produce(replace_len(s, old, new, -1 if count is None else count), "replace", width=width_of(s, new))
    return (s, old, new, count)


def _f_tojson(value: Any, indent: Any = None) -> None:
    produce(json_len(value, indent), "tojson")


def _f_pprint(value: Any) -> None:
    produce(pprint_len(value), "pprint")


def _f_escape(value: Any) -> None:
    if isinstance(value, str):
        produce(len(value) + 4 * _count_any(value, "&<>\"'"), "escape", width=width_of(value))
    else:
        _text(value, "escape", 6)


def _f_urlencode(value: Any) -> None:
    ascii_str = isinstance(value, str) and value.isascii()
    produce(text_len(value, "urlencode") * (3 if ascii_str else 12), "urlencode")


def _f_urlize(value: Any, *_a: Any, **_k: Any) -> None:
    n = text_len(value, "urlize")
    tick(n // 4)
    produce(8 * n + 200, "urlize", width=width_of(value))


def _f_xmlattr(d: Any, autospace: bool = True) -> None:
    tick(size(d))
    produce(6 * text_len(d, "xmlattr") + 2, "xmlattr")


def _f_string(value: Any) -> None:
    if not isinstance(value, str):
        _text(value, "string")


def _f_list(value: Any) -> None:
    if isinstance(value, (str, list, tuple, dict, set, frozenset, range)):
        produce(len(value), "list", items=True)


def _f_reverse(value: Any) -> None:
    if isinstance(value, str):
        produce(len(value), "reverse", width=width_of(value))
    else:
        _f_list(value)


def _f_sorting(value: Any, *_a: Any, **_k: Any) -> None:
    """sort, dictsort, unique, groupby: a list of the items."""
    n = size(value)
    tick(n)
    produce(n, "sort", items=True, width=64)


def _f_batch(value: Any, linecount: Any, fill_with: Any = None) -> None:
    n, per = size(value), max(_num(linecount), 1)
    if fill_with is not None:
        produce(per, "batch", items=True)
    tick(n)
    produce(n + n // per + 1, "batch", items=True, width=16)


def _f_slice(value: Any, slices: Any, fill_with: Any = None) -> None:
    n = size(value)
    tick(n)
    produce(n + max(_num(slices), 0), "slice", items=True, width=16)


def _f_fromjson(value: Any) -> None:
    if isinstance(value, (str, bytes)):
        tick(len(value) >> 6)  # json.loads: ~64 characters per operation
        sep = (",", ":", "[", "{") if isinstance(value, str) else (b",", b":", b"[", b"{")
        produce(sum(value.count(c) for c in sep) + 1, "fromjson", items=True, width=64)


def _f_b64encode(value: Any) -> None:
    n = (
        len(value)
        if isinstance(value, (bytes, bytearray))
        else text_len(value, "b64encode") * (1 if width_of(value) == 1 else 4)
    )
    produce(n * 4 // 3 + 4, "b64encode")


FILTER_SIZES: dict[str, Any] = {
    # output no larger than the input, or a scalar, or lazy (map/select...: counted per item);
    # join and sum are own implementations that check their sizes
    **dict.fromkeys(["abs", "attr", "count", "d", "default", "first", "last", "float", "int", "length", "max", "min",
                     "random", "round", "safe", "filesizeformat", "b64decode", "map", "select", "reject",
                     "selectattr", "rejectattr", "items", "join", "sum"]),
    **dict.fromkeys(["trim", "striptags", "wordcount"], _f_text),
    **dict.fromkeys(["upper", "lower", "title", "capitalize"], _f_case),
    **dict.fromkeys(["e", "escape", "forceescape"], _f_escape),
    **dict.fromkeys(["tojson", "to_json"], _f_tojson),
    **dict.fromkeys(["fromjson", "from_json"], _f_fromjson),
    **dict.fromkeys(["sort", "dictsort", "unique", "groupby"], _f_sorting),
    "center": _f_center, "indent": _f_indent, "wordwrap": _f_wordwrap, "truncate": _f_truncate,
    "format": _f_format, "replace": _f_replace, "pprint": _f_pprint, "urlencode": _f_urlencode,
    "urlize": _f_urlize, "xmlattr": _f_xmlattr, "string": _f_string, "list": _f_list, "reverse": _f_reverse,
    "batch": _f_batch, "slice": _f_slice, "b64encode": _f_b64encode,
}  # fmt: skip


# -- methods of values (str, bytes, int, list, dict...) called from a template -------------------


def _m_pad(owner: Any, width: Any = 0, *rest: Any) -> None:
    produce(max(len(owner), _num(width)), "padding", width=width_of(owner, *rest))


def _m_expandtabs(owner: Any, tabsize: Any = 8) -> None:
    tabs = owner.count("\t" if isinstance(owner, str) else b"\t")
    produce(len(owner) + tabs * max(_num(tabsize), 1), "expandtabs", width=width_of(owner))


def _m_format(owner: Any, *args: Any, **kwargs: Any) -> None:
    produce(format_len(owner, args, kwargs), "format", width=width_of(owner, *args, *kwargs.values()))


def _m_format_map(owner: Any, mapping: Any = None, *_a: Any) -> None:
    produce(
        format_len(owner, (), mapping if isinstance(mapping, Mapping) else {}),
        "format",
        width=width_of(owner),
    )


def _m_join(owner: Any, iterable: Any = (), *rest: Any) -> tuple:
    items = materialize(iterable, "join")
    produce(join_len(owner, items, False), "join", width=width_of(owner, *items[:64]))
    return (items, *rest)


def _m_replace(owner: Any, old: Any = "", new: Any = "", count: Any = -1) -> None:
    produce(replace_len(owner, old, new, count), "replace", width=width_of(owner, new))


def _m_translate(owner: Any, table: Any = None, *_a: Any) -> None:
    longest = 1
    if isinstance(table, Mapping):
        tick(len(table))
        longest = max((len(v) if isinstance(v, (str, bytes)) else 1 for v in table.values()), default=1)
    tick(len(owner) >> 2)
    produce(len(owner) * max(longest, 1), "translate", width=2)


def _m_case(owner: Any, *_a: Any) -> None:
    produce(
        len(owner) * (1 if isinstance(owner, bytes) or owner.isascii() else 3),
        "case mapping",
        width=width_of(owner),
    )


def _m_split(owner: Any, sep: Any = None, maxsplit: Any = -1) -> None:
    if sep is None:
        pieces = (
            _count_any(owner, _SPACES) + 1
            if isinstance(owner, bytes) or owner.isascii()
            else len(owner) // 2 + 1
        )
    elif isinstance(sep, (str, bytes)) and sep:
        pieces = owner.count(sep) + 1
    else:
        return  # the call itself refuses it
    if type(maxsplit) is int and maxsplit >= 0:
        pieces = min(pieces, maxsplit + 1)
    produce(pieces, "split", items=True, width=64)
    produce(len(owner), "split", width=width_of(owner))


def _m_splitlines(owner: Any, *_a: Any, **_k: Any) -> None:
    pieces = (
        _count_any(owner, _LINE_BREAKS) if isinstance(owner, str) else owner.count(b"\n") + owner.count(b"\r")
    ) + 1
    produce(pieces, "splitlines", items=True, width=64)
    produce(len(owner), "splitlines", width=width_of(owner))


def _m_encode(owner: Any, *_a: Any, **_k: Any) -> None:
    produce(len(owner) * (1 if owner.isascii() else 4), "encode")


def _m_hex(owner: Any, *_a: Any) -> None:
    produce(3 * len(owner), "hex")


def _m_copy(owner: Any, *_a: Any) -> None:
    produce(len(owner), "copy", items=True, width=8 if isinstance(owner, (list, tuple)) else 100)


def _m_fromkeys(owner: Any, iterable: Any = (), *rest: Any) -> tuple:
    items = materialize(iterable, "fromkeys")
    produce(len(items), "fromkeys", items=True, width=100)
    return (items, *rest)


def _m_to_bytes(owner: Any, length: Any = 1, *_a: Any, **_k: Any) -> None:
    produce(_num(length), "to_bytes")


def _m_strftime(owner: Any, fmt: Any = "", *_a: Any) -> None:
    produce(12 * text_len(fmt, "strftime") + 64, "strftime")


STR_METHODS: dict[str, Any] = {
    **dict.fromkeys(["center", "ljust", "rjust", "zfill"], _m_pad),
    **dict.fromkeys(["upper", "lower", "title", "capitalize", "swapcase", "casefold"], _m_case),
    **dict.fromkeys(["split", "rsplit"], _m_split),
    "expandtabs": _m_expandtabs, "format": _m_format, "format_map": _m_format_map, "join": _m_join,
    "replace": _m_replace, "translate": _m_translate, "splitlines": _m_splitlines, "encode": _m_encode,
    "hex": _m_hex,
}  # fmt: skip
OTHER_METHODS: dict[str, Any] = {
    "copy": _m_copy, "fromkeys": _m_fromkeys, "to_bytes": _m_to_bytes, "strftime": _m_strftime,
}  # fmt: skip


def method_estimate(owner: Any, name: str, args: tuple, kwargs: dict) -> tuple | None:
    """Check a method call on a value before it runs; new positional args when it drained one."""
    if isinstance(owner, (str, bytes, bytearray)):
        est = STR_METHODS.get(name)
        if est is None:
            tick(1 + (len(owner) >> 8))  # find/count/strip...: a pass over the string, output no larger
            return None
    else:
        est = OTHER_METHODS.get(name)
        if est is None:
            tick(1 + (size(owner) >> 4))  # list.count/index: ~16 items per operation
            return None
    try:
        return est(owner, *args, **kwargs)
    except TypeError:
        return None  # a wrong signature: the call itself raises the right TypeError
