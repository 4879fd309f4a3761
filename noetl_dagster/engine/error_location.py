"""Where a failure is, one rule for Dagster, ``explain``, the execution page and ``diff`` (issue 42):
the raising line of the user's code when there is one (for a python task's inline ``code:`` block,
the playbook line of the innermost ``<noetl-python>`` frame: the ``code:`` key's line + the frame's
line in the block), else the task's line, else the step's.

The fold (``explain``, ``diff``) keeps only the failing task and the frame's line in the block
(:func:`code_frame`), no playbook; :func:`error_line` places it once the playbook is loaded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from noetl_dagster.dsl.model import Playbook

CODE_FILE = "<noetl-python>"  # the file name inline python is compiled under (tools.core)
WRAPPED_FN = "__noetl_step__"  # code with a top-level return runs wrapped in this function, one line down
FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>.+)$')


def frames(tb: str) -> list[tuple[int, str]]:
    """The ``<noetl-python>`` frames of a traceback, outermost first: (line in the code block, function)."""
    out = []
    for raw in tb.splitlines():
        m = FRAME.match(raw)
        if m and m["file"] == CODE_FILE:
            out.append((int(m["line"]) - (1 if m["fn"] == WRAPPED_FN else 0), m["fn"]))
    return out


def code_frame(outcome: Any) -> int | None:
    """The line in the code block that raised (the innermost user frame) of a task outcome, if any."""
    py = outcome.get("py") if isinstance(outcome, Mapping) else None
    tb = py.get("traceback") if isinstance(py, Mapping) else None
    found = frames(tb) if isinstance(tb, str) else []
    return found[-1][0] if found else None


def task_lines(pb: Playbook | None, step: str, task: str | None) -> tuple[int | None, int | None, int | None]:
    """(the task's index in the step's tool list, its playbook line (else the step's), the line of its
    ``code:`` key); None where unknown."""
    st = pb.steps.get(step) if pb is not None and hasattr(pb.steps, "get") else None
    if st is None:
        return None, None, None
    index = next((j for j, t in enumerate(st.tool) if t.label == task), None)
    lines = source_lines(pb) if index is not None else None
    if lines is None or index is None:
        return index, st.line, None
    i = next((k for k, s in enumerate(pb.workflow) if s.name == step), None)
    prefix: tuple[Any, ...] = ("workflow", i, "tool", index)
    mine = {p: ln for p, ln in lines.items() if p[: len(prefix)] == prefix}
    if not mine and index == 0:  # tool: a single mapping
        prefix = ("workflow", i, "tool")
        mine = {p: ln for p, ln in lines.items() if p[: len(prefix)] == prefix}
    code_key = next(
        (ln for p, ln in sorted(mine.items(), key=lambda x: len(x[0])) if p and p[-1] == "code"), None
    )
    return index, (min(mine.values()) if mine else st.line), code_key


def error_line(
    pb: Playbook | None, step: str, task: str | None = None, code_line: int | None = None
) -> int | None:
    """The playbook line of a failure: the raising line of inline code, else the task's, else the step's."""
    _, line, code_key = task_lines(pb, step, task)
    if code_key is not None and code_line is not None:
        return code_key + code_line  # a `code: |` block starts one line below its key
    return line


def run_error_line(pb: Playbook | None, run: Mapping[str, Any]) -> int | None:
    """:func:`error_line` of an explained step run (``explain``'s run row): its last failed attempt's task
    and raising line; None when the run did not fail."""
    if pb is None or not run.get("error"):
        return None
    failed = [a for a in run.get("attempts") or () if a.get("status") == "error"]
    last = failed[-1] if failed else {}
    return error_line(pb, str(run.get("step") or ""), last.get("task"), last.get("code_line"))


def source_lines(pb: Playbook) -> Mapping[tuple[Any, ...], int] | None:
    if not pb.source_file:
        return None
    try:
        from noetl_dagster.dsl.loader import load_yaml_file  # noqa: PLC0415 - only when something failed

        return load_yaml_file(pb.source_file)[1].lines
    except Exception:  # noqa: BLE001 - the file changed or went away since it loaded
        return None
