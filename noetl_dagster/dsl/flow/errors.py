"""Errors of the flow front end, always with a line and a column."""

from __future__ import annotations


class FlowError(ValueError):
    """A flow that cannot be parsed or compiled. ``str()`` is ``FILE:LINE:COL: message``."""

    kind = "flow-error"

    def __init__(self, message: str, line: int | None = None, column: int | None = None, *,
                 file: str | None = None, rule: str | None = None, excerpt: str | None = None):  # fmt: skip
        self.message = message
        self.line = line
        self.column = column
        self.file = file
        self.rule = rule or self.kind
        self.excerpt = excerpt
        super().__init__(self._render())

    def _render(self) -> str:
        where = [self.file or "<flow>"]
        if self.line is not None:
            where.append(str(self.line))
            if self.column is not None:
                where.append(str(self.column))
        text = f"{':'.join(where)}: {self.message}"
        if self.excerpt:
            text += "\n" + self.excerpt
        return text

    def with_file(self, file: str) -> FlowError:
        self.file = file
        self.args = (self._render(),)
        return self

    def __str__(self) -> str:
        return self._render()


class FlowSyntaxError(FlowError):
    """The text does not follow the flow grammar (or a literal inside it is not valid JSON/YAML)."""

    kind = "flow-syntax"


class FlowCompileError(FlowError):
    """The flow parses but does not describe a valid workflow (labels, declarations, tasks)."""

    kind = "flow-compile"


def excerpt(text: str, line: int | None, column: int | None) -> str | None:
    """The offending source line with a caret under the column."""
    if not line:
        return None
    lines = text.splitlines()
    if not 1 <= line <= len(lines):
        return None
    src = lines[line - 1].replace("\t", " ")
    col = max(1, column or 1)
    return f"    {src}\n    {' ' * (col - 1)}^"
