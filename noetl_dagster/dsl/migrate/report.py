"""What a migration reports: notes (file, line, YAML path, level, rule, message), the result, and the
two errors (bad input; a construct refused, which leaves it as written)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MigrationNote:
    file: str
    line: int
    path: str
    level: str  # refused | warning | info
    rule: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{self.file}:{self.line}: {self.level}: {self.rule}: {where}{self.message}"


@dataclass
class MigrationResult:
    file: str
    original: str
    text: str
    notes: list[MigrationNote] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.text != self.original

    @property
    def refused(self) -> list[MigrationNote]:
        return [n for n in self.notes if n.level == "refused"]


class MigrationInputError(ValueError):
    """The input is not a playbook the migration can read (bad YAML, not a mapping, not a Playbook)."""


class _Refuse(Exception):
    """A construct cannot be translated faithfully; the caller leaves it untouched."""

    def __init__(self, message: str, node: Any = None, key: Any = None):
        super().__init__(message)
        self.message = message
        self.node = node
        self.key = key
