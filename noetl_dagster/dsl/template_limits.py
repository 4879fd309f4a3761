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
    n = total = 0
    for x in it:
        n += 1
        if n == 64:
            if item_bytes:
                produce(64, "iteration", items=True, width=item_bytes)
            tick(64)
            total += 64
            if total > MAX_ITEMS:
                raise LimitExceeded(f"a lazy sequence would have more than {MAX_ITEMS:,} items")
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
_WIDE = re.compile(r"\d{4}")
_SPEC = re.compile(r"(?:.?[<>=^])?[-+ ]?z?#?0?(?P<width>\d*)[,_]?(?:\.(?P<prec>\d+))?[a-zA-Z%]?$", re.S)


def int_or_zero(v: Any) -> int:
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
    if len(fmt) <= 256 and "*" not in fmt and not _WIDE.search(fmt):  # the usual '%s-%05d': widths < 1000
        quick = len(fmt)
        for a in args:
            ta = type(a)
            if ta is str and len(a) <= 4096:
                quick += len(a)
            elif ta is int or ta is float or ta is bool or a is None:
                quick += 24
            else:
                break
        else:
            return quick
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
        width = int_or_zero(take()) if w == "*" else int(w or 0)
        prec = (int_or_zero(take()) if p == "*" else int(p)) if p is not None else None
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
