"""Helpers on the ruamel.yaml round-trip tree: the file's indentation, quoting styles, inserting,
moving and renaming keys with their comments, line numbers, and walking strings."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import (
    DoubleQuotedScalarString,
    FoldedScalarString,
    LiteralScalarString,
    SingleQuotedScalarString,
)

from .constants import RAW_TEXT_KEYS


def _layout(doc: Any) -> tuple[int, int, int]:
    """(mapping indent, sequence indent, dash offset) as the document itself is written."""
    mapping = sequence = offset = None
    todo = [doc]
    while todo and (mapping is None or sequence is None):
        node = todo.pop(0)
        if not isinstance(node, CommentedMap) or node.fa.flow_style():
            continue
        for k, v in node.items():
            try:
                kline, kcol = node.lc.key(k)
            except (KeyError, TypeError, AttributeError):
                continue
            if isinstance(v, CommentedMap) and not v.fa.flow_style() and len(v) and mapping is None:
                vline, vcol = v.lc.key(next(iter(v)))
                if vline > kline:
                    mapping = vcol - kcol
            elif isinstance(v, CommentedSeq) and not v.fa.flow_style() and len(v) and sequence is None:
                iline, icol = v.lc.item(0)
                if iline > kline and v.lc.col is not None:
                    offset, sequence = v.lc.col - kcol, icol - kcol
            if isinstance(v, CommentedMap):
                todo.append(v)
            elif isinstance(v, CommentedSeq):
                todo.extend(x for x in v if isinstance(x, CommentedMap))
    mapping = mapping if mapping and mapping > 0 else 2
    offset = offset if offset is not None and offset >= 0 else 0
    sequence = sequence if sequence and sequence >= offset + 2 else offset + 2
    return mapping, sequence, offset


def _yaml_for(text: str) -> YAML:
    y = YAML()
    y.preserve_quotes = True
    # files dumped by PyYAML fold long quoted strings at 80 columns; hand-written ones do not
    y.width = 80 if re.search(r"\\\n\s+\\?", text) else 4096
    # `key: null` reads better than `key:` (ruamel's default for None)
    y.representer.add_representer(
        type(None), lambda rep, _: rep.represent_scalar("tag:yaml.org,2002:null", "null")
    )
    return y


def _restyle(old: Any, new: str) -> Any:
    for cls in (DoubleQuotedScalarString, SingleQuotedScalarString, LiteralScalarString):
        if isinstance(old, cls):
            return cls(new)
    if isinstance(old, FoldedScalarString):
        return LiteralScalarString(new) if "\n" in new else DoubleQuotedScalarString(new)
    return new


def _dq(value: Any) -> Any:
    if isinstance(value, str) and not isinstance(value, (DoubleQuotedScalarString, SingleQuotedScalarString,
                                                          LiteralScalarString, FoldedScalarString)):  # fmt: skip
        if "\n" in value:
            return LiteralScalarString(value)
        if "{{" in value or "{%" in value:
            return DoubleQuotedScalarString(value)
    return value


def _cm(*pairs: tuple[str, Any], **kw: Any) -> CommentedMap:
    m = CommentedMap()
    for k, v in pairs:
        m[k] = v
    for k, v in kw.items():
        m[k] = v
    return m


def _flow(m: CommentedMap) -> CommentedMap:
    m.fa.set_flow_style()
    return m


def _index(m: CommentedMap, key: Any) -> int:
    return list(m.keys()).index(key)


def _rename_key(m: CommentedMap, old: Any, new: Any) -> None:
    pos = _index(m, old)
    comment = m.ca.items.pop(old, None)
    value = m.pop(old)
    m.insert(pos, new, value)
    if comment is not None:
        m.ca.items[new] = comment


def _pop(m: CommentedMap, key: Any, dst: CommentedMap | None = None, dst_key: Any = None) -> Any:
    """Remove ``key`` (and its comment); when ``dst`` is given, append the pair there, comment included."""
    comment = m.ca.items.pop(key, None)
    value = m.pop(key)
    if dst is not None:
        k = key if dst_key is None else dst_key
        dst[k] = value
        if comment is not None:
            dst.ca.items[k] = comment
    return value


def _put(
    m: CommentedMap, key: Any, value: Any, *, after: Any = None, before: Any = None, at: int | None = None
) -> None:
    """Insert or replace ``key``, placed after/before another key when given."""
    if key in m:
        m[key] = value
        return
    if at is not None:
        m.insert(min(at, len(m)), key, value)
    elif after is not None and after in m:
        m.insert(_index(m, after) + 1, key, value)
    elif before is not None and before in m:
        m.insert(_index(m, before), key, value)
    else:
        m[key] = value


def _line(node: Any, key: Any = None, default: int = 1) -> int:
    try:
        if key is not None and isinstance(node, CommentedMap) and key in node.lc.data:
            return node.lc.key(key)[0] + 1
        if (
            key is not None
            and isinstance(node, CommentedSeq)
            and isinstance(key, int)
            and key in node.lc.data
        ):
            return node.lc.item(key)[0] + 1
        if getattr(node, "lc", None) is not None and node.lc.line is not None:
            return node.lc.line + 1
    except (AttributeError, KeyError, TypeError, IndexError):
        pass
    return default


def _last_slot(node: Any) -> tuple[Any, Any] | None:
    """(container, key) of a node's deepest last entry: where the comment after it is stored."""
    while True:
        if isinstance(node, CommentedMap) and len(node):
            k = list(node.keys())[-1]
            if isinstance(node[k], (CommentedMap, CommentedSeq)) and len(node[k]):
                node = node[k]
                continue
            return node, k
        if isinstance(node, CommentedSeq) and len(node):
            i = len(node) - 1
            if isinstance(node[i], (CommentedMap, CommentedSeq)) and len(node[i]):
                node = node[i]
                continue
            return node, i
        return None


def _take_trailing(node: Any) -> Any:
    """Detach the comment / blank lines that follow ``node`` (they belong after it, wherever it ends)."""
    slot = _last_slot(node)
    if slot is None:
        return None
    container, key = slot
    entry = container.ca.items.get(key)
    idx = 2 if isinstance(container, CommentedMap) else 0
    if entry and len(entry) > idx and entry[idx] is not None:
        tok = entry[idx]
        entry[idx] = None
        return tok
    return None


def _give_trailing(node: Any, tok: Any) -> None:
    if tok is None:
        return
    slot = _last_slot(node)
    if slot is None:
        return
    container, key = slot
    idx = 2 if isinstance(container, CommentedMap) else 0
    entry = container.ca.items.setdefault(key, [None, None, None, None] if idx == 2 else [None, None])
    if entry[idx] is None:
        entry[idx] = tok


def _walk_strings(node: Any, fn: Callable[[str, tuple], Any], path: tuple = ()) -> None:
    """Call ``fn(text, path)`` on every string (code bodies excepted); a returned value replaces it."""
    if isinstance(node, dict):
        for k in list(node.keys()):
            v = node[k]
            if k in RAW_TEXT_KEYS:
                continue
            if isinstance(v, str):
                new = fn(v, (*path, k))
                if new is not None and new != v:
                    node[k] = _restyle(v, new)
            else:
                _walk_strings(v, fn, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            if isinstance(v, str):
                new = fn(v, (*path, i))
                if new is not None and new != v:
                    node[i] = _restyle(v, new)
            else:
                _walk_strings(v, fn, (*path, i))


def _format_path(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + str(p)
    return out


def _plain(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    if isinstance(node, str):
        return str(node)
    return node
