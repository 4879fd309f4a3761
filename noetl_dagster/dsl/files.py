"""Playbook files: YAML (``.yaml``/``.yml``) and flow (``.flow``) sources to one model.

This is the top of the ``dsl`` layer: it picks the front end by file suffix.
Every file a command is given is read by :func:`read_bounded` (re-exported here from
``util.files``): regular files only, never more than a limit, a one-line refusal otherwise.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from noetl_dagster.dsl.legacy import find_deprecated_spellings
from noetl_dagster.dsl.loader import SourceMap, YamlFileError, YamlSyntaxError, format_path, load_yaml_file
from noetl_dagster.dsl.model import Playbook
from noetl_dagster.dsl.parse import (
    PlaybookInvalid,
    ValidationIssue,
    executor_warnings,
    load_playbook_dict,
    parse_playbook,
)
from noetl_dagster.util.files import InputFileError, read_bounded, read_bounded_text
from noetl_dagster.util.graphs import strongly_connected

__all__ = ["InputFileError", "read_bounded", "read_bounded_text"]  # the one bounded reader, for every caller


# Parsed playbooks of this process, by file identity (issue 35): a worker running the same file for
# every request parsed and validated it each time (~1/3 of a 5-step execution's client CPU). The key
# changes when the file does (path, inode, size, mtime and ctime in ns), when a kind is registered
# or $NOETL_MAX_STEPS changes; only valid playbooks are kept. Callers treat a Playbook as read-only
# (the Dagster code location shares one per file across its runs the same way).
_PARSED: OrderedDict[tuple[Any, ...], Playbook] = OrderedDict()
_PARSED_MAX = 256
_parsed_lock = threading.Lock()
parse_count = [0]  # YAML playbooks parsed by load_playbook (tests count it)


def _file_key(p: Path) -> tuple[Any, ...] | None:
    from noetl_dagster.dsl.kinds import registry_generation  # noqa: PLC0415 - dsl imports stay lazy (start-up)

    try:
        st = p.stat()
        return (str(p.resolve()), st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                registry_generation(), max_steps())  # fmt: skip
    except OSError:
        return None


def load_playbook(path: str | Path) -> Playbook:
    """Load and validate a playbook file; raises PlaybookInvalid (incl. YAML syntax errors)."""
    p = Path(path)
    if p.suffix == ".flow":
        return _load_flow(p)
    key = _file_key(p)
    if key is not None:
        with _parsed_lock:
            pb = _PARSED.get(key)
            if pb is not None:
                _PARSED.move_to_end(key)
                return pb
    pb = _load_yaml_playbook(p)
    if key is not None and key == _file_key(p):  # unchanged while it was read
        with _parsed_lock:
            _PARSED[key] = pb
            while len(_PARSED) > _PARSED_MAX:
                _PARSED.popitem(last=False)
    return pb


def _load_yaml_playbook(p: Path) -> Playbook:
    parse_count[0] += 1
    try:
        raw, sm = load_yaml_file(p, what="playbook")
    except YamlFileError as e:
        if e.rule == "file-not-found":
            raise FileNotFoundError(f"{p}: no such playbook file") from None
        raise PlaybookInvalid([ValidationIssue(e.file, e.line, "", e.rule, e.message)]) from None
    except YamlSyntaxError as e:
        raise PlaybookInvalid([ValidationIssue(e.file, e.line, "", e.rule, e.message)]) from None
    too_big = check_playbook_size(raw, str(p), sm.line(("workflow",)))
    if too_big:
        raise PlaybookInvalid(too_big)
    return load_playbook_dict(raw, source_file=str(p.resolve()), source_map=sm)


def max_steps() -> int:
    """The most steps one playbook may have (docs/limits.md); $NOETL_MAX_STEPS overrides."""
    try:
        value = int(os.environ.get("NOETL_MAX_STEPS", ""))
    except ValueError:
        return MAX_STEPS
    return value if value > 0 else MAX_STEPS


MAX_STEPS = 10_000


def check_playbook_size(raw: Any, file: str, line: int = 1) -> list[ValidationIssue]:
    """A ``max-steps`` issue when the workflow has more steps than allowed; a ``max-step-runs``
    issue when ``executor.spec.max_step_runs`` is not a positive integer."""
    wf = raw.get("workflow") if isinstance(raw, dict) else None
    limit = max_steps()
    if isinstance(wf, list) and len(wf) > limit:
        return [
            ValidationIssue(
                file, line, "workflow", "max-steps", f"{len(wf)} steps; a playbook may have at most {limit}"
            )
        ]
    spec = (
        (raw.get("executor") or {}).get("spec")
        if isinstance(raw, dict) and isinstance(raw.get("executor"), dict)
        else None
    )
    for key, rule in (("max_step_runs", "max-step-runs"), ("max_events", "max-events")):
        cap = spec.get(key) if isinstance(spec, dict) else None
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
            return [ValidationIssue(file, line, f"executor.spec.{key}", rule, "must be a positive integer")]
    return []


def validate_file(path: str | Path) -> list[ValidationIssue]:
    return check_file(path)[1]


def check_file(path: str | Path) -> tuple[Playbook | None, list[ValidationIssue]]:
    """Parse and validate once: (the playbook when it is valid, the issues)."""
    pb, issues, _ = check_file_with_warnings(path)
    return pb, issues


def check_file_with_warnings(
    path: str | Path,
) -> tuple[Playbook | None, list[ValidationIssue], list[ValidationIssue]]:
    """check_file plus the warnings: deprecated spellings of renamed keys (rule ``deprecated-key``)."""
    p = Path(path)
    if p.suffix == ".flow":
        try:
            return _load_flow(p), [], []
        except PlaybookInvalid as e:
            return None, e.issues, []
        except FileNotFoundError:
            return None, [ValidationIssue(str(p), 0, "", "file-not-found", "no such file")], []
    try:
        raw, sm = load_yaml_file(p, what="playbook")
    except YamlFileError as e:
        message = "no such file" if e.rule == "file-not-found" else e.message
        return None, [ValidationIssue(e.file, e.line, "", e.rule, message)], []
    except YamlSyntaxError as e:
        return None, [ValidationIssue(e.file, e.line, "", e.rule, e.message)], []
    too_big = check_playbook_size(raw, str(p), sm.line(("workflow",)))
    if too_big:
        return None, too_big, []
    pb, issues = parse_playbook(raw, source_map=sm, source_file=str(p))
    warnings = deprecation_warnings(raw, sm) + executor_warnings(raw, sm)
    if pb is not None and not issues:
        warnings += unguarded_failure_warnings(pb, sm)
    return (None if issues else pb), issues, warnings


def deprecation_warnings(raw: Any, sm: SourceMap) -> list[ValidationIssue]:
    """One warning per old spelling NoETL renamed (still valid here; `migrate` rewrites it)."""
    return [
        ValidationIssue(
            sm.file,
            sm.line(path),
            format_path(path),
            "deprecated-key",
            f"{old} is deprecated; use {new} (`noetl-dagster migrate` rewrites it)",
        )  # fmt: skip
        for path, old, new in find_deprecated_spellings(raw)
    ]


def _load_flow(p: Path) -> Playbook:
    """A ``.flow`` file (seed 002 syntax) compiled to a playbook; flow errors keep line and column."""
    from noetl_dagster.dsl.flow import FlowError, load_flow_playbook  # noqa: PLC0415 - lark, for .flow files only

    try:
        return load_flow_playbook(p)
    except YamlFileError as e:
        if e.rule == "file-not-found":
            raise FileNotFoundError(f"{p}: no such flow file") from None
        raise PlaybookInvalid([ValidationIssue(e.file, e.line, "", e.rule, e.message)]) from None
    except YamlSyntaxError as e:  # too large, binary, not UTF-8
        raise PlaybookInvalid([ValidationIssue(e.file, e.line, "", e.rule, e.message)]) from None
    except FlowError as e:
        where = f"column {e.column}: " if e.column is not None else ""
        raise PlaybookInvalid([ValidationIssue(str(p), e.line or 1, "", e.rule, where + e.message)]) from None


CANNOT_FAIL_KINDS = frozenset({"noop"})  # a step of only these tasks has no failure to route
# a `when` naming one of these looks at the step's outcome (SEMANTICS.md §2: `event.name` is call.done,
# call.error or loop.done in arc conditions)
OUTCOME_WORDS = ("event", "error", "outcome", "output", "status", "failed", "stats")
GUARD = "when: \"{{ event.name == 'call.done' }}\""


def loop_guard(step: str) -> str:
    """The guard of a loop step's arc: every iteration succeeded (its arcs see ``loop.done``)."""
    return 'when: "{{ ' + step + '.stats.failed == 0 }}"'


def unguarded_failure_arcs(pb: Playbook) -> list[tuple[int, int, str, str]]:
    """``(step index, arc index, step, "task (kind)")``: the first arc without ``when`` of each step that
    can fail, none of whose arcs looks at the outcome. The spec evaluates arcs on ``step.failed`` too and
    an arc without ``when`` matches, so such an arc routes the failure: the execution completes (a Dagster
    run stays green). "Can fail": a task of a kind other than ``noop``. A loop step too: its arcs are
    evaluated once, on ``loop.done``, and an arc that matches routes the failed iterations on (SEMANTICS.md
    §4: the loop is a failed step only when no arc routes it); its guard reads ``<step>.stats.failed``."""
    out: list[tuple[int, int, str, str]] = []
    for i, st in enumerate(pb.workflow):
        arcs = st.next.arcs if st.next else []
        risky = next((t for t in st.tool if t.kind not in CANNOT_FAIL_KINDS), None)
        if risky is None or not arcs:
            continue
        if any(isinstance(a.when, str) and any(w in a.when for w in OUTCOME_WORDS) for a in arcs):
            continue  # the author routes on the outcome
        j = next((j for j, a in enumerate(arcs) if a.when is None or a.when is True), None)
        if j is not None:
            what = f"{risky.label} ({risky.kind})" + (", in a loop" if st.loop is not None else "")
            out.append((i, j, st.name, what))
    return out


def unguarded_failure_warnings(pb: Playbook, sm: SourceMap) -> list[ValidationIssue]:
    """One ``unguarded-failure`` warning per playbook (validate prints it; never an error), at its first
    such arc, naming the other steps: the pattern is common (a corpus would drown in one line per arc)."""
    found = unguarded_failure_arcs(pb)
    if not found:
        return []
    i, j, step, task = found[0]
    guard = loop_guard(step) if pb.workflow[i].loop is not None else GUARD
    path = ("workflow", i, "next", "arcs", j)
    others = [s for _, _, s, _ in found[1:]]
    also = (
        f" (also: {', '.join(others[:5])}{f' +{len(others) - 5}' if len(others) > 5 else ''})"
        if others
        else ""
    )
    return [ValidationIssue(sm.file, sm.line(path), format_path(path), "unguarded-failure",
                            f"step {step!r} can fail (task {task}) and this arc has no `when`{also}: a failure "
                            "takes it and the execution completes (a Dagster run stays green, tagged "
                            f"noetl/has_failed_steps=true); to stop on failure guard it: {guard}")]  # fmt: skip


def unguarded_cycles(pb: Playbook) -> list[list[str]]:
    """Cycles of ``next`` arcs none of which has a ``when`` guard (each would run until the step-run cap)."""
    succ: dict[str, list[str]] = {}
    for st in pb.workflow:
        arcs = st.next.arcs if st.next else []
        succ[st.name] = [a.step for a in arcs if a.when is None or a.when is True]
    succ = {v: [w for w in ws if w in succ] for v, ws in succ.items()}
    return [c for c in strongly_connected(list(succ), succ) if len(c) > 1 or c[0] in succ[c[0]]]
