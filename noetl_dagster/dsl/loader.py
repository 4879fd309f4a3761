"""YAML loading that keeps source lines, within fixed limits.

PyYAML (libyaml when present) composes the node tree once; we build plain
Python data from it and, alongside, a :class:`SourceMap` from YAML paths
(tuples of keys and indexes) to 1-based line numbers.

Every command reads YAML through here, so the limits live here
(docs/limits.md): document size, nesting depth, node count, alias count, the
number of nodes aliases expand to and the size of the text they expand to (a
"billion laughs" file, or one long scalar aliased thousands of times, is
refused in milliseconds, before anything is built). A refusal is a
:class:`YamlLimitError` naming the limit that was hit. A key given twice in
one mapping is a :class:`YamlDuplicateKey` (YAML requires unique keys; PyYAML
would keep the last one silently). Files are read by the one bounded reader
(:func:`noetl_dagster.util.files.read_bounded`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from noetl_dagster.dsl.source import (  # noqa: F401 - re-exported: the yaml-free part lives in dsl/source.py
    PathT,
    SourceMap,
    YamlDuplicateKey,
    YamlFileError,
    YamlLimitError,
    YamlLimits,
    YamlSyntaxError,
    _env_int,
    format_path,
    read_text_file,
)

try:  # libyaml is ~10x faster when available
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover
    from yaml import SafeLoader as _Loader  # type: ignore[assignment]


class _Builder(_Loader):  # type: ignore[misc,valid-type]
    pass


def check_yaml_limits(text: str, file: str = "<memory>", limits: YamlLimits | None = None) -> None:
    """Scan the event stream (flat, no recursion, nothing built) and raise
    :class:`YamlLimitError` when a limit is exceeded. Syntax errors are left to
    the loader that follows (they raise :class:`YamlSyntaxError` there)."""
    lim = limits or YamlLimits.from_env()
    size = len(text.encode("utf-8", "surrogatepass")) if len(text) * 4 > lim.max_bytes else len(text)
    if size > lim.max_bytes:
        raise YamlLimitError(file, 1, "max-bytes", f"document is {size} bytes; the limit is {lim.max_bytes}")
    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (nodes, scalar characters) of its subtree
    stack: list[list[Any]] = []  # [anchor, subtree node count, subtree scalar characters]
    total = aliases = alias_nodes = chars = 0
    parser = _Builder(text)
    try:
        while True:
            ev = parser.get_event()
            if ev is None or isinstance(ev, yaml.StreamEndEvent):
                break
            line = ev.start_mark.line + 1 if ev.start_mark else 1
            if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                stack.append([ev.anchor, 1, 0])
                if len(stack) > lim.max_depth:
                    raise YamlLimitError(
                        file, line, "max-depth", f"nesting is deeper than {lim.max_depth} levels"
                    )
                continue
            if isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                anchor, n, size = stack.pop()
                if anchor is not None:
                    anchors[anchor] = (n, size)
                if stack:
                    stack[-1][1] += n
                    stack[-1][2] += size
                continue
            if isinstance(ev, yaml.ScalarEvent):
                n, size = 1, len(ev.value)
                if ev.anchor is not None:
                    anchors[ev.anchor] = (1, size)
            elif isinstance(ev, yaml.AliasEvent):
                aliases += 1
                n, size = anchors.get(ev.anchor, (1, 0))
                alias_nodes += n
                if aliases > lim.max_aliases:
                    raise YamlLimitError(
                        file, line, "max-aliases", f"more than {lim.max_aliases} alias references"
                    )
                if alias_nodes > lim.max_alias_nodes:
                    raise YamlLimitError(
                        file, line, "max-alias-nodes",
                        f"aliases expand to more than {lim.max_alias_nodes} nodes (an alias bomb?)",
                    )  # fmt: skip
            else:
                continue
            total += n
            chars += size  # what building the data would hold: an alias counts its anchor's text again
            if total > lim.max_nodes:
                raise YamlLimitError(file, line, "max-nodes", f"more than {lim.max_nodes} nodes")
            if chars > lim.max_expanded_chars:
                raise YamlLimitError(
                    file, line, "max-expanded-chars",
                    f"with its aliases expanded the document holds more than {lim.max_expanded_chars}"
                    " characters of text",
                )  # fmt: skip
            if stack:
                stack[-1][1] += n
                stack[-1][2] += size
    except yaml.YAMLError:
        return  # the loader reports syntax errors with their position
    finally:
        parser.dispose()


def _construct(loader: Any, node: yaml.Node, path: PathT, lines: dict[PathT, int]) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        own = node.value  # the pairs written here: a `<<` merge makes a new list with its pairs first
        loader.flatten_mapping(node)
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _key(loader, key_node)
            child = (*path, key if isinstance(key, (str, int)) else str(key))
            out[key] = _construct(loader, value_node, child, lines)
            lines[child] = key_node.start_mark.line + 1
        if len(out) < len(
            node.value
        ):  # fewer keys than pairs: one given twice, or one overriding a merged one
            _refuse_duplicate(loader, own, path)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(loader, item, (*path, i), lines) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def _key(loader: Any, key_node: yaml.Node) -> Any:
    key = loader.construct_object(key_node, deep=True)  # (cached by node: a second call is a lookup)
    if isinstance(key, list):
        key = tuple(key)
    try:
        hash(key)
    except TypeError:
        raise YamlSyntaxError("", key_node.start_mark.line + 1, "a mapping key must be a scalar") from None
    return key


def _refuse_duplicate(loader: Any, own: list[tuple[yaml.Node, yaml.Node]], path: PathT) -> None:
    """A key written twice in one mapping is a YamlDuplicateKey (PyYAML keeps the last silently: a
    playbook that says two things is refused); a key overriding one merged in by `<<` is not."""
    first: dict[Any, int] = {}
    for key_node, _ in own:
        key = _key(loader, key_node)
        line = key_node.start_mark.line + 1
        if key in first:
            child = (*path, key if isinstance(key, (str, int)) else str(key))
            raise YamlDuplicateKey(
                "", line, f"{format_path(child)}: given twice in this mapping (first at line {first[key]})"
            )
        first[key] = line


def load_yaml_text(
    text: str, file: str = "<memory>", limits: YamlLimits | None = None
) -> tuple[Any, SourceMap]:
    """Parse one YAML document; return (data, source map).

    Raises YamlSyntaxError (YamlLimitError when a limit is hit)."""
    check_yaml_limits(text, file, limits)
    loader = _Builder(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, SourceMap(file, {(): 1})
        lines: dict[PathT, int] = {}
        data = _construct(loader, node, (), lines)
        return data, SourceMap(file, lines)
    except YamlSyntaxError as e:  # from _construct, which does not know the file name
        cls = YamlDuplicateKey if isinstance(e, YamlDuplicateKey) else YamlSyntaxError
        raise cls(file, e.line, e.message) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        raise YamlSyntaxError(file, line, f"{e.problem or e}".strip()) from None
    except yaml.YAMLError as e:
        raise YamlSyntaxError(file, 1, str(e)) from None
    except RecursionError:  # pragma: no cover - max_depth keeps this out of reach
        raise YamlLimitError(file, 1, "max-depth", "nesting is too deep") from None
    except (ValueError, OverflowError, TypeError) as e:  # e.g. a timestamp PyYAML cannot build
        raise YamlSyntaxError(file, 1, f"{type(e).__name__}: {e}") from None
    finally:
        loader.dispose()


def load_yaml_file(
    path: str | Path, limits: YamlLimits | None = None, *, what: str = "file"
) -> tuple[Any, SourceMap]:
    p = Path(path)
    return load_yaml_text(read_text_file(p, limits, what=what), str(p), limits)
