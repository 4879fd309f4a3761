"""YAML loading that keeps source lines.

PyYAML (libyaml when present) composes the node tree once; we build plain
Python data from it and, alongside, a :class:`SourceMap` from YAML paths
(tuples of keys and indexes) to 1-based line numbers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

try:  # libyaml is ~10x faster when available
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover
    from yaml import SafeLoader as _Loader  # type: ignore[assignment]

PathT = tuple[str | int, ...]


class YamlSyntaxError(ValueError):
    def __init__(self, file: str, line: int, message: str):
        super().__init__(f"{file}:{line}: yaml-syntax: {message}")
        self.file, self.line, self.message = file, line, message


@dataclass
class SourceMap:
    file: str = "<memory>"
    lines: dict[PathT, int] = field(default_factory=dict)

    def line(self, path: Iterable[str | int]) -> int:
        """Line of ``path``, or of its nearest ancestor that has one."""
        p = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return self.lines.get((), 1)


def format_path(path: Iterable[str | int]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<root>"


class _Builder(_Loader):  # type: ignore[misc,valid-type]
    pass


def _construct(loader: Any, node: yaml.Node, path: PathT, lines: dict[PathT, int]) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if isinstance(key, list):
                key = tuple(key)
            child = (*path, key if isinstance(key, (str, int)) else str(key))
            out[key] = _construct(loader, value_node, child, lines)
            lines.setdefault(child, key_node.start_mark.line + 1)
            lines[child] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(loader, item, (*path, i), lines) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def load_yaml_text(text: str, file: str = "<memory>") -> tuple[Any, SourceMap]:
    """Parse one YAML document; return (data, source map). Raises YamlSyntaxError."""
    loader = _Builder(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, SourceMap(file, {(): 1})
        lines: dict[PathT, int] = {}
        data = _construct(loader, node, (), lines)
        return data, SourceMap(file, lines)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        raise YamlSyntaxError(file, line, f"{e.problem or e}".strip()) from None
    except yaml.YAMLError as e:
        raise YamlSyntaxError(file, 1, str(e)) from None
    finally:
        loader.dispose()


def load_yaml_file(path: str | Path) -> tuple[Any, SourceMap]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise YamlSyntaxError(str(p), 1, f"not UTF-8 text ({e.reason})") from None
    return load_yaml_text(text, str(p))
