"""The syntax tree of a flow document (seed 002), as the parser produces it.

Every node carries the line and column where it starts so that the graph
builder and the compiler can report errors at the right place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from typing import Literal as Lit

LiteralKind = Lit["yaml", "json_object", "json_array", "empty"]


@dataclass(frozen=True)
class Pos:
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.line}:{self.column}"


@dataclass
class Literal:
    """A parameter literal ``(- yaml -)`` / ``({ json })`` / ``([ json ])`` or a
    resource literal ``<- yaml ->`` / ``<{ json }>`` / ``<[ json ]>``, already decoded."""

    kind: LiteralKind
    text: str
    value: Any
    pos: Pos


@dataclass
class Label:
    name: str
    pos: Pos

    @property
    def reserved(self) -> bool:
        return self.name in ("start", "end")


@dataclass
class Guard:
    expr: str  # JSONPath, without the back quotes
    pos: Pos


@dataclass
class TaskRef:
    name: str
    params: Literal | None
    pos: Pos


@dataclass
class TaskList:
    """``A|B|C``: shorthand for the subflow ``{ A B C }``."""

    tasks: list[TaskRef]
    pos: Pos


@dataclass
class Block:
    """A subflow ``{ ... }`` or ``[ ... ]``."""

    statements: list[Statement]
    pos: Pos


@dataclass
class Resource:
    uri: str
    params: Literal | None
    pos: Pos


@dataclass
class ResourceLiteral:
    literal: Literal
    pos: Pos


Target = TaskRef | TaskList | Block


@dataclass
class Step:
    target: Target
    pos: Pos
    in_label: Label | None = None
    out_label: Label | None = None
    star: bool = False
    merge: bool = False
    guard: Guard | None = None


@dataclass
class Statement:
    steps: list[Step]
    pos: Pos
    source: Label | Resource | ResourceLiteral | None = None
    destination: Label | Resource | None = None
    destination_merge: bool = False


@dataclass
class Declaration:
    kind: Lit["flow", "task"]
    name: str
    pos: Pos
    alias: TaskRef | None = None  # ``@task X = A``: the aliased name (params live on the declaration)
    params: Literal | None = None
    doc: str | None = None
    block: Block | None = None


@dataclass
class FlowDocument:
    statements: list[Statement] = field(default_factory=list)
    declarations: list[Declaration] = field(default_factory=list)
    text: str = ""
    file: str | None = None
