"""A failed execution told the way its author reads it: the step, the task, its tool kind, the
playbook line (and, for inline python, the line of the code block), the error and the user's own
traceback frames, mapped from ``<noetl-python>`` onto the playbook file; no engine or Dagster frames.

Read from the execution's event log (the first ``task.done`` with status error, else the first
failed step), so every path that fails an execution (a Materialize, a job op) tells the same story.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from noetl_dagster.dsl.model import Playbook
from noetl_dagster.engine import events as E
from noetl_dagster.engine.error_location import (
    CODE_FILE,
    WRAPPED_FN,
    code_frame,
    error_line,
    frames,
    task_lines,
)

MAX_FRAMES = 8
_ROOTS: dict[str, str] = {}  # playbook file -> the directory its code location loaded it from


def set_playbook_root(file: str | os.PathLike[str], root: str | os.PathLike[str]) -> None:
    """Record the directory a code location loaded ``file`` from (its playbooks folder; a file given
    alone: its own folder), so a failure names ``sub/x.yaml:17`` as the project shows it."""
    _ROOTS[os.path.abspath(file)] = os.path.abspath(root)


def playbook_relative(file: str) -> str:
    """``file`` relative to its playbook root; a file no code location loaded: cwd-relative when under it."""
    root = _ROOTS.get(os.path.abspath(file))
    if root is not None:
        rel = os.path.relpath(os.path.abspath(file), root)
        if not rel.startswith(".."):
            return rel
    return _short(file)


def code_block(text: str) -> str:
    """``text`` as a fenced markdown code block (a fence longer than any backtick run inside it)."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"


@dataclass
class UserFailure:
    step: str
    task: str | None = None
    kind: str | None = None
    file: str | None = None
    line: int | None = None  # the task's line (or the step's) in the playbook file
    code_line: int | None = None  # playbook line of the failing line of inline code
    error_kind: str | None = None
    message: str = "failed"
    frames: list[str] = field(default_factory=list)  # the user's traceback, playbook lines

    @property
    def headline(self) -> str:
        """``step 'transform' failed in task divide (python) at flows/x.yaml:17: ZeroDivisionError: ...``"""
        out = f"step {self.step!r} failed"
        if self.task:
            out += f" in task {self.task}" + (f" ({self.kind})" if self.kind else "")
        line = self.code_line or self.line
        if self.file and line:
            out += f" at {playbook_relative(self.file)}:{line}"
        return f"{out}: {self.message}"

    def text(self) -> str:
        out = self.headline
        if self.frames:
            out += "\n\nTraceback (your code):\n" + "\n".join(self.frames)
        return out

    def metadata(self) -> dict[str, Any]:
        md: dict[str, Any] = {"noetl/failed_step": self.step}
        if self.task:
            md["noetl/failed_task"] = self.task
        if self.kind:
            md["noetl/failed_kind"] = self.kind
        if self.file and (self.code_line or self.line):
            md["noetl/failed_at"] = f"{playbook_relative(self.file)}:{self.code_line or self.line}"
        if self.frames:  # a code block: the UI collapses the line breaks of plain text
            md["noetl/traceback"] = dg.MetadataValue.md(code_block("\n".join(self.frames)))
        return md


def first_failure(events: Iterable[Any], pb: Playbook | None) -> UserFailure | None:
    """The first failure of the execution (its own events, not a sub-playbook's)."""
    events = list(events)
    eid = events[0].execution_id if events else None
    step_failed = None
    for ev in events:
        if ev.execution_id != eid or ev.status != "error":
            continue
        d = ev.data or {}
        if ev.name == E.TASK_DONE:
            outcome = d.get("outcome") or {}
            err = outcome.get("error") if isinstance(outcome, Mapping) else None
            py = outcome.get("py") if isinstance(outcome, Mapping) else None
            return _locate(pb, ev.step or "", d.get("task"), err, py)
        if ev.name == E.STEP_FAILED and step_failed is None:
            step_failed = ev
    if step_failed is not None:
        return _locate(pb, step_failed.step or "", None, (step_failed.data or {}).get("error"), None)
    return None


def step_failure(events: Iterable[Any], pb: Playbook | None, step: str) -> UserFailure | None:
    """The failure of one step (a job's op reports the step it ran)."""
    return first_failure([e for e in events if e.step == step or e.name == E.EXECUTION_REQUESTED], pb)


ROUTED_NOTE = (
    "(an arc routed the failure: the execution goes on; its run is green, tagged noetl/has_failed_steps=true)"
)


def routed_failures(events: Iterable[Any], pb: Playbook | None) -> list[UserFailure]:
    """The steps of a completed execution that failed while an arc routed the flow on, told like
    :func:`step_failure` (its own events; one per step)."""
    events = list(events)
    eid = events[0].execution_id if events else None
    steps = dict.fromkeys(
        e.step for e in events if e.execution_id == eid and e.name == E.STEP_FAILED and e.step
    )
    return [f for f in (step_failure(events, pb, s) for s in steps) if f is not None]


def _locate(pb: Playbook | None, step: str, task: str | None, err: Any, py: Any) -> UserFailure:
    f = UserFailure(step, task)
    if isinstance(err, Mapping):
        f.error_kind = str(err.get("kind") or "") or None
        f.message = str(err.get("message") or err.get("kind") or "failed")
    elif err:
        f.message = str(err)
    if pb is None:
        return f
    f.file = pb.source_file
    index, f.line, code_key = task_lines(pb, step, task)
    st = pb.steps.get(step) if hasattr(pb.steps, "get") else None
    if index is not None and st is not None:
        f.kind = st.tool[index].kind
    tb = py.get("traceback") if isinstance(py, Mapping) else None
    if isinstance(tb, str):
        f.frames = _user_frames(tb, code_key, pb.source_file)
        # the one rule explain, the page and diff place a failure by (engine/error_location.py)
        raised = code_frame({"py": py})
        f.code_line = (
            error_line(pb, step, task, raised) if code_key is not None and raised is not None else None
        )
    return f


def _user_frames(tb: str, code_key: int | None, file: str | None) -> list[str]:
    """The ``<noetl-python>`` frames of a traceback, as playbook lines (a ``code: |`` block starts one
    line below its key), each followed by its source line."""
    text = _read(file) if file else None
    out: list[str] = []
    for n, fn in frames(tb):
        if code_key is None:
            out.append(f'  File "{CODE_FILE}", line {n}, in {fn}')
            continue
        at = code_key + n
        out.append(
            f'  File "{playbook_relative(file)}", line {at}, in {"<code>" if fn in ("<module>", WRAPPED_FN) else fn}'
        )
        if text is not None and 0 < at <= len(text):
            out.append("    " + text[at - 1].strip())
    last = tb.strip().splitlines()[-1] if tb.strip() else ""
    if out and last:
        out.append(last)
    return out[-(MAX_FRAMES * 2 + 1) :]


def _read(file: str) -> list[str] | None:
    try:
        with open(file, encoding="utf-8") as fh:
            return fh.read().splitlines()
    except OSError:
        return None


def _short(file: str | None) -> str:
    if not file:
        return ""
    try:
        rel = os.path.relpath(file)
    except ValueError:
        return file
    return rel if not rel.startswith("..") else file
