"""What every validation walk shares: the DSL's constants, the issue type and the walk's context."""

from __future__ import annotations

from dataclasses import dataclass

from noetl_dagster.dsl.kinds import is_known
from noetl_dagster.dsl.source import PathT, SourceMap, format_path

API_VERSION = "noetl.io/v2"
DIRECTIVES = {"continue", "retry", "jump", "break", "fail"}
BACKOFFS = {"none", "fixed", "linear", "exponential"}
MAX_RETRY_ATTEMPTS = 1_000  # docs/limits.md
MAX_RETRY_DELAY = 3_600.0  # seconds; a templated delay is clamped to it at run time
# keys of a task's ``spec`` that are runtime knobs; any other key found under
# ``spec`` is a tool input written in the runtime dialect's "keys under spec" style
TASK_SPEC_KNOBS = {
    "policy", "isolation", "timeout", "timeout_seconds", "resources", "exec", "placement",
    "sink", "cache", "max_in_flight", "pool", "env", "assert",
}  # fmt: skip
TASK_META_KEYS = {"kind", "name", "spec", "set", "loop", "desc", "pure"}
# step keys that belong to earlier eras (SEMANTICS §1: migrate, never run)
LEGACY_STEP_KEYS = {
    "case": "`case:` routing",
    "type": "step `type:`",
    "sink": "step `sink:`",
    "save": "`save:` blocks",
    "retry": "step `retry:` blocks",
    "vars": "step `vars:`",
    "end_loop": "`end_loop`",
    "task": "`task:`/`with:` workbook calls",
    "with": "`task:`/`with:` workbook calls",
}
# NoETL's renamed keys (old -> new): accepted side by side with a deprecation warning
# (dsl.legacy.find_deprecated_spellings); `noetl-dagster migrate` rewrites them.
IGNORED_STEP_KEYS = {"output", "command", "metadata", "labels"}


@dataclass(frozen=True)
class ValidationIssue:
    file: str
    line: int
    path: str
    rule: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path and self.path != "<root>" else ""
        return f"{self.file}:{self.line}: {self.rule}: {where}{self.message}"


class PlaybookInvalid(ValueError):
    def __init__(self, issues: list[ValidationIssue]):
        self.issues = issues
        super().__init__("\n".join(str(i) for i in issues))


class ParseContext:
    def __init__(self, source_map: SourceMap, check_kinds: bool):
        self.sm = source_map
        self.issues: list[ValidationIssue] = []
        self.check_kinds = check_kinds

    def err(self, path: PathT, rule: str, message: str) -> None:
        self.issues.append(
            ValidationIssue(self.sm.file, self.sm.line(path), format_path(path), rule, message)
        )

    def known_kind(self, kind: str) -> bool:
        if not self.check_kinds:
            return True
        return self.registered(kind)

    def registered(self, kind: str) -> bool:
        return is_known(kind)  # built-in names without the entry-point scan (dsl/kinds.BUILTIN_KINDS)


MIGRATE_HINT = "run `noetl-dagster migrate FILE` to rewrite it to the standard form"
