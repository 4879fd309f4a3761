"""How playbooks look in Dagster: the translator and the typed records it reads.

In the style of the dagster-dlt / dagster-sling translators: one method per
thing the build produces, each taking a typed, frozen record and returning a
spec; customise by subclassing, calling ``super()`` and ``replace_attributes``
/ ``merge_attributes`` on the result::

    class MyTranslator(NoetlTranslator):
        def get_op_spec(self, data):
            spec = super().get_op_spec(data)
            if "http" in data.kinds:
                spec = spec.merge_attributes(tags={"dagster/concurrency_key": "outbound_http"})
            return spec

        def get_job_spec(self, data):
            return super().get_job_spec(data).replace_attributes(description="nightly loads")
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

import noetl_dagster.translator.naming as naming
from noetl_dagster.dsl.locator import InvalidLocator, is_locator
from noetl_dagster.dsl.model import Output, Playbook, Step
from noetl_dagster.resources.runtime import (
    TAG_KIND,
    TAG_MODE,
    TAG_PLAYBOOK,
    TAG_PROJECT,
    TAG_STEP,
    TAG_TENANT,
)
from noetl_dagster.translator.declare import (
    STORAGE_KINDS,
    automation_condition,
    freshness_policy,
    partitions_def,
)
from noetl_dagster.translator.k8s import needs_k8s_job_executor, step_k8s_tags

EXECUTOR_ENV = "NOETL_DAGSTER_EXECUTOR"


def default_executor_name() -> str:
    return os.environ.get(EXECUTOR_ENV, "in_process") or "in_process"


def default_executor(pb: Playbook) -> str:
    """``$NOETL_DAGSTER_EXECUTOR`` (in_process | multiprocess | celery | k8s); on Kubernetes (``k8s``)
    only a playbook with a ``distributed`` loop uses k8s_job_executor, the rest run in the run's own
    pod; ``celery`` sends every op (steps, regions, loop frames) to Celery workers
    (``$NOETL_CELERY_BROKER``, default ``redis://127.0.0.1:6379/0``)."""
    choice = default_executor_name()
    if choice == "k8s":
        return "k8s" if needs_k8s_job_executor(pb) else "in_process"
    return choice


# -- records (what the translator is told) ------------------------------------------------
@dataclass(frozen=True)
class NoetlPlaybookData:
    """One playbook as the translator sees it."""

    playbook: Playbook
    job_name: str  # allocated unique name (prefix of every op name)
    mode: str  # "default" | "per_step"
    tenant: str = "default"
    project: str = "default"
    step_ids: Mapping[str, str] = field(default_factory=dict, hash=False)  # step -> unique Dagster-safe id

    def step_id(self, step: str) -> str:
        return self.step_ids.get(step) or naming.sanitize(step)

    @property
    def name(self) -> str:
        return self.playbook.metadata.name

    @property
    def path(self) -> str:
        return self.playbook.metadata.path

    @property
    def file(self) -> str | None:
        return self.playbook.source_file

    @property
    def description(self) -> str | None:
        return self.playbook.metadata.description

    @property
    def schedules(self) -> list[dict[str, Any]]:
        raw = self.playbook.executor.spec.get("schedule")
        if raw is None:
            return []
        return [raw] if isinstance(raw, Mapping) else list(raw)


@dataclass(frozen=True)
class NoetlStepData:
    """One step: its model, kinds, place in the graph and source position."""

    playbook: NoetlPlaybookData
    step: Step
    is_join: bool = False
    in_cycle: bool = False

    @property
    def name(self) -> str:
        return self.step.name

    @property
    def kinds(self) -> tuple[str, ...]:
        out: list[str] = []
        for t in self.step.tool:
            if t.kind not in out:
                out.append(t.kind)
        return tuple(out)

    @property
    def line(self) -> int | None:
        return self.step.line


@dataclass(frozen=True)
class NoetlAssetData:
    """A table a step produces: declared in its ``outputs`` and/or stored by a task under a literal
    ``noetl://`` URI (a storage task's ``uri``)."""

    step: NoetlStepData
    uri: str
    task: str
    kind: str
    deps: tuple[str, ...] = ()  # literal URIs it is made from: reads before it in the step, its `inputs`
    output: Output | None = None  # the step's declaration (owners, kinds, checks, automation...)


@dataclass(frozen=True)
class NoetlNodeData:
    """One op of a job: ``start`` (records the request), ``step`` (one step) or ``region`` (a cycle)."""

    playbook: NoetlPlaybookData
    kind: str  # "start" | "step" | "region"
    steps: tuple[NoetlStepData, ...] = ()
    separate: bool = False  # the step's own job (per_step mode / spec.dagster.run: separate)

    @property
    def step_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.steps)

    @property
    def kinds(self) -> tuple[str, ...]:
        out: list[str] = []
        for s in self.steps:
            for k in s.kinds:
                if k not in out:
                    out.append(k)
        return tuple(out)


# -- specs (what the translator returns) ---------------------------------------------------
class _Replaceable:
    def replace_attributes(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def merge_attributes(self, *, tags: Mapping[str, str] | None = None, metadata: Mapping[str, Any] | None = None,
                         kinds: set[str] | None = None) -> Any:  # fmt: skip
        changes: dict[str, Any] = {}
        if tags:
            changes["tags"] = {**self.tags, **tags}  # type: ignore[attr-defined]
        if metadata:
            changes["metadata"] = {**self.metadata, **metadata}  # type: ignore[attr-defined]
        if kinds and hasattr(self, "kinds"):
            changes["kinds"] = frozenset(self.kinds) | frozenset(kinds)  # type: ignore[attr-defined]
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


@dataclass(frozen=True)
class NoetlJobSpec(_Replaceable):
    name: str
    description: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    executor: str = "in_process"  # "in_process" | "multiprocess" | "k8s" (dagster-k8s k8s_job_executor)
    op_retry_policy: dg.RetryPolicy | None = None


@dataclass(frozen=True)
class NoetlOpSpec(_Replaceable):
    name: str
    description: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    kinds: frozenset[str] = frozenset()
    retry_policy: dg.RetryPolicy | None = None
    pool: str | None = None


@dataclass(frozen=True)
class NoetlScheduleSpec(_Replaceable):
    name: str
    cron_schedule: str | list[str]
    execution_timezone: str | None = None
    workload: Mapping[str, Any] = field(default_factory=dict)
    description: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    running: bool = False


START_ID = "noetl_start"
SCHEDULE_KEYS = {"cron", "cron_schedule", "timezone", "workload", "name", "description", "enabled", "tags",
                 "retries"}  # fmt: skip
# a failed scheduled run is retried as a whole (a new execution: noetl_start starts one), by the daemon
RETRY_TAGS = {"dagster/retry_strategy": "ALL_STEPS"}


class NoetlTranslator:
    """Default mapping of playbooks to Dagster jobs, ops, schedules and assets.

    ``asset_key_scope``: how much of a table's ``noetl://<tenant>/<project>/<namespace>/<type>/<name>``
    its asset key carries: ``namespace`` (default, ``sales/daily_sales``), ``name``, ``project`` or
    ``tenant`` (``demo/examples/sales/daily_sales``: keys stay unique when one code location serves
    several tenants or projects); ``asset_key_prefix`` goes before it (like dagster-dbt's key prefix).
    Two tables with the same key fail the load, naming both URIs.
    """

    asset_key_scope: str = naming.DEFAULT_KEY_SCOPE  # class defaults: a subclass's own __init__ keeps them
    asset_key_prefix: tuple[str, ...] = ()

    def __init__(
        self, *, asset_key_scope: str = naming.DEFAULT_KEY_SCOPE, asset_key_prefix: Sequence[str] = ()
    ):
        if asset_key_scope not in naming.KEY_SCOPES:
            raise ValueError(
                f"asset_key_scope {asset_key_scope!r}: use one of {', '.join(naming.KEY_SCOPES)}"
            )
        self.asset_key_scope = asset_key_scope
        self.asset_key_prefix = tuple(asset_key_prefix)

    # -- asset keys ---------------------------------------------------------------------
    def get_asset_key(self, uri: str) -> dg.AssetKey:
        """The asset key of the table ``uri`` names (declared, and each stored reference a run reports);
        raises InvalidLocator for a text that is no ``noetl://`` URI."""
        return dg.AssetKey(naming.table_key(uri, self.asset_key_scope, self.asset_key_prefix))

    # -- jobs ---------------------------------------------------------------------------
    def get_job_spec(self, data: NoetlPlaybookData) -> NoetlJobSpec:
        pb = data.playbook
        desc = data.description or f"NoETL playbook {data.path}"
        if data.file:
            desc += f"\n\nSource: `{data.file}`"
        meta: dict[str, Any] = {
            "noetl/playbook": data.path,
            "noetl/name": data.name,
            "noetl/steps": len(pb.workflow),
            "noetl/mode": data.mode,
        }
        refs = self._code_references(data.file, 1)
        if refs is not None:
            meta["dagster/code_references"] = refs
        return NoetlJobSpec(
            name=data.job_name,
            description=desc,
            tags={
                TAG_PLAYBOOK: data.path,
                TAG_TENANT: data.tenant,
                TAG_PROJECT: data.project,
                TAG_MODE: data.mode,
            },
            metadata=meta,
            executor=default_executor(pb),
        )

    # -- ops ----------------------------------------------------------------------------
    def get_op_spec(self, data: NoetlNodeData) -> NoetlOpSpec:
        job = data.playbook.job_name
        if data.kind == "start":
            return NoetlOpSpec(
                name=f"{job}__{START_ID}",
                description=f"Records the execution request of {data.playbook.path} and enqueues the entry "
                "token (continues an existing execution on re-execution or resume).",
                tags={TAG_KIND: "start"},
                kinds=frozenset({"noetl"}),
            )
        names = data.step_names
        if data.kind == "region":
            op_name = f"{job}__cycle__{data.playbook.step_id(names[0])}"
            desc = (
                f"Cycle over steps {', '.join(names)}: runs the engine's token machine until no step of the "
                "cycle is runnable."
            )
        else:
            op_name = f"{job}__{data.playbook.step_id(names[0])}"
            desc = data.steps[0].step.desc or f"Step {names[0]}"
        sources = [f"{os.path.basename(data.playbook.file or '')}:{s.line}" for s in data.steps if s.line]
        tags = {
            TAG_STEP: ",".join(names)[:255],
            TAG_KIND: ",".join(data.kinds) or "none",
        }
        if sources:
            tags["noetl/source"] = ",".join(sources)[:255]
        for sd in data.steps:  # Kubernetes placement from the playbook (profiles, resources), merged per op
            for k, v in step_k8s_tags(data.playbook.playbook, sd.step).items():
                tags.setdefault(k, v)
        return NoetlOpSpec(
            name=op_name,
            description=desc,
            tags=tags,
            kinds=frozenset({"noetl", *data.kinds}),
        )

    def get_asset_op_spec(self, data: NoetlPlaybookData) -> NoetlOpSpec:
        """The op of the playbook's tables multi-asset (``<job>__tables``, what *Materialize* runs):
        its tags (concurrency keys) and pool apply as to the job's ops."""
        return NoetlOpSpec(
            name=f"{data.job_name}__tables",
            description=f"Runs {data.path} and reports the tables it stores.",
            tags={TAG_PLAYBOOK: data.path},
            kinds=frozenset({"noetl"}),
        )

    def get_loop_frame_size(self, data: NoetlStepData) -> int | None:
        """Split a loop step into Dagster frames (plan -> frame -> collect)? None runs the loop inside the step's op.

        Default: frames for every step-level loop of a one-run job, except ``loop.spec.policy.exec: local``;
        ``loop.spec.dagster.frame_size`` sets the iterations per frame of a parallel loop (default: 16 frames
        at most; a sequential loop is one frame). Returns the frame size, 0 for the default.
        """
        loop = data.step.loop
        if loop is None or loop.exec == "local" or data.playbook.mode != "default" or loop.cursor is not None:
            return None
        dag = loop.spec.get("dagster") if isinstance(loop.spec, Mapping) else None
        size = dag.get("frame_size") if isinstance(dag, Mapping) else None
        return int(size) if size else 0

    # -- schedules ----------------------------------------------------------------------
    def get_schedule_specs(self, data: NoetlPlaybookData) -> list[NoetlScheduleSpec]:
        specs: list[NoetlScheduleSpec] = []
        for i, raw in enumerate(data.schedules):
            if not isinstance(raw, Mapping):
                raise ValueError(f"{data.path}: executor.spec.schedule[{i}] must be a mapping")
            unknown = set(raw) - SCHEDULE_KEYS
            if unknown:
                raise ValueError(
                    f"{data.path}: executor.spec.schedule has unknown keys {sorted(unknown)}; "
                    f"supported: {sorted(SCHEDULE_KEYS)}"
                )
            cron = raw.get("cron", raw.get("cron_schedule"))
            parts = partitions_def(data.playbook)
            timed = parts if isinstance(parts, dg.TimeWindowPartitionsDefinition) else None
            if (
                not cron and timed is not None
            ):  # the partitions' cadence, as build_schedule_from_partitioned_job
                cron = timed.get_cron_schedule()
            if not cron:
                raise ValueError(f"{data.path}: executor.spec.schedule needs `cron`")
            workload = raw.get("workload") or {}
            if not isinstance(workload, Mapping):
                raise ValueError(f"{data.path}: executor.spec.schedule.workload must be a mapping")
            retries = raw.get("retries", 0)
            if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
                raise ValueError(f"{data.path}: executor.spec.schedule.retries must be a whole number >= 0")
            tags = {str(k): str(v) for k, v in (raw.get("tags") or {}).items()}
            if retries:  # Dagster's run retries (run_retries.enabled in dagster.yaml)
                tags = {**RETRY_TAGS, "dagster/max_retries": str(retries), **tags}
            suffix = (
                naming.sanitize(str(raw["name"]))
                if raw.get("name")
                else ("schedule" if i == 0 else f"schedule_{i}")
            )
            specs.append(
                NoetlScheduleSpec(
                    name=f"{data.job_name}__{suffix}",
                    cron_schedule=cron,
                    execution_timezone=raw.get("timezone") or (timed.timezone if timed is not None else None),
                    workload=dict(workload),
                    description=raw.get("description") or f"Runs {data.path} on `{cron}`",
                    tags=tags,
                    running=bool(raw.get("enabled", False)),
                )
            )
        return specs

    # -- assets -------------------------------------------------------------------------
    def get_asset_spec(self, data: NoetlAssetData) -> dg.AssetSpec | None:
        """An asset for a table a step produces, with its declared inputs as deps.

        Kinds: ``noetl``, the storage format and the step's tool kinds (python, duckdb, ...), plus the
        output's; owners, group, automation and freshness from the output, else ``executor.spec.dagster``;
        the code reference points at the ``outputs`` entry (else the step). Tables stored under templated
        URIs still reach the catalog: each run materializes the key of the reference a task returned.
        """
        try:
            key = self.get_asset_key(data.uri)
            deps = [self.get_asset_key(u) for u in data.deps]
        except InvalidLocator:
            return None
        step = data.step
        pb = step.playbook.playbook
        dag = pb.dagster
        out = data.output or Output(uri=data.uri)
        meta: dict[str, Any] = {
            "noetl/uri": data.uri,
            "noetl/step": step.name,
            "noetl/playbook": step.playbook.path,
        }
        if data.task:
            meta["noetl/task"] = data.task
        declared = [c.schema_.get("columns") for c in out.checks if c.schema_ and c.schema_.get("columns")]
        if declared:
            meta["dagster/column_schema"] = dg.TableSchema(
                columns=[dg.TableColumn(str(n), str(t)) for n, t in declared[0].items()]
            )
        refs = self._code_references(step.playbook.file, out.line or step.line)
        if refs is not None:
            meta["dagster/code_references"] = refs
        kinds = {"noetl", data.kind, *step.kinds, *out.kinds} - {"noetl_table"}
        return dg.AssetSpec(
            key=key,
            deps=[d for d in deps if d != key],
            description=out.description
            or step.step.desc
            or f"Stored by step {step.name} of {step.playbook.path}",
            group_name=out.group or dag.group or step.playbook.job_name,
            kinds=kinds,
            owners=list(out.owners or dag.owners) or None,
            tags=dict(out.tags) or None,
            metadata=meta,
            automation_condition=automation_condition(out.automation or dag.automation),
            freshness_policy=freshness_policy(out.freshness or dag.freshness),
            partitions_def=partitions_def(pb),
        )

    # -- helpers ------------------------------------------------------------------------
    @staticmethod
    def _code_references(file: str | None, line: int | None) -> dg.CodeReferencesMetadataValue | None:
        if not file:
            return None
        with warnings.catch_warnings():  # beta API; the references are what the UI links to the YAML
            warnings.simplefilter("ignore", dg.BetaWarning)
            return dg.CodeReferencesMetadataValue(
                code_references=[
                    dg.LocalFileCodeReference(file_path=os.path.abspath(file), line_number=line or 1)
                ]
            )


def declared_assets(data: NoetlStepData) -> list[NoetlAssetData]:
    """Tables the step produces: its ``outputs`` and what its tasks store under literal URIs,
    with the literal URIs they read first."""
    out: list[NoetlAssetData] = []
    reads: list[str] = []
    for task in data.step.tool:
        uri = task.config.get("uri")
        if not (isinstance(uri, str) and "{{" not in uri and is_locator(uri)):
            continue
        if str(task.config.get("op") or "write") == "read":
            reads.append(uri)
            continue
        inputs = task.config.get("inputs") or []
        inputs = [inputs] if isinstance(inputs, str) else list(inputs)
        literal = [u for u in inputs if isinstance(u, str) and "{{" not in u and is_locator(u)]
        deps = tuple(dict.fromkeys(reads + literal))
        out.append(NoetlAssetData(data, uri, task.label, task.kind, deps))
    for o in data.step.outputs:
        hit = next((i for i, a in enumerate(out) if a.uri.split("@")[0] == o.uri), None)
        if hit is not None:
            out[hit] = dataclasses.replace(out[hit], output=o)
            continue
        writer = next(
            (t for t in data.step.tool if t.kind in STORAGE_KINDS and t.config.get("op", "write") == "write"),
            None,
        )
        out.append(NoetlAssetData(data, o.uri, writer.label if writer else "", writer.kind if writer else "noetl_table",
                                  tuple(dict.fromkeys(reads)), o))  # fmt: skip
    return out


def _tag_value_ok(v: str) -> bool:
    import re

    return len(v) <= 63 and re.fullmatch(r"[A-Za-z0-9_.-]*", v) is not None
