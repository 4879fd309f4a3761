"""The PyYAML-free part of the loader: source positions (``SourceMap``, ``format_path``), the YAML
error types and limits. The parser and the engine import these; only ``dsl/loader.py`` imports
PyYAML, so a run answered by the parse cache (dsl/cache.py) never imports it (issue 35)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from noetl_dagster.util.files import InputFileError, read_bounded


def _env_int(name: str, default: int) -> int:
    try:
        value = int(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


@dataclass(frozen=True)
class YamlLimits:
    """Bounds on one YAML document (see docs/limits.md)."""

    max_bytes: int = 4 * 1024 * 1024  # size of the text, UTF-8
    max_depth: int = 100  # nested mappings/sequences
    max_nodes: int = 2_000_000  # nodes after alias expansion
    max_aliases: int = 10_000  # alias references (*name)
    max_alias_nodes: int = 100_000  # nodes added by expanding aliases
    max_expanded_chars: int = 16 * 1024 * 1024  # scalar text after alias expansion (keys and values)

    @classmethod
    def from_env(cls) -> YamlLimits:
        d = cls()
        return cls(
            max_bytes=_env_int("NOETL_YAML_MAX_BYTES", d.max_bytes),
            max_depth=_env_int("NOETL_YAML_MAX_DEPTH", d.max_depth),
            max_nodes=_env_int("NOETL_YAML_MAX_NODES", d.max_nodes),
            max_aliases=d.max_aliases,
            max_alias_nodes=d.max_alias_nodes,
            max_expanded_chars=_env_int("NOETL_YAML_MAX_EXPANDED_CHARS", d.max_expanded_chars),
        )


PathT = tuple[str | int, ...]


class YamlSyntaxError(ValueError):
    rule = "yaml-syntax"

    def __init__(self, file: str, line: int, message: str):
        super().__init__(f"{file}:{line}: {self.rule}: {message}")
        self.file, self.line, self.message = file, line, message


class YamlDuplicateKey(YamlSyntaxError):
    """A mapping names the same key twice (YAML requires unique keys)."""

    rule = "duplicate-key"


class YamlLimitError(YamlSyntaxError):
    """The document exceeds one of :class:`YamlLimits`; ``limit`` names it."""

    rule = "yaml-limit"

    def __init__(self, file: str, line: int, limit: str, message: str):
        self.limit = limit
        super().__init__(file, line, f"{limit}: {message}")


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


class YamlFileError(YamlSyntaxError):
    """The file cannot be read as a document at all: missing, unreadable, or not a regular file
    (a FIFO, a device). ``rule`` is the reader's: ``file-not-found``, ``cannot-read``, ``not-a-file``."""

    def __init__(self, file: str, rule: str, message: str):
        self.rule = rule
        super().__init__(file, 0, message)


def read_text_file(path: str | Path, limits: YamlLimits | None = None, *, what: str = "file") -> str:
    """Read a UTF-8 text file through the bounded reader: a missing or non-regular file is a
    :class:`YamlFileError`, one over ``max_bytes`` a :class:`YamlLimitError`, binary or non-UTF-8
    text a :class:`YamlSyntaxError`."""
    p = Path(path)
    lim = limits or YamlLimits.from_env()
    try:
        data = read_bounded(p, lim.max_bytes, what=what)
    except InputFileError as e:
        if e.rule == "max-bytes":
            raise YamlLimitError(str(p), 1, "max-bytes", e.message) from None
        raise YamlFileError(str(p), e.rule, e.message) from None
    if b"\x00" in data:
        raise YamlSyntaxError(str(p), 1, "binary file (contains NUL bytes), not YAML text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise YamlSyntaxError(str(p), line, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
