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

from noetl_dagster.dsl.model import Playbook
from noetl_dagster.engine import events as E

CODE_FILE = "<noetl-python>"  # the file name inline python is compiled under (tools.core)
WRAPPED_FN = "__noetl_step__"  # code with a top-level return runs wrapped in this function, one line down
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>.+)$')
MAX_FRAMES = 8


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
            out += f" at {_short(self.file)}:{line}"
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
            md["noetl/failed_at"] = f"{self.file}:{self.code_line or self.line}"
        if self.frames:
            md["noetl/traceback"] = "\n".join(self.frames)
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
    st = pb.steps.get(step) if hasattr(pb.steps, "get") else None
    if st is None:
        return f
    f.line = st.line
    index = next((j for j, t in enumerate(st.tool) if t.label == task), None)
    if index is not None:
        f.kind = st.tool[index].kind
    lines = _source_lines(pb)
    if lines is None or index is None:
        return f
    i = next((k for k, s in enumerate(pb.workflow) if s.name == step), None)
    prefix = ("workflow", i, "tool", index)
    mine = {p: ln for p, ln in lines.items() if p[: len(prefix)] == prefix}
    if not mine and index == 0:  # tool: a single mapping
        prefix = ("workflow", i, "tool")
        mine = {p: ln for p, ln in lines.items() if p[: len(prefix)] == prefix}
    if mine:
        f.line = min(mine.values())
    code_key = next(
        (ln for p, ln in sorted(mine.items(), key=lambda x: len(x[0])) if p and p[-1] == "code"), None
    )
    tb = py.get("traceback") if isinstance(py, Mapping) else None
    if isinstance(tb, str):
        f.frames, f.code_line = _user_frames(tb, code_key, pb.source_file)
    return f


def _user_frames(tb: str, code_key: int | None, file: str | None) -> tuple[list[str], int | None]:
    """The ``<noetl-python>`` frames of a traceback, as playbook lines (a ``code: |`` block starts one
    line below its key), each followed by its source line; plus the innermost one's playbook line."""
    text = _read(file) if file else None
    out: list[str] = []
    innermost = None
    for raw in tb.splitlines():
        m = _FRAME.match(raw)
        if not m or m["file"] != CODE_FILE:
            continue
        n = int(m["line"]) - (1 if m["fn"] == WRAPPED_FN else 0)
        if code_key is None:
            out.append(f'  File "{CODE_FILE}", line {n}, in {m["fn"]}')
            continue
        innermost = code_key + n
        fn = "<code>" if m["fn"] in ("<module>", WRAPPED_FN) else m["fn"]
        out.append(f'  File "{_short(file)}", line {innermost}, in {fn}')
        if text is not None and 0 < innermost <= len(text):
            out.append("    " + text[innermost - 1].strip())
    last = tb.strip().splitlines()[-1] if tb.strip() else ""
    if out and last:
        out.append(last)
    return out[-(MAX_FRAMES * 2 + 1) :], innermost


def _source_lines(pb: Playbook) -> Mapping[tuple[Any, ...], int] | None:
    if not pb.source_file:
        return None
    try:
        from noetl_dagster.dsl.loader import load_yaml_file  # noqa: PLC0415 - only when something failed

        return load_yaml_file(pb.source_file)[1].lines
    except Exception:  # noqa: BLE001 - the file changed or went away since it loaded
        return None


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
