"""The canonical playbook model (pydantic).

Both author forms (the formal spec's standard form and the runtime dialect of
the e2e corpus, SEMANTICS.md §1) normalize into these classes; the engine and
the translator only ever see this model. Programmatic construction works
directly: build a :class:`Playbook` in Python and call :meth:`Playbook.check`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

Directive = Literal["continue", "retry", "jump", "break", "fail"]
Backoff = Literal["none", "fixed", "linear", "exponential"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, arbitrary_types_allowed=True)


class SetBlock(_Model):
    """Writes: ``ctx`` (execution scope, recorded as ctx.patched) and ``iter`` (iteration scope)."""

    ctx: dict[str, Any] = Field(default_factory=dict)
    iter: dict[str, Any] = Field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.ctx or self.iter)


class RuleThen(_Model):
    do: Directive = "continue"
    attempts: int | str | None = None
    backoff: Backoff | None = None
    delay: float | str | None = None
    to: str | None = None
    set: SetBlock = Field(default_factory=SetBlock)


class PolicyRule(_Model):
    when: str | bool | None = None  # None: the ``else`` rule
    then: RuleThen = Field(default_factory=RuleThen)

    @property
    def is_else(self) -> bool:
        return self.when is None


class AdmitRule(_Model):
    when: str | bool | None = None
    allow: bool = True


class Loop(_Model):
    in_: Any = Field(alias="in")
    iterator: str
    mode: Literal["sequential", "parallel"] = "sequential"
    max_in_flight: int | str | None = None
    exec: Literal["distributed", "local"] | None = None
    spec: dict[str, Any] = Field(default_factory=dict)


class Task(_Model):
    label: str
    kind: str
    config: dict[str, Any] = Field(default_factory=dict)  # the tool's inputs (url, code, command, input...)
    spec: dict[str, Any] = Field(default_factory=dict)  # runtime knobs (isolation, timeout, resources)
    policy: list[PolicyRule] | None = None
    set: SetBlock = Field(default_factory=SetBlock)
    loop: Loop | None = None


class Arc(_Model):
    step: str
    when: str | bool | None = None
    args: dict[str, Any] | None = None
    set: SetBlock = Field(default_factory=SetBlock)
    spec: dict[str, Any] = Field(default_factory=dict)


class Router(_Model):
    mode: Literal["exclusive", "inclusive"] = "exclusive"
    arcs: list[Arc] = Field(default_factory=list)
    spec: dict[str, Any] = Field(default_factory=dict)


class Step(_Model):
    name: str
    desc: str | None = None
    spec: dict[str, Any] = Field(default_factory=dict)
    admit: list[AdmitRule] | None = None
    loop: Loop | None = None
    tool: list[Task] = Field(default_factory=list)
    input: dict[str, Any] = Field(default_factory=dict)
    next: Router | None = None
    set: SetBlock = Field(default_factory=SetBlock)
    line: int | None = None  # source line of the step, for code references

    @property
    def targets(self) -> list[str]:
        return [a.step for a in self.next.arcs] if self.next else []


class WorkbookEntry(_Model):
    name: str
    tool: Task
    desc: str | None = None


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    path: str
    description: str | None = None
    version: str | int | None = None


class Executor(BaseModel):
    model_config = ConfigDict(extra="allow")
    profile: str | None = None
    spec: dict[str, Any] = Field(default_factory=dict)


class Playbook(_Model):
    api_version: str = Field(default="noetl.io/v2", alias="apiVersion")
    kind: Literal["Playbook"] = "Playbook"
    metadata: Metadata
    keychain: list[dict[str, Any]] = Field(default_factory=list)
    executor: Executor = Field(default_factory=Executor)
    workload: dict[str, Any] = Field(default_factory=dict)
    workflow: list[Step]
    workbook: list[WorkbookEntry] = Field(default_factory=list)
    source_file: str | None = None

    _steps: dict[str, Step] | None = PrivateAttr(default=None)

    # -- lookups -----------------------------------------------------------
    @property
    def steps(self) -> dict[str, Step]:
        if self._steps is None:
            self._steps = {s.name: s for s in self.workflow}
        return self._steps

    def step(self, name: str) -> Step:
        return self.steps[name]

    def workbook_entry(self, name: str) -> WorkbookEntry | None:
        for w in self.workbook:
            if w.name == name:
                return w
        return None

    @property
    def entry_step(self) -> str:
        entry = self.executor.spec.get("entry_step")
        if entry:
            return str(entry)
        if "start" in self.steps:
            return "start"
        return self.workflow[0].name

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def base_dir(self) -> str | None:
        import os

        return os.path.dirname(os.path.abspath(self.source_file)) if self.source_file else None
