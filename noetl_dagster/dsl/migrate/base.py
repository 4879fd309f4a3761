"""The state every rule mixin shares: the document, its file name, the notes, and the facts the scan
collects; plus ``note`` / ``refuse``, the only way a rule reports."""

from __future__ import annotations

from typing import Any

from ruamel.yaml.comments import CommentedMap

from .report import MigrationNote, _Refuse
from .yamltree import _format_path, _line


class MigratorBase:
    """Per-document state of a migration; ``driver._Migrator`` combines it with the rule mixins."""

    # set by the driver (`_index_steps`, `_scan`) and `_root` before the step rules run
    steps: dict[str, CommentedMap]
    v1: bool
    root_vars: list[Any]
    workload_keys: set[Any]
    written_vars: set[str]
    task_callers: dict[str, list[str]]
    incoming: dict[str, set[str]]

    def __init__(self, doc: CommentedMap, file: str):
        self.doc = doc
        self.file = file
        self.notes: list[MigrationNote] = []
        self.frozen: set[int] = set()  # ids of steps left exactly as written (a refused construct spans them)

    # -- notes -----------------------------------------------------------------
    def note(self, level: str, rule: str, message: str, node: Any = None, key: Any = None, path: tuple = (),
             line: int | None = None) -> None:  # fmt: skip
        ln = line if line is not None else _line(node, key, default=_line(self.doc))
        self.notes.append(MigrationNote(self.file, ln, _format_path(path), level, rule, message))

    def refuse(self, e: _Refuse, rule: str, node: Any, key: Any, path: tuple) -> None:
        self.note("refused", rule, f"{e.message}; left as written", e.node if e.node is not None else node,
                  e.key if e.node is not None else key, path)  # fmt: skip
