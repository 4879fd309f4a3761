"""The canonical playbook model (pydantic).

Both author forms (the formal spec's standard form and the runtime dialect of
the e2e corpus, SEMANTICS.md §1) normalize into these classes; the engine and
the translator only ever see this model. Programmatic construction works
directly: build a :class:`Playbook` in Python and call :meth:`Playbook.check`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

# the classes' behaviour, shared with their pydantic-free twins (dsl/ready.py: a cached playbook run
# without pydantic, issue 35); is_template is re-exported here for its callers
from noetl_dagster.dsl.shapes import (
    OutputCheckBase,
    PlaybookBase,
    PolicyRuleBase,
    SetBlockBase,
    StepBase,
)
from noetl_dagster.dsl.shapes import (
    is_template as is_template,
)

Directive = Literal["continue", "retry", "jump", "break", "fail"]
Backoff = Literal["none", "fixed", "linear", "exponential"]


class _Model(BaseModel):
    # defer_build: validators are built at the first validation, not at import; a playbook answered by
    # the parse cache (dsl/cache.py, unpickled without validating) never builds them (issue 35)
    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, arbitrary_types_allowed=True, defer_build=True
    )


class SetBlock(SetBlockBase, _Model):
    """Writes: ``ctx`` (execution scope, recorded as ctx.patched) and ``iter`` (iteration scope)."""

    ctx: dict[str, Any] = Field(default_factory=dict)
    iter: dict[str, Any] = Field(default_factory=dict)


class RuleThen(_Model):
    do: Directive = "continue"
    attempts: int | str | None = None
    backoff: Backoff | None = None
    delay: float | str | None = None
    to: str | None = None
    set: SetBlock = Field(default_factory=SetBlock)


class PolicyRule(PolicyRuleBase, _Model):
    when: str | bool | None = None  # None: the ``else`` rule (is_else)
    then: RuleThen = Field(default_factory=RuleThen)


class AdmitRule(_Model):
    when: str | bool | None = None
    allow: bool = True


class FramePolicy(_Model):
    """NoETL's FramePolicy (``loop.spec.frame``): how a cursor loop claims and holds rows."""

    model_config = ConfigDict(defer_build=True)  # built at its first use, not at import (issue 35)

    max_rows: int = Field(1, ge=1)  # rows claimed per frame
    max_seconds: float = Field(30.0, gt=0)
    max_bytes: int = Field(64 * 1024 * 1024, ge=1)
    lease_seconds: float = Field(120.0, gt=0)  # how long a claim holds without a heartbeat
    heartbeat_seconds: float = Field(30.0, gt=0)
    row_concurrency: int = Field(1, ge=1)
    process: Literal["row", "frame"] = "row"  # the pipeline runs once per row, or once per frame
    verify_ipc: bool = False
    retry_mode: Literal["whole_frame"] = "whole_frame"
    max_attempts: int = Field(3, ge=1)


class Cursor(_Model):
    """``loop.cursor``: a pull source whose rows are claimed in frames (postgres, duckdb, nats_stream)."""

    kind: str
    auth: Any = None  # a credential name (or inline record / DSN)
    claim: str  # the driver's claim statement (SQL) or subject (nats_stream); a template
    options: dict[str, Any] = Field(default_factory=dict)


class Loop(_Model):
    in_: Any = Field(None, alias="in")
    iterator: str
    mode: Literal["sequential", "parallel", "cursor"] = "sequential"
    max_in_flight: int | str | None = None
    exec: Literal["distributed", "local"] | None = None
    spec: dict[str, Any] = Field(default_factory=dict)
    cursor: Cursor | None = None
    frame: dict[str, Any] | None = None  # FramePolicy fields as written (values may be templates)

    @property
    def frame_policy(self) -> FramePolicy:
        """The frame policy without its templated fields (the engine renders those per run)."""
        return FramePolicy(**{k: v for k, v in (self.frame or {}).items() if not is_template(v)})


class Task(_Model):
    label: str
    kind: str
    config: dict[str, Any] = Field(default_factory=dict)  # the tool's inputs (url, code, command, input...)
    spec: dict[str, Any] = Field(default_factory=dict)  # runtime knobs (isolation, timeout, resources)
    policy: list[PolicyRule] | None = None
    set: SetBlock = Field(default_factory=SetBlock)
    loop: Loop | None = None
    # `pure: true` (python, duckdb): the author's word that the code has no effect outside the
    # execution, so it runs without a durability barrier (dsl/kinds.is_pure)
    pure: bool = False


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


class OutputCheck(OutputCheckBase, _Model):
    """A check on a declared output, evaluated from the event log (docs/dagster.md): exactly one of
    ``row_count`` ({min, max}), ``schema`` ({columns: {name: arrow type}, stable: bool}),
    ``freshness`` ({max_age_minutes}) or ``assert`` (a template predicate)."""

    name: str | None = None
    row_count: dict[str, int] | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    freshness: dict[str, float] | None = None
    assert_: str | None = Field(default=None, alias="assert")
    severity: Literal["error", "warn"] = "error"
    blocking: bool = False
    description: str | None = None


class Output(_Model):
    """A table a step produces (``outputs:``): an asset of the code location, keyed by its URI."""

    uri: str  # noetl://tenant/project/namespace/type/name, unversioned
    description: str | None = None
    owners: list[str] = Field(default_factory=list)
    kinds: list[str] = Field(default_factory=list)
    tags: dict[str, str] = Field(default_factory=dict)
    group: str | None = None
    automation: str | dict[str, Any] | None = None  # eager | on_missing | {on_cron, timezone}
    freshness: dict[str, Any] | None = None  # {fail_after_minutes, warn_after_minutes} | {deadline_cron, ...}
    checks: list[OutputCheck] = Field(default_factory=list)
    line: int | None = None


class Partitions(_Model):
    """``executor.spec.dagster.partitions``: one of daily/hourly/weekly/monthly (a start date) or
    static (values, or the name of a workload key holding them); the key lands in ``workload_key``."""

    model_config = ConfigDict(defer_build=True)  # built at its first use, not at import (issue 35)

    daily: str | None = None
    hourly: str | None = None
    weekly: str | None = None
    monthly: str | None = None
    static: list[str] | str | None = None
    workload_key: str
    timezone: str | None = None
    end_offset: int = 0
    backfill: str | int | None = None  # single_run | multi_run | most partitions per run
    range_key: str | None = None  # workload value holding a run's partition keys (a list)

    @field_validator("daily", "hourly", "weekly", "monthly", mode="before")
    @classmethod
    def _date_text(cls, v: Any) -> Any:
        return v.isoformat() if hasattr(v, "isoformat") else v  # YAML reads 2026-11-01 as a date

    @property
    def kind(self) -> str:
        return next(
            k for k in ("daily", "hourly", "weekly", "monthly", "static") if getattr(self, k) is not None
        )


class DagsterSpec(_Model):
    """``executor.spec.dagster``: how the playbook appears in Dagster beyond its jobs."""

    model_config = ConfigDict(defer_build=True)  # built at its first use, not at import (issue 35)

    mode: Literal["default", "per_step"] | None = None
    partitions: Partitions | None = None
    automation: str | dict[str, Any] | None = None
    freshness: dict[str, Any] | None = None
    owners: list[str] = Field(default_factory=list)
    group: str | None = None


class Step(StepBase, _Model):
    name: str
    desc: str | None = None
    spec: dict[str, Any] = Field(default_factory=dict)
    admit: list[AdmitRule] | None = None
    loop: Loop | None = None
    tool: list[Task] = Field(default_factory=list)
    input: dict[str, Any] = Field(default_factory=dict)
    next: Router | None = None
    set: SetBlock = Field(default_factory=SetBlock)
    outputs: list[Output] = Field(default_factory=list)  # tables it produces (Dagster assets)
    line: int | None = None  # source line of the step, for code references


class WorkbookEntry(_Model):
    name: str
    tool: Task
    desc: str | None = None


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)  # see _Model
    name: str
    path: str
    description: str | None = None
    version: str | int | None = None


class Executor(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)  # see _Model
    profile: str | None = None
    spec: dict[str, Any] = Field(default_factory=dict)


class Playbook(PlaybookBase, _Model):
    api_version: str = Field(default="noetl.io/v2", alias="apiVersion")
    kind: Literal["Playbook"] = "Playbook"
    metadata: Metadata
    keychain: list[dict[str, Any]] = Field(default_factory=list)
    executor: Executor = Field(default_factory=Executor)
    workload: dict[str, Any] = Field(default_factory=dict)
    workflow: list[Step]
    workbook: list[WorkbookEntry] = Field(default_factory=list)
    source_file: str | None = None

    _steps: dict[str, Step] | None = PrivateAttr(default=None)  # PlaybookBase.steps

    @property
    def dagster(self) -> DagsterSpec:
        """``executor.spec.dagster`` typed (validated when the playbook was parsed)."""
        raw = self.executor.spec.get("dagster")
        return DagsterSpec.model_validate(raw) if isinstance(raw, dict) else DagsterSpec()
