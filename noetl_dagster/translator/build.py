"""``build_playbook_definitions``: playbooks -> ``dg.Definitions``.

Each playbook becomes one job (``mode="default"``: the SCC condensation of its
step graph, one run per execution) or, with ``mode="per_step"``, a start job
plus one job per step whose arcs the token-routing sensor follows. Schedules
come from ``executor.spec.schedule``; one ``noetl_router`` sensor serves the
whole code location.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import yaml
from dagster._core.definitions.dependency import DynamicCollectDependencyDefinition

import noetl_dagster.translator.naming as naming
from noetl_dagster.dsl import PlaybookInvalid
from noetl_dagster.dsl.loader import YamlSyntaxError, read_text_file
from noetl_dagster.dsl.locator import InvalidLocator, parse_locator
from noetl_dagster.dsl.model import Output, Playbook
from noetl_dagster.engine.graph import analyze
from noetl_dagster.resources.noetl import NoetlResource, resource_from_env
from noetl_dagster.resources.runtime import TAG_STEP, json_safe
from noetl_dagster.translator.assets import playbook_assets
from noetl_dagster.translator.cache import load_playbook_cached
from noetl_dagster.translator.checks import keeps_check_class, playbook_checks
from noetl_dagster.translator.declare import (
    partitions_def,
    schedule_partition_keys,
    with_partition_metadata,
    workload_partition_key,
)
from noetl_dagster.translator.failures import set_playbook_root
from noetl_dagster.translator.frames import loop_dependencies, make_loop_ops
from noetl_dagster.translator.ops import RESOURCE_KEY, make_node_op, make_start_op, output_name
from noetl_dagster.translator.plan import MODES, JobPlan, Node, plan_job
from noetl_dagster.translator.translator import (
    START_ID,
    NoetlJobSpec,
    NoetlNodeData,
    NoetlOpSpec,
    NoetlPlaybookData,
    NoetlScheduleSpec,
    NoetlStepData,
    NoetlTranslator,
    declared_assets,
    default_executor,
    default_executor_name,
)
from noetl_dagster.translator.versions import default_asset_key

try:
    from yaml import CSafeLoader as _YamlLoader
except ImportError:  # pragma: no cover - libyaml missing
    from yaml import SafeLoader as _YamlLoader  # type: ignore[assignment]

log = logging.getLogger("noetl_dagster.translator")
SUFFIXES = (".yaml", ".yml")


@dataclass
class CompiledPlaybook:
    """Where one playbook went: its jobs and ops (the sensor and the Dagster runner look here)."""

    playbook: Playbook
    data: NoetlPlaybookData
    plan: JobPlan
    job_name: str  # the job a launch starts (whole playbook; per_step: the start job)
    start_op: str
    step_jobs: dict[str, str] = field(default_factory=dict)  # step -> its own job (separate steps)
    node_ops: dict[str, str] = field(default_factory=dict)  # node key -> op name in the main job
    jobs: list[dg.JobDefinition] = field(default_factory=list)
    schedules: list[dg.ScheduleDefinition] = field(default_factory=list)
    assets: list[dg.AssetSpec] = field(default_factory=list)
    outputs: dict[dg.AssetKey, Output] = field(default_factory=dict)  # declared outputs (checks, owners...)
    asset_steps: dict[dg.AssetKey, set[str]] = field(
        default_factory=dict
    )  # table -> steps storing it (subsets)
    asset_op: NoetlOpSpec | None = None  # the op of its tables' multi-asset (Materialize)
    asset_key: Callable[[str], dg.AssetKey] = default_asset_key  # a stored table's key (the translator's)

    @property
    def path(self) -> str:
        return self.playbook.metadata.path

    def partition_key(self, workload: Mapping[str, Any]) -> str | None:
        """The partition an execution's workload names, if any (the router's launches carry it)."""
        return workload_partition_key(self.playbook, workload)

    @property
    def mode(self) -> str:
        return self.plan.mode


@dataclass
class PlaybookIndex:
    """The playbooks of one code location, found by ``metadata.path`` (or name, or file)."""

    playbooks: list[CompiledPlaybook]
    resource: NoetlResource
    errors: list[str] = field(default_factory=list)  # one "FILE:LINE: RULE: message" block per broken file
    invalid: list[InvalidPlaybook] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # "FILE:LINE: registry-scope: ..." (the playbook loads)

    def find_invalid(self, ref: str | None) -> InvalidPlaybook | None:
        """The broken playbook file ``ref`` names (file path or its stem), if any."""
        if not ref:
            return None
        ref = str(ref)
        for bad in self.invalid:
            if os.path.abspath(ref) == os.path.abspath(bad.file) or Path(bad.file).stem == Path(ref).stem:
                return bad
        return None

    def find(self, ref: str | None) -> CompiledPlaybook | None:
        if not ref:
            return None
        ref = str(ref)
        for c in self.playbooks:
            if ref in (c.path, c.playbook.metadata.name, c.job_name):
                return c
        for c in self.playbooks:
            f = c.playbook.source_file
            if f and os.path.abspath(ref) == os.path.abspath(f):
                return c
        norm = ref.strip("/")
        for c in self.playbooks:
            p = c.path.strip("/")
            if p.endswith("/" + norm) or norm.endswith("/" + p):
                return c
        return None

    def job_for_step(self, compiled: CompiledPlaybook, step: str) -> str | None:
        return compiled.step_jobs.get(step)


@dataclass(frozen=True)
class InvalidPlaybook:
    """A playbook file that did not load or compile: shown in Dagster as an asset with a failing check."""

    file: str
    issues: tuple[str, ...]  # "FILE:LINE: RULE: message" lines
    key_name: str = ""  # unique among the broken files of a location (default: the file's stem)

    @property
    def message(self) -> str:
        return "\n".join(self.issues)

    @property
    def asset_key(self) -> dg.AssetKey:
        return dg.AssetKey(["noetl_invalid_playbook", self.key_name or naming.sanitize(Path(self.file).stem)])


ON_ERROR = ("report", "skip", "raise")
VALIDATION_ENV = "DAGSTER_IS_DEFS_VALIDATION_CLI"  # set by `dg check defs` / `dagster definitions validate`


def validating() -> bool:
    """Under ``dg check defs`` (Dagster marks that process) broken playbooks fail the check, while
    ``dagster dev`` keeps loading the rest (``on_error: report``)."""
    return os.environ.get(VALIDATION_ENV) == "1"


_warned: set[tuple[str, int, str]] = set()


def _warn_once(file: str | None, message: str) -> None:
    """A load-time warning once per process and file version (Dagster may build a location twice)."""
    try:
        mtime = os.stat(file).st_mtime_ns if file else 0
    except OSError:
        mtime = 0
    key = (file or "", mtime, message)
    if key in _warned:
        return
    if len(_warned) > 10_000:
        _warned.clear()
    _warned.add(key)
    log.warning("%s", message)


INVALID_CHECK = "playbook_is_valid"
INVALID_SENSOR = "noetl_invalid_playbooks"


@dataclass
class NoetlCodeLocation:
    definitions: dg.Definitions
    index: PlaybookIndex


# -- loading -------------------------------------------------------------------------------
def discover_playbooks(sources: str | os.PathLike[str] | Playbook | Iterable[Any]) -> list[Playbook | Path]:
    """Expand files, directories (recursively; YAML documents of ``kind: Playbook``) and models."""
    if isinstance(sources, (str, os.PathLike, Playbook)):
        sources = [sources]
    out: list[Playbook | Path] = []
    for src in sources:
        if isinstance(src, Playbook):
            out.append(src)
            continue
        p = Path(src)
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                if f.suffix in SUFFIXES and f.is_file() and _is_playbook_file(f):
                    out.append(f)
                    set_playbook_root(f, p)  # failures name the file as the folder shows it
        elif p.is_file():
            out.append(p)
            set_playbook_root(p, p.parent)
        else:
            raise FileNotFoundError(f"no playbook file or directory at {p}")
    return out


def _is_playbook_file(f: Path) -> bool:
    try:
        with open(f, encoding="utf-8") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    if "Playbook" not in head:
        return False
    try:  # the bounded reader and the YAML limits (a huge or hostile file is refused, not read whole)
        doc = yaml.load(read_text_file(f), Loader=_YamlLoader)
    except (yaml.YAMLError, YamlSyntaxError):
        return True  # let the loader report the syntax error (or the refusal) with its line
    return isinstance(doc, dict) and doc.get("kind") == "Playbook"


# -- building ------------------------------------------------------------------------------
def compile_playbooks(
    paths_or_playbooks: Any,
    translator: NoetlTranslator | None = None,
    mode: str = "default",
    *,
    resource: NoetlResource | None = None,
    include_sensor: bool = True,
    on_error: str = "raise",
    sensor_name: str = "noetl_router",
    sensor_interval_seconds: int = 5,
    sensor_wait_seconds: float = 0.0,
) -> NoetlCodeLocation:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}")
    translator = translator or NoetlTranslator()
    resource = resource or resource_from_env()
    loaded: list[tuple[Playbook, str | None]] = []  # (playbook, file it came from)
    invalid: list[InvalidPlaybook] = []
    for item in discover_playbooks(paths_or_playbooks):
        if isinstance(item, Playbook):
            loaded.append((item, item.source_file))
            continue
        try:
            loaded.append((load_playbook_cached(item), str(item)))
        except PlaybookInvalid as e:  # "raise" too: every broken file is named in the one error below
            invalid.append(
                InvalidPlaybook(str(item), tuple(str(i) for i in e.issues) or (f"{item}:1: invalid: {e}",))
            )
        except Exception as e:  # noqa: BLE001 - one unreadable file never takes the code location down
            if on_error == "raise":
                raise
            invalid.append(InvalidPlaybook(str(item), (f"{item}:1: load-error: {type(e).__name__}: {e}",)))
    playbooks = [pb for pb, _ in loaded]
    job_names = naming.unique_names(
        ((_identity(pb, i), pb.metadata.name) for i, pb in enumerate(playbooks)), base_fn=naming.job_base
    )
    compiled: list[CompiledPlaybook] = []
    jobs: list[dg.JobDefinition] = []
    schedules: list[dg.ScheduleDefinition] = []
    assets: list[dg.AssetSpec] = []
    seen_ops: dict[str, str] = {}
    scope_warnings: list[tuple[str | None, str]] = []  # (file, "FILE:LINE: registry-scope: ...")
    for i, (pb, file) in enumerate(loaded):
        job_name = job_names[_identity(pb, i)]
        try:
            pb = with_partition_metadata(pb)  # partitioned: storage writes record their partition key
            pb_mode = _playbook_mode(pb, mode)
            step_ids = naming.unique_names(((s.name, s.name) for s in pb.workflow), reserved=[START_ID])
            data = NoetlPlaybookData(pb, job_name, pb_mode, resource.tenant, resource.project, step_ids)
            c = _compile_one(pb, data, translator, resource)
            for job in c.jobs:
                for node in job.graph.node_defs:
                    owner = seen_ops.get(node.name, c.path)
                    if owner != c.path:
                        raise ValueError(f"op name {node.name!r} of {c.path} clashes with an op of {owner}")
        except Exception as e:  # noqa: BLE001 - contained: this playbook is reported, the others load
            if file is None:
                raise
            line = getattr(pb.metadata, "line", None) or 1
            invalid.append(InvalidPlaybook(file, (f"{file}:{line}: compile-error: {e}",)))
            continue
        for job in c.jobs:
            for node in job.graph.node_defs:
                seen_ops.setdefault(node.name, c.path)
        compiled.append(c)
        scope_warnings += [(file, w) for w in registry_scope_issues(c, resource, file)]
        jobs += c.jobs
        schedules += c.schedules
        assets += c.assets
    if invalid and (
        on_error == "raise" or validating()
    ):  # a CI gate fails on broken playbooks whatever on_error
        raise PlaybookInvalid([i for bad in invalid for i in bad.issues])  # type: ignore[misc] - FILE:LINE: RULE lines
    keys = naming.unique_names((bad.file, Path(bad.file).stem) for bad in invalid)
    invalid = [dataclasses.replace(bad, key_name=keys[bad.file]) for bad in invalid]
    errors = [bad.message for bad in invalid]
    for bad in invalid:  # one line per broken file, no traceback
        _warn_once(bad.file, "noetl: invalid playbook {} not loaded ({}): {}".format(
            bad.file, "reported as asset " + bad.asset_key.to_user_string() if on_error == "report" else "skipped",
            bad.issues[0] + (f" (+{len(bad.issues) - 1} more)" if len(bad.issues) > 1 else "")))  # fmt: skip
    for file, w in scope_warnings:  # before anyone clicks Materialize: it would fail with "no live grant"
        _warn_once(file, "noetl: " + w)
    index = PlaybookIndex(compiled, resource, errors, invalid, [w for _, w in scope_warnings])
    sensors = []
    if include_sensor:
        from noetl_dagster.sensors.router import build_router_sensor  # noqa: PLC0415

        sensors.append(
            build_router_sensor(
                index,
                name=sensor_name,
                minimum_interval_seconds=sensor_interval_seconds,
                wait_seconds=sensor_wait_seconds,
            )
        )
    checks: list[dg.AssetChecksDefinition] = []
    assets_defs = playbook_assets(compiled, _dedupe_assets(assets))
    checks += playbook_checks(compiled, {k for ad in assets_defs for k in ad.keys})
    if on_error == "report":
        for bad in invalid:
            assets.append(invalid_playbook_asset(bad))
            checks.append(invalid_playbook_check(bad))
        if invalid:  # the daemon evaluates each unevaluated check: broken files show failed without a click
            sensors.append(dg.AutomationConditionSensorDefinition(
                INVALID_SENSOR, target=dg.AssetSelection.checks(*(dg.AssetCheckKey(b.asset_key, INVALID_CHECK) for b in invalid)),
                default_status=dg.DefaultSensorStatus.RUNNING, minimum_interval_seconds=30,
                description="Runs the playbook_is_valid check of each broken playbook file once, so the catalog shows it failed.",
            ))  # fmt: skip
    defs = dg.Definitions(
        jobs=jobs,
        schedules=schedules,
        sensors=sensors,
        assets=assets_defs + [a for a in _dedupe_assets(assets) if a.key.path[0] == "noetl_invalid_playbook"],
        asset_checks=checks,
        resources={RESOURCE_KEY: resource},
        executor=asset_executor([c.playbook for c in compiled if c.assets]),
    )
    return NoetlCodeLocation(defs, index)


def registry_scope_issues(c: CompiledPlaybook, resource: NoetlResource, file: str | None) -> list[str]:
    """Declared ``noetl://`` tables the code location's tenant/project does not own: the in-process
    registry refuses those writes at run time unless the owner granted ``write`` to this scope."""
    out: list[str] = []
    scope = f"{resource.tenant}/{resource.project}"
    for i, spec in enumerate(c.assets):
        uri = str(spec.metadata.get("noetl/uri") or "")
        try:
            loc = parse_locator(uri, require_version=False)
        except InvalidLocator:
            continue
        if (loc.tenant, loc.project) == (resource.tenant, resource.project):
            continue
        out_decl = c.outputs.get(spec.key)
        step = c.playbook.steps.get(str(spec.metadata.get("noetl/step")))
        line = (out_decl.line if out_decl else None) or (step.line if step else None) or 1
        msg = (f"{file or c.path}:{line}: registry-scope: {scope} may not write {loc.unversioned().uri} "
               f"(it belongs to {loc.tenant}/{loc.project}); set tenant: {loc.tenant} and project: {loc.project} "
               "in defs.yaml (NoetlResource tenant/project), or have its owner grant write to " + scope)  # fmt: skip
        if msg not in out:
            out.append(msg)
        c.assets[i] = spec.replace_attributes(
            description=f"WARNING: {msg}\n\n{spec.description or ''}".rstrip(),
            metadata={**spec.metadata, "noetl/registry_scope": dg.MetadataValue.text(msg)},
        )
    return out


def invalid_playbook_asset(bad: InvalidPlaybook) -> dg.AssetSpec:
    """Where a Dagster user looks: the asset graph shows the broken file with its errors."""
    with warnings.catch_warnings():  # beta API; the reference is what the UI links to the YAML line
        warnings.simplefilter("ignore", dg.BetaWarning)
        code_refs = dg.CodeReferencesMetadataValue(
            code_references=[
                dg.LocalFileCodeReference(file_path=os.path.abspath(bad.file), line_number=_line_of(bad))
            ]
        )
    return dg.AssetSpec(
        bad.asset_key,
        description=f"INVALID NoETL playbook {bad.file}: not loaded, no jobs.\n\n"
        + "\n".join(f"    {i}" for i in bad.issues),
        group_name="noetl_invalid_playbooks",
        kinds={"noetl"},
        metadata={
            "noetl/file": dg.MetadataValue.path(bad.file),
            "noetl/errors": dg.MetadataValue.text(bad.message),
            "dagster/code_references": code_refs,
        },
        tags={"noetl/invalid": "true"},
    )


def invalid_playbook_check(bad: InvalidPlaybook) -> dg.AssetChecksDefinition:
    """A check that fails with the validation errors: the ``noetl_invalid_playbooks`` automation sensor
    runs it once (it is missing), or run it from the asset's Checks tab."""

    @dg.asset_check(
        asset=bad.asset_key, name=INVALID_CHECK, description=bad.message, blocking=False,
        metadata={"noetl/file": bad.file},
        automation_condition=dg.AutomationCondition.missing() & ~dg.AutomationCondition.in_progress(),
    )  # fmt: skip
    def _check() -> dg.AssetCheckResult:
        return dg.AssetCheckResult(
            passed=False,
            severity=dg.AssetCheckSeverity.ERROR,
            description=bad.message,
            metadata={
                "noetl/errors": dg.MetadataValue.text(bad.message),
                "noetl/issue_count": len(bad.issues),
            },
        )

    return keeps_check_class(_check)  # stays a check when the defs-folder loader copies it


def _line_of(bad: InvalidPlaybook) -> int:
    parts = bad.issues[0].split(":") if bad.issues else []
    for p in parts[1:3]:
        if p.strip().isdigit():
            return max(int(p), 1)
    return 1


def build_playbook_definitions(
    paths_or_playbooks: Any,
    translator: NoetlTranslator | None = None,
    mode: str = "default",
    **kwargs: Any,
) -> dg.Definitions:
    """Translate playbooks (files, directories, or ``Playbook`` models) into Dagster definitions.

    ``mode="default"``: one job per playbook, one run per execution (cycles run as region ops).
    ``mode="per_step"``: every step is its own job and the ``noetl_router`` sensor routes tokens.
    A playbook may choose its own mode with ``executor.spec.dagster.mode``. Keyword arguments:
    ``resource`` (:class:`NoetlResource`, default from ``NOETL_DAGSTER_*`` env vars),
    ``include_sensor`` (default True: one router per code location), ``on_error``: "raise" (default),
    "report" (a broken file becomes an asset ``noetl_invalid_playbook/<stem>`` whose description and
    failing ``playbook_is_valid`` check carry ``FILE:LINE: RULE: message``; the rest loads) or "skip"
    (one warning line per broken file, nothing in Dagster).
    """
    return compile_playbooks(paths_or_playbooks, translator, mode, **kwargs).definitions


def _identity(pb: Playbook, i: int) -> str:
    return pb.source_file or pb.metadata.path or f"playbook-{i}"


def _playbook_mode(pb: Playbook, default: str) -> str:
    dag = pb.executor.spec.get("dagster")
    if isinstance(dag, dict) and dag.get("mode"):
        m = str(dag["mode"])
        if m not in MODES:
            raise ValueError(
                f"{pb.metadata.path}: executor.spec.dagster.mode must be one of {', '.join(MODES)}"
            )
        return m
    return default


def _dedupe_assets(specs: Sequence[dg.AssetSpec]) -> list[dg.AssetSpec]:
    """One spec per key (a table two playbooks declare); two different tables with one key (the key
    scope left out what tells them apart) fail the load, naming both."""
    seen: dict[dg.AssetKey, dg.AssetSpec] = {}
    for s in specs:
        first = seen.setdefault(s.key, s)
        a, b = (str(x.metadata.get("noetl/uri") or "").split("@")[0] for x in (first, s))
        if a and b and a != b:
            raise ValueError(
                f"{a} and {b} both have asset key {s.key.to_user_string()}; keep them apart with "
                "NoetlTranslator(asset_key_scope='tenant') (component: translation.asset_key_scope: tenant)"
            )
    return list(seen.values())


CELERY_BROKER_ENV = "NOETL_CELERY_BROKER"
CELERY_BACKEND_ENV = "NOETL_CELERY_BACKEND"


class MissingExtra(ValueError):
    """The deployment asks for a capability whose extra is not installed (one line, with the pip hint)."""


def _require_extra(extra: str, module: str) -> None:
    from noetl_dagster.util.extras import install_hint, installed  # noqa: PLC0415

    if not installed(module):
        raise MissingExtra(f"NOETL_DAGSTER_EXECUTOR={extra} needs: {install_hint(extra)}")


def asset_executor(playbooks: Sequence[Playbook]) -> dg.ExecutorDefinition:
    """The executor of the location's asset jobs (Materialize, subsets, backfills; Dagster builds them
    from the catalog and gives them ``Definitions.executor``): one op per playbook runs the whole
    playbook, so in the run's own process like a job run; Dagster's default (multiprocess) would start
    a process per op. ``$NOETL_DAGSTER_EXECUTOR`` multiprocess / celery keep their choice; k8s sends the
    op to its own pod only when a playbook asks for it (a ``distributed`` loop)."""
    choices = {default_executor(pb) for pb in playbooks} or {default_executor_name()}
    return _executor("k8s" if "k8s" in choices else next(iter(sorted(choices))))


@functools.cache  # one object per choice: Definitions.merge refuses two locations' executors unless identical
def _executor(name: str) -> dg.ExecutorDefinition:
    if name == "multiprocess":
        return dg.multiprocess_executor
    if name == "in_process":
        return dg.in_process_executor
    if name in ("k8s", "celery"):
        _require_extra(name, "dagster_k8s" if name == "k8s" else "dagster_celery")
    if name == "k8s":
        from dagster_k8s import k8s_job_executor  # noqa: PLC0415 - only on Kubernetes deployments

        return k8s_job_executor
    if name == "celery":
        from dagster_celery import celery_executor  # noqa: PLC0415 - only where a Celery broker runs

        broker = os.environ.get(CELERY_BROKER_ENV, "redis://127.0.0.1:6379/0")
        return celery_executor.configured(
            {"broker": broker, "backend": os.environ.get(CELERY_BACKEND_ENV, broker)}, name="celery"
        )
    raise ValueError(f"unknown executor {name!r}; use in_process, multiprocess, celery or k8s")


def _compile_one(
    pb: Playbook, data: NoetlPlaybookData, translator: NoetlTranslator, resource: NoetlResource | None = None
) -> CompiledPlaybook:
    # jobs carry the resource: Definitions re-binds jobs that lack one and rebuilds the router sensor and
    # schedules around the copies (Dagster's own rebuild passes its beta ``owners`` parameter: a BetaWarning
    # at every code-server load)
    bound = {RESOURCE_KEY: resource} if resource is not None else None
    graph = analyze(pb)
    plan = plan_job(pb, data.mode, graph)
    in_cycle = {s for comp in graph.sccs if graph.is_cyclic(comp) for s in comp}
    step_data = {
        s.name: NoetlStepData(data, s, is_join=graph.is_join(s.name), in_cycle=s.name in in_cycle)
        for s in pb.workflow
    }
    job_spec = translator.get_job_spec(data)
    start_spec = translator.get_op_spec(NoetlNodeData(data, "start"))
    node_specs = {
        key: translator.get_op_spec(NoetlNodeData(data, node.kind, tuple(step_data[s] for s in node.steps)))
        for key, node in plan.nodes.items()
    }
    _check_names([start_spec.name, *(s.name for s in node_specs.values())], pb)

    # the main job: noetl_start -> nodes (per_step: noetl_start alone)
    outs_of: dict[str, dict[str, str]] = {
        key: {t: output_name(plan.nodes[t]) for t in node.succ} for key, node in plan.nodes.items()
    }
    start_outs = {r: output_name(plan.nodes[r]) for r in plan.roots}
    start_op = make_start_op(pb, start_spec, plan, start_outs)
    node_defs: list[dg.OpDefinition] = [start_op]
    deps: dict[str, dict[str, dg.MultiDependencyDefinition]] = {}
    out_op: dict[str, str] = {
        k: s.name for k, s in node_specs.items()
    }  # the op holding a node's token outputs
    frame_sizes = {
        k: translator.get_loop_frame_size(step_data[n.first]) if n.kind == "step" else None
        for k, n in plan.nodes.items()
    }
    for key, size in frame_sizes.items():
        if size is not None:
            out_op[key] = f"{node_specs[key].name}__collect"
    for key, node in plan.nodes.items():
        sources = [dg.DependencyDefinition(out_op[p], outs_of[p][key]) for p in node.pred]
        if key in plan.roots:
            sources.insert(0, dg.DependencyDefinition(start_spec.name, start_outs[key]))
        spec = node_specs[key]
        if frame_sizes[key] is not None:
            frame_spec = spec.replace_attributes(
                name=f"{spec.name}__frame",
                description=f"Iterations of the loop of step {node.first} (one frame).",
            )
            collect_spec = spec.replace_attributes(
                name=out_op[key],
                description=f"Collects the loop of step {node.first}: loop.done, step.done, routing.",
            )
            _check_names([frame_spec.name, collect_spec.name], pb)
            ops = make_loop_ops(pb, spec, frame_spec, collect_spec, plan, node, outs_of[key],
                                frame_size=frame_sizes[key] or None, asset_key=translator.get_asset_key)  # fmt: skip
            node_defs.extend(ops)
            deps.update(loop_dependencies(spec.name, frame_spec.name, collect_spec.name))
        else:
            node_defs.append(make_node_op(pb, spec, plan, node, outs_of[key], has_input=bool(sources),
                                          asset_key=translator.get_asset_key))  # fmt: skip
        if sources:
            deps[spec.name] = {"after": dg.MultiDependencyDefinition(sources)}
    prefix = f"{data.job_name}__"
    start_node = node_alias(start_spec.name, prefix)
    jobs = [_job(job_spec, node_defs, deps, config=launch_config(pb, start_node), prefix=prefix, resource_defs=bound,
                 partitions_def=partitions_def(pb))]  # fmt: skip
    c = CompiledPlaybook(pb, data, plan, job_spec.name, start_node,
                         node_ops={k: node_alias(v, prefix) for k, v in out_op.items()},
                         asset_key=translator.get_asset_key)  # fmt: skip

    # separate steps: one job of one op each, launched by the sensor
    for step in plan.separate:
        sd = step_data[step]
        op_spec = translator.get_op_spec(NoetlNodeData(data, "step", (sd,), separate=True))
        single = Node(f"step:{step}", "step", (step,))
        op = make_node_op(
            pb,
            op_spec,
            None,
            single,
            {},
            has_input=False,
            main_job=job_spec.name,
            asset_key=translator.get_asset_key,
        )
        sjob_spec = job_spec.replace_attributes(
            name=f"{job_spec.name}__step__{data.step_id(step)}",
            description=(sd.step.desc or f"Step {step}")
            + f"\n\nOne step of {data.path}, launched by the token router.",
            tags={**job_spec.tags, TAG_STEP: step},
        )
        _check_names([sjob_spec.name], pb)
        jobs.append(_job(sjob_spec, [op], {}, prefix=prefix, resource_defs=bound))
        c.step_jobs[step] = sjob_spec.name
    c.jobs = jobs

    for sspec in translator.get_schedule_specs(data):
        c.schedules.append(schedule_for(sspec, jobs[0], start_node))
    for sd in step_data.values():
        for asset in declared_assets(sd):
            spec = translator.get_asset_spec(asset)
            if spec is not None:
                c.assets.append(spec)
                c.asset_steps.setdefault(spec.key, set()).add(sd.name)
                if asset.output is not None:
                    c.outputs.setdefault(spec.key, asset.output)
    if c.assets:
        c.asset_op = translator.get_asset_op_spec(data)
        _check_names([c.asset_op.name], pb)
    return c


def schedule_for(sspec: NoetlScheduleSpec, job: dg.JobDefinition, start_node: str) -> dg.ScheduleDefinition:
    """A schedule of the playbook's job. On a partitioned job each tick requests partitions, as
    ``dg.build_schedule_from_partitioned_job`` does (``declare.schedule_partition_keys``: the last
    complete time partition, or every static key), so the key reaches the workload as a launchpad
    partition run's does; the run key is the partition, so a tick never runs one twice."""
    run_config = {"ops": {start_node: {"config": {"workload_json": json.dumps(dict(sspec.workload))}}}}
    status = dg.DefaultScheduleStatus.RUNNING if sspec.running else dg.DefaultScheduleStatus.STOPPED
    parts = job.partitions_def
    if parts is None:
        return dg.ScheduleDefinition(
            name=sspec.name, cron_schedule=sspec.cron_schedule, job=job, execution_timezone=sspec.execution_timezone,
            run_config=run_config, tags=dict(sspec.tags), description=sspec.description, default_status=status,
        )  # fmt: skip
    tags = dict(sspec.tags)

    def _tick(context: dg.ScheduleEvaluationContext) -> Iterator[dg.RunRequest | dg.SkipReason]:
        keys = schedule_partition_keys(parts, context.scheduled_execution_time)
        if not keys:
            yield dg.SkipReason(f"{job.name}: no complete partition yet at this tick")
        for k in keys:
            yield dg.RunRequest(run_key=k, partition_key=k, run_config=run_config, tags=tags)

    return dg.ScheduleDefinition(
        name=sspec.name, cron_schedule=sspec.cron_schedule, job=job, execution_timezone=sspec.execution_timezone,
        execution_fn=_tick, description=sspec.description, default_status=status,
    )  # fmt: skip


def launch_config(pb: Playbook, start_op: str) -> dict[str, Any]:
    """The job's default run config: the playbook's workload, so the launchpad opens pre-filled and a
    launch with it unchanged runs the playbook as written."""
    workload = {str(k): v for k, v in json_safe(pb.workload).items() if naming.NAME_RE.match(str(k))}
    return {"ops": {start_op: {"config": {"workload": workload}}}}


def node_alias(op_name: str, prefix: str) -> str:
    """The name an op has inside its job: its definition name without the ``<job>__`` prefix
    (definitions stay unique in the code location; the graph, launchpad and run config read
    ``start``, ``noetl_start``, ``cycle__check`` rather than ``<job>__start``)."""
    return op_name[len(prefix) :] if op_name.startswith(prefix) and len(op_name) > len(prefix) else op_name


def _realias(dep: Any, alias: dict[str, str]) -> Any:
    if isinstance(dep, DynamicCollectDependencyDefinition):
        return DynamicCollectDependencyDefinition(alias.get(dep.node_name, dep.node_name), dep.output_name)
    if isinstance(dep, dg.MultiDependencyDefinition):
        return dg.MultiDependencyDefinition([_realias(d, alias) for d in dep.get_dependencies_and_mappings()])
    if isinstance(dep, dg.DependencyDefinition):
        return dg.DependencyDefinition(alias.get(dep.node, dep.node), dep.output, dep.description)
    return dep


def _job(
    spec: NoetlJobSpec, node_defs: list[dg.OpDefinition], deps: dict[str, Any], config: dict[str, Any] | None = None,
    prefix: str = "", partitions_def: dg.PartitionsDefinition | None = None,
    resource_defs: dict[str, Any] | None = None,
) -> dg.JobDefinition:  # fmt: skip
    alias = {d.name: node_alias(d.name, prefix) for d in node_defs}
    if len(set(alias.values())) != len(alias):  # a custom translator's names: keep them as they are
        alias = {d.name: d.name for d in node_defs}
    dependencies = {
        dg.NodeInvocation(d.name, alias=alias[d.name]): {
            i: _realias(dep, alias) for i, dep in deps.get(d.name, {}).items()
        }
        for d in node_defs
    }
    graph = dg.GraphDefinition(
        name=spec.name, node_defs=node_defs, dependencies=dependencies, description=spec.description
    )
    return graph.to_job(
        name=spec.name,
        description=spec.description,
        tags=dict(spec.tags),
        metadata=dict(spec.metadata),
        executor_def=_executor(spec.executor),
        config=config,
        op_retry_policy=spec.op_retry_policy,
        partitions_def=partitions_def,
        resource_defs=resource_defs,
    )


def _check_names(names: list[str], pb: Playbook) -> None:
    seen: set[str] = set()
    for n in names:
        if not naming.NAME_RE.match(n):
            raise ValueError(f"{pb.metadata.path}: Dagster name {n!r} must match {naming.NAME_RE.pattern}")
        if n in seen:
            raise ValueError(f"{pb.metadata.path}: two ops are named {n!r}; rename one in the translator")
        seen.add(n)
