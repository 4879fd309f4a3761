"""What each filter and method of the template sandbox would produce, checked before it runs
(issue 29.2): the tables the sandbox's filter wrapper and ``call`` hook consult."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from noetl_dagster.dsl.template_limits import (
    format_len,
    int_or_zero,
    join_len,
    json_len,
    materialize,
    percent_len,
    pprint_len,
    produce,
    size,
    text_len,
    tick,
    width_of,
)

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


def f_text(value: Any, *_a: Any, **_k: Any) -> None:  # a filter that str()s its input, output no larger
    if not isinstance(value, str):
        _text(value, "value")


def _f_case(value: Any, *_a: Any, **_k: Any) -> None:  # upper/title...: up to 3 characters per character
    factor = 1 if isinstance(value, str) and value.isascii() else 3
    if factor > 1 or not isinstance(value, str):
        _text(value, "case mapping", factor)


def _f_center(value: Any, width: Any = 80, *_a: Any, **_k: Any) -> None:
    produce(max(text_len(value, "center"), int_or_zero(width)), "center", width=width_of(value))


def _f_indent(s: Any, width: Any = 4, first: bool = False, blank: bool = False) -> None:
    n = text_len(s, "indent")
    lines = _count_any(s, _LINE_BREAKS) + 2
    pad = len(width) if isinstance(width, str) else int_or_zero(width)
    tick(lines)
    produce(n + lines * (pad + 1), "indent", width=width_of(s, width))


def _f_wordwrap(
    s: Any, width: Any = 79, break_long_words: bool = True, wrapstring: Any = None, *_a: Any, **_k: Any
) -> None:
    n = text_len(s, "wordwrap")
    wrap = len(wrapstring) if isinstance(wrapstring, str) else 1
    lines = min(n, n // max(int_or_zero(width), 1) + _count_any(s, _SPACES)) + 1
    tick(n // 2)  # textwrap is Python code, a few characters per step
    produce(n + lines * wrap, "wordwrap", width=width_of(s, wrapstring))


def _f_truncate(
    s: Any, length: Any = 255, killwords: bool = False, end: Any = "...", leeway: Any = None
) -> None:
    n = text_len(s, "truncate")
    produce(
        min(n, abs(int_or_zero(length)) + abs(int_or_zero(leeway)) + 5) + text_len(end),
        "truncate",
        width=width_of(s, end),
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


def f_list(value: Any) -> None:
    if isinstance(value, (str, list, tuple, dict, set, frozenset, range)):
        produce(len(value), "list", items=True)


def _f_reverse(value: Any) -> None:
    if isinstance(value, str):
        produce(len(value), "reverse", width=width_of(value))
    else:
        f_list(value)


def _f_sorting(value: Any, *_a: Any, **_k: Any) -> None:
    """sort, dictsort, unique, groupby: a list of the items."""
    n = size(value)
    tick(n)
    produce(n, "sort", items=True, width=64)


def _f_batch(value: Any, linecount: Any, fill_with: Any = None) -> None:
    n, per = size(value), max(int_or_zero(linecount), 1)
    if fill_with is not None:
        produce(per, "batch", items=True)
    tick(n)
    produce(n + n // per + 1, "batch", items=True, width=16)


def _f_slice(value: Any, slices: Any, fill_with: Any = None) -> None:
    n = size(value)
    tick(n)
    produce(n + max(int_or_zero(slices), 0), "slice", items=True, width=16)


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
    **dict.fromkeys(["trim", "striptags", "wordcount"], f_text),
    **dict.fromkeys(["upper", "lower", "title", "capitalize"], _f_case),
    **dict.fromkeys(["e", "escape", "forceescape"], _f_escape),
    **dict.fromkeys(["tojson", "to_json"], _f_tojson),
    **dict.fromkeys(["fromjson", "from_json"], _f_fromjson),
    **dict.fromkeys(["sort", "dictsort", "unique", "groupby"], _f_sorting),
    "center": _f_center, "indent": _f_indent, "wordwrap": _f_wordwrap, "truncate": _f_truncate,
    "format": _f_format, "replace": _f_replace, "pprint": _f_pprint, "urlencode": _f_urlencode,
    "urlize": _f_urlize, "xmlattr": _f_xmlattr, "string": _f_string, "list": f_list, "reverse": _f_reverse,
    "batch": _f_batch, "slice": _f_slice, "b64encode": _f_b64encode,
}  # fmt: skip


# -- methods of values (str, bytes, int, list, dict...) called from a template -------------------


def _m_pad(owner: Any, width: Any = 0, *rest: Any) -> None:
    produce(max(len(owner), int_or_zero(width)), "padding", width=width_of(owner, *rest))


def _m_expandtabs(owner: Any, tabsize: Any = 8) -> None:
    tabs = owner.count("\t" if isinstance(owner, str) else b"\t")
    produce(len(owner) + tabs * max(int_or_zero(tabsize), 1), "expandtabs", width=width_of(owner))


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
    produce(int_or_zero(length), "to_bytes")


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
