"""The migration driver: ``_Migrator`` (the rule mixins combined, the order the rules run in, the step
index and scan, one step's rules) and the public entry points ``migrate_text`` / ``migrate_file``."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import YAMLError

from .case import CaseMixin
from .loop_body import LoopBodyMixin
from .loops import LoopMixin
from .pieces import _task_items
from .policies import PolicyMixin
from .renames import RenameMixin
from .report import MigrationInputError, MigrationNote, MigrationResult
from .root import RootMixin
from .routing import RoutingMixin
from .steps import StepMixin
from .storage import StorageMixin
from .yamltree import (
    _cm,
    _flow,
    _give_trailing,
    _layout,
    _plain,
    _put,
    _take_trailing,
    _yaml_for,
)

try:
    from yaml import CSafeLoader as _FastLoader
except ImportError:  # pragma: no cover - libyaml missing
    from yaml import SafeLoader as _FastLoader  # type: ignore[assignment]


class _Migrator(
    RootMixin,
    StepMixin,
    PolicyMixin,
    RoutingMixin,
    StorageMixin,
    CaseMixin,
    LoopMixin,
    LoopBodyMixin,
    RenameMixin,
):
    """Rewrites one legacy playbook document in place; the mixins hold the rules."""

    # -- entry -----------------------------------------------------------------
    def run(self) -> None:
        self._root()
        steps = self.doc.get("workflow")
        if not isinstance(steps, list):
            return
        self._index_steps()
        self._scan()
        self._global_templates()
        self._v1_loops()
        for s in list(steps):
            if isinstance(s, dict):
                self._step(s, ("workflow", steps.index(s)))
        self._root_vars()
        self._legacy_pg_results()
        self._v1_workbook_inputs()
        self._renames()  # last: also renames the old spellings the rules above wrote

    def _region(self, L: CommentedMap, E: CommentedMap) -> list[CommentedMap]:
        """L, E and every step reachable from L's `next` without passing E."""
        out = [L, E]
        todo = [t.step for g in self._legacy_groups(L, quiet=True) or [] for t in g.targets]
        while todo:
            n = todo.pop()
            st = self.steps.get(n)
            if st is None or any(st is o for o in out):
                continue
            out.append(st)
            todo.extend(t.step for g in self._legacy_groups(st, quiet=True) or [] for t in g.targets)
        return out

    def _index_steps(self) -> None:
        self.steps: dict[str, CommentedMap] = {}
        for s in self.doc.get("workflow") or []:
            if isinstance(s, dict) and isinstance(s.get("step"), str):
                self.steps.setdefault(s["step"], s)

    # -- scan ------------------------------------------------------------------
    def _scan(self) -> None:
        """Facts the template rewrites need: vars, v1 task callers, incoming arc keys, loop names."""
        d = self.doc
        self.root_vars = list(d["vars"].keys()) if isinstance(d.get("vars"), dict) else []
        self.workload_keys = set(d["workload"].keys()) if isinstance(d.get("workload"), dict) else set()
        self.written_vars: set[str] = set()
        self.task_callers: dict[str, list[str]] = {}
        self.incoming: dict[str, set[str]] = {}
        for name, s in self.steps.items():
            if isinstance(s.get("vars"), dict):
                self.written_vars |= {str(k) for k in s["vars"]}
            for c in s.get("case") or [] if isinstance(s.get("case"), list) else []:
                then = c.get("then") if isinstance(c, dict) else None
                for action in then if isinstance(then, list) else [then]:
                    if isinstance(action, dict) and isinstance(action.get("set"), dict):
                        self.written_vars |= {str(k) for k in action["set"]}
            tool = s.get("tool")
            for t in _task_items(tool) or []:
                for rule in t.body.get("eval") or [] if isinstance(t.body.get("eval"), list) else []:
                    body = (
                        rule.get("else")
                        if isinstance(rule, dict) and isinstance(rule.get("else"), dict)
                        else rule
                    )
                    if isinstance(body, dict) and isinstance(body.get("set_vars"), dict):
                        self.written_vars |= {str(k) for k in body["set_vars"]}
            task = s.get("task") if s.get("type", "workbook") == "workbook" else None
            if isinstance(task, str):
                self.task_callers.setdefault(task, []).append(name)
            for g in self._legacy_groups(s, quiet=True) or []:
                for t in g.targets:
                    if isinstance(t.args, dict):
                        self.incoming.setdefault(t.step, set()).update(str(k) for k in t.args)

    # -- one step ----------------------------------------------------------------
    def _step(self, s: CommentedMap, path: tuple) -> None:
        if not isinstance(s.get("step"), str) or id(s) in self.frozen:
            return
        before = _plain(s)
        trailing = _take_trailing(s)
        try:
            self._step_body(s, path)
        finally:
            _give_trailing(s, trailing)
        if s.fa.flow_style() and _plain(s) != before:
            s.fa.set_block_style()  # a rewritten one-line step reads better in block style

    def _step_body(self, s: CommentedMap, path: tuple) -> None:
        if "end_loop" in s:
            self.note("refused", "end-loop", f"`end_loop: {s['end_loop']}` has no loop step whose chain reaches it",
                      s, "end_loop", (*path, "end_loop"))  # fmt: skip
        self._v1_tool(s, path)
        self._step_when(s, path)
        for key in ("args", "with"):
            if isinstance(s.get(key), dict):
                self._step_input(s, key, path)
            elif key in s:
                self.note("refused", "step-input", f"step `{key}` is not a mapping of input names; left as written",
                          s, key, (*path, key))  # fmt: skip
        tasks = _task_items(s.get("tool"))
        for t in tasks or []:
            self._task_body(t.body, (*path, "tool"), s)
        if "retry" in s:
            self._step_retry(s, path)
        for key in ("save", "sink"):
            if key in s:
                self._step_sink(s, key, path)
        if "case" in s:
            self._case(s, path)
        if "vars" in s:
            self._step_vars(s, path)
        if isinstance(s.get("next"), (list, str)) and "case" not in s:
            self._next(s, path)
        self._loop(s, path)
        self._passthrough_inputs(s, path)
        if "tool" not in s and "next" not in s and not any(k in s for k in ("case", "end_loop", "type")):
            _put(s, "tool", _flow(_cm(kind="noop")), after="desc" if "desc" in s else "step")
            self.note("info", "empty-step", "a step with neither tool nor next got `tool: {kind: noop}`", s, "step",
                      (*path, "step"))  # fmt: skip


def migrate_text(text: str, file: str = "<memory>") -> MigrationResult:
    """Migrate one playbook's YAML text; the result keeps the original when nothing is legacy."""
    from noetl_dagster.dsl.legacy import find_deprecated_spellings, find_legacy_constructs

    try:  # libyaml first: most files are standard already and need no round-trip tree
        quick = yaml.load(text, Loader=_FastLoader)
    except yaml.YAMLError:
        quick = None  # let ruamel report the error with its line
    if (isinstance(quick, dict) and quick.get("kind") == "Playbook" and not find_legacy_constructs(quick)
            and not find_deprecated_spellings(quick)):  # fmt: skip
        return MigrationResult(file, text, text, [])
    y = _yaml_for(text)
    try:
        doc = y.load(text)
    except YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise MigrationInputError(f"{file}:{line}: yaml-syntax: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(doc, CommentedMap):
        raise MigrationInputError(f"{file}:1: not-a-playbook: the document is not a mapping")
    mapping, sequence, offset = _layout(doc)
    y.indent(mapping=mapping, sequence=sequence, offset=offset)
    if doc.get("kind") != "Playbook":
        raise MigrationInputError(f"{file}:1: not-a-playbook: `kind` is {doc.get('kind')!r}, not Playbook")
    if not _needs_migration(doc, find_legacy_constructs) and not find_deprecated_spellings(doc):
        return MigrationResult(file, text, text, [])
    before = _plain(doc)
    m = _Migrator(doc, file)
    m.run()
    if _plain(doc) == before:  # only refusals: keep the file byte for byte
        return MigrationResult(file, text, text, sorted(m.notes, key=lambda n: (n.line, n.level)))
    out = io.StringIO()
    y.dump(doc, out)
    new = out.getvalue()
    if not new.endswith("\n"):
        new += "\n"
    notes = sorted(m.notes, key=lambda n: (n.line, n.level))
    return MigrationResult(file, text, new, notes)


def _needs_migration(doc: CommentedMap, finder: Callable[[dict], list]) -> bool:
    if finder(doc):
        return True
    # steps with neither tool nor next: only rewritten inside files that are legacy anyway
    return False


def migrate_file(path: str | Path) -> MigrationResult:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise MigrationInputError(f"{p}: cannot read: {e.strerror}") from None
    return migrate_text(text, str(p))


def iter_notes(results: list[MigrationResult]) -> Iterator[MigrationNote]:
    for r in results:
        yield from r.notes
