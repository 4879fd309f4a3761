"""NoETL events -> OpenLineage RunEvents (openlineage-python's v2 event model).

- One job per playbook: namespace ``noetl://<tenant>/<project>``, name the
  playbook's ``metadata.path``. Its run: START on ``playbook.execution.requested``,
  RUNNING on ``workflow.started``, COMPLETE / FAIL on ``workflow.finished``.
  A sub-playbook's run carries the ``parent`` facet (the calling execution) and
  ``root`` (the top execution).
- One child job per step, ``<playbook>.<step>``, one run per step run: START on
  ``step.started``, RUNNING when a loop starts or a task produces a dataset,
  COMPLETE on ``step.done``, FAIL on ``step.failed`` (``errorMessage``); the
  ``parent`` facet points at the playbook run, ``root`` at the top execution.
- Run ids are deterministic UUIDs (v7 layout) from the execution and step-run ids.
- Datasets: result references (``$ref`` payloads: ``file`` / ``s3://bucket``
  namespaces) and registry resources (``noetl://tenant/project`` namespace,
  ``namespace/type/name``) with ``schema``, ``outputStatistics``, ``version``
  (datasetVersion) and ``storage`` facets. A step's outputs are what its
  tasks/iterations/result stored; its inputs are references it received as
  arguments and registry resources it read. The playbook run reports every
  output and the inputs it did not produce itself.
- SQL: a task whose event records its statement (``outcome.meta.sql``, noted by the
  postgres/duckdb tools) adds the tables it reads and writes, named in the
  server's namespace, with a ``columnLineage`` facet on each written table
  (parsed by lineage/noetl_lineage/sql.py with openlineage-sql).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from urllib.parse import unquote, urlsplit

from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import (
    dataset_version_dataset,
    datasource_dataset,
    error_message_run,
    job_type_job,
    nominal_time_run,
    output_statistics_output_dataset,
    parent_run,
    processing_engine_run,
    schema_dataset,
    storage_dataset,
)

from noetl_dagster.dsl.locator import InvalidLocator, parse_locator
from noetl_dagster.engine import events as ev
from noetl_dagster.engine.events import Event, uuid7_from
from noetl_lineage.quantum_facet import FACET_NAME as QUANTUM_FACET
from noetl_lineage.quantum_facet import MAX_JOBS as QUANTUM_MAX_JOBS
from noetl_lineage.quantum_facet import QuantumJobsRunFacet, quantum_provenance
from noetl_lineage.sql import sql_lineage

log = logging.getLogger(__name__)


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0.0.0"


NOETL_VERSION = _version("noetl-dagster")
OPENLINEAGE_VERSION = _version("openlineage-python")
PRODUCER = f"https://noetl.io/noetl-dagster/{NOETL_VERSION}"
INTEGRATION = "NOETL"

# describe(uri, tenant, project) -> {"columns": [{name, type}], "inputs": [noetl:// URIs]} or None
Describer = Callable[[str, str, str], "dict[str, Any] | None"]


def job_namespace(tenant: str, project: str) -> str:
    return f"noetl://{tenant}/{project}"


def playbook_run_id(execution_id: str) -> str:
    return uuid7_from("noetl-execution", execution_id)


def step_run_id(execution_id: str, step_run: str) -> str:
    return uuid7_from("noetl-step-run", execution_id, step_run)


@dataclass
class DatasetRef:
    """A dataset seen in the events, with what the reference says about it."""

    namespace: str
    name: str
    version: str | None = None
    store: str | None = None
    format: str | None = None
    size: int | None = None
    rows: int | None = None
    columns: list[dict[str, Any]] | None = None
    uri: str = ""
    column_lineage: Any = (
        None  # a columnLineage facet parsed from the SQL that wrote it (lineage/noetl_lineage/sql.py)
    )
    derived_from: list[str] = field(default_factory=list)  # registry lineage (noetl:// URIs)

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    def merge(self, other: DatasetRef) -> None:
        for attr in ("version", "store", "format", "size", "rows", "columns", "column_lineage"):
            if getattr(other, attr) is not None:
                setattr(self, attr, getattr(other, attr))


def dataset_identity(uri: str) -> tuple[str, str, str | None] | None:
    """(namespace, name, version) for a reference URI, per OpenLineage naming."""
    if not isinstance(uri, str) or "://" not in uri:
        return None
    if uri.startswith("noetl://"):
        try:
            loc = parse_locator(uri, require_version=False)
        except InvalidLocator:
            return None
        return (job_namespace(loc.tenant, loc.project), f"{loc.namespace}/{loc.type}/{loc.name}", loc.version)
    parts = urlsplit(uri)
    if parts.scheme == "file":
        if parts.netloc and parts.netloc != "localhost":
            return f"file://{parts.netloc}", unquote(parts.path), None
        return "file", unquote(parts.path), None
    if not parts.scheme or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}", unquote(parts.path).lstrip("/") or "/", None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def dataset_from_ref(ref: dict[str, Any]) -> DatasetRef | None:
    """A ``$ref`` body or a published/read registry reference -> DatasetRef."""
    ident = dataset_identity(ref.get("uri"))  # type: ignore[arg-type]
    if ident is None:
        return None
    namespace, name, uri_version = ident
    columns = ref.get("columns") or ref.get("schema")
    if isinstance(columns, dict):
        columns = [{"name": k, "type": str(v)} for k, v in columns.items()]
    if not (isinstance(columns, list) and all(isinstance(c, dict) and "name" in c for c in columns)):
        columns = None
    version_ = ref.get("version") or uri_version
    if not version_ and isinstance(ref.get("checksum"), str):
        version_ = ref["checksum"]  # content-addressed payloads: the checksum is the version
    return DatasetRef(
        namespace=namespace,
        name=name,
        version=str(version_) if version_ else None,
        store=str(ref["store"]) if ref.get("store") else None,
        format=str(ref["format"]) if ref.get("format") else None,
        size=_int(ref.get("size")),
        rows=_int(ref.get("rows")),
        columns=columns,
        uri=str(ref.get("uri")),
    )


def _ref_body(value: Any) -> dict[str, Any] | None:
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get("$ref"), dict):
        return value["$ref"]
    return None


def result_outputs(result: Any) -> list[dict[str, Any]]:
    """References a task/step/loop result stored: ``$ref`` envelopes and published tables."""
    found: list[dict[str, Any]] = []
    body = _ref_body(result)
    if body is not None:
        return [body]
    if isinstance(result, dict):
        uri = result.get("uri")
        if isinstance(uri, str) and uri.startswith("noetl://") and "checksum" in result:
            found.append(result)
        items = result.get("results")
        if isinstance(items, list):
            found.extend(b for b in (_ref_body(i) for i in items) if b is not None)
    return found


def result_inputs(result: Any) -> list[dict[str, Any]]:
    """Registry resources a task read (``{…, ref: {uri: noetl://…}}``)."""
    if isinstance(result, dict) and isinstance(result.get("ref"), dict):
        ref = result["ref"]
        if isinstance(ref.get("uri"), str) and ref["uri"].startswith("noetl://"):
            return [ref]
    return []


def argument_inputs(args: Any) -> list[dict[str, Any]]:
    """References handed to a step as arguments: ``$ref`` envelopes and ``noetl://`` strings."""
    found: list[dict[str, Any]] = []
    values: Iterable[Any] = (
        args.values() if isinstance(args, dict) else args if isinstance(args, list) else ()
    )
    for value in values:
        body = _ref_body(value)
        if body is not None:
            found.append(body)
        elif isinstance(value, str) and value.startswith("noetl://"):
            found.append({"uri": value})
        elif isinstance(value, list):
            found.extend({"uri": v} for v in value if isinstance(v, str) and v.startswith("noetl://"))
    return found


@dataclass
class _RunState:
    run_id: str
    namespace: str
    job_name: str
    job_type: str
    inputs: dict[tuple[str, str], DatasetRef] = field(default_factory=dict)
    outputs: dict[tuple[str, str], DatasetRef] = field(default_factory=dict)
    started: bool = False
    finished: bool = False
    error: dict[str, Any] | None = None
    quantum: list[dict[str, Any]] = field(
        default_factory=list
    )  # provenance of quantum jobs (quantum_facet.py)
    quantum_dropped: int = 0


@dataclass
class _Execution:
    execution_id: str
    tenant: str
    project: str
    playbook: str
    run: _RunState
    parent: _Execution | None = None
    nominal_time: str | None = None
    steps: dict[str, _RunState] = field(default_factory=dict)
    last_error: dict[str, Any] | None = None

    @property
    def root(self) -> _Execution:
        node = self
        while node.parent is not None:
            node = node.parent
        return node


class LineageConverter:
    """Stateful: feed every event of an execution in order; returns the RunEvents to emit."""

    def __init__(
        self, *, describe: Describer | None = None, producer: str = PRODUCER, max_executions: int = 10_000
    ):
        self.describe = describe
        self.producer = producer
        self.max_executions = max_executions
        self._executions: dict[str, _Execution] = {}

    # -- state -------------------------------------------------------------------

    def _execution(self, e: Event) -> _Execution:
        exe = self._executions.get(e.execution_id)
        if exe is not None:
            return exe
        data = e.data if isinstance(e.data, dict) else {}
        requested = e.name == ev.EXECUTION_REQUESTED
        playbook = (
            str((data.get("playbook") or data.get("name")) if requested else "")
            or f"execution-{e.execution_id}"
        )
        namespace = job_namespace(e.tenant_id, e.project_id)
        parent_id = e.parent_execution_id or (data.get("parent_execution_id") if requested else None)
        exe = _Execution(
            execution_id=e.execution_id,
            tenant=e.tenant_id,
            project=e.project_id,
            playbook=playbook,
            run=_RunState(playbook_run_id(e.execution_id), namespace, playbook, "PLAYBOOK"),
            parent=self._executions.get(parent_id) if parent_id else None,
            nominal_time=_nominal_time(data) if requested else None,
        )
        if len(self._executions) >= self.max_executions:
            # forget the oldest finished execution (dicts keep insertion order)
            for key, old in list(self._executions.items()):
                if old.run.finished:
                    del self._executions[key]
                    break
        self._executions[e.execution_id] = exe
        return exe

    def _step(self, exe: _Execution, e: Event) -> _RunState:
        key = e.step_run_id or e.step or "?"
        run = exe.steps.get(key)
        if run is None:
            run = _RunState(
                step_run_id(exe.execution_id, key), exe.run.namespace, f"{exe.playbook}.{e.step}", "STEP"
            )
            exe.steps[key] = run
        return run

    # -- conversion ----------------------------------------------------------------

    def convert(self, e: Event) -> list[RunEvent]:
        name = e.name
        data = e.data if isinstance(e.data, dict) else {}
        exe = self._execution(e)
        out: list[RunEvent] = []
        if name == ev.EXECUTION_REQUESTED:
            out.append(self._playbook_event(exe, RunState.START, e))
        elif name == ev.WORKFLOW_STARTED:
            self._ensure_started(exe, e, out)
            self._add_inputs(exe.run, argument_inputs(data.get("workload")), exe)
            out.append(self._playbook_event(exe, RunState.RUNNING, e))
        elif name == ev.STEP_SCHEDULED:
            run = self._step(exe, e)
            self._add_inputs(run, argument_inputs(data.get("args")), exe)
        elif name == ev.STEP_STARTED:
            self._ensure_started(exe, e, out)
            run = self._step(exe, e)
            if not run.started:
                run.started = True
                out.append(self._step_event(exe, run, RunState.START, e))
        elif name == ev.TASK_DONE:
            run = self._step(exe, e)
            outcome = data.get("outcome") if isinstance(data.get("outcome"), dict) else {}
            result = outcome.get("result")
            new = self._add_outputs(run, result_outputs(result), exe)
            new |= self._add_inputs(run, result_inputs(result), exe)
            meta = outcome.get("meta") if isinstance(outcome.get("meta"), dict) else {}
            new |= self._add_sql(run, meta.get("sql_dialect") or data.get("kind"), meta)
            job = quantum_provenance(result)
            if job is not None:
                if len(run.quantum) < QUANTUM_MAX_JOBS:
                    run.quantum.append(job)
                else:
                    run.quantum_dropped += 1
            if new and run.started and not run.finished:
                out.append(self._step_event(exe, run, RunState.RUNNING, e))
        elif name == ev.LOOP_STARTED:
            run = self._step(exe, e)
            if run.started and not run.finished:
                out.append(self._step_event(exe, run, RunState.RUNNING, e))
        elif name in (ev.LOOP_ITERATION_DONE, ev.LOOP_DONE):
            self._add_outputs(self._step(exe, e), result_outputs(data.get("result")), exe)
        elif name == ev.STEP_DONE:
            run = self._step(exe, e)
            self._add_outputs(run, result_outputs(data.get("result")), exe)
            out.extend(self._finish_step(exe, run, RunState.COMPLETE, e))
        elif name == ev.STEP_FAILED:
            run = self._step(exe, e)
            run.error = (
                data.get("error")
                if isinstance(data.get("error"), dict)
                else {"message": str(data.get("error"))}
            )
            exe.last_error = run.error
            out.extend(self._finish_step(exe, run, RunState.FAIL, e))
        elif name == ev.WORKFLOW_FINISHED:
            self._ensure_started(exe, e, out)
            failed = data.get("status") == "failed" or e.status == "error"
            if not exe.run.finished:
                exe.run.finished = True
                if failed:
                    exe.run.error = exe.last_error or {"message": "playbook failed", "kind": "failed"}
                out.append(self._playbook_event(exe, RunState.FAIL if failed else RunState.COMPLETE, e))
        return out

    def _ensure_started(self, exe: _Execution, e: Event, out: list[RunEvent]) -> None:
        # a stream that begins mid-execution still gets START before anything else
        if not exe.run.started:
            out.append(self._playbook_event(exe, RunState.START, e))

    def _finish_step(self, exe: _Execution, run: _RunState, state: RunState, e: Event) -> list[RunEvent]:
        if run.finished:
            return []
        out: list[RunEvent] = []
        self._ensure_started(exe, e, out)
        if not run.started:
            run.started = True
            out.append(self._step_event(exe, run, RunState.START, e))
        run.finished = True
        out.append(self._step_event(exe, run, state, e))
        # the playbook run reports what its steps produced and consumed
        for key, ds in run.outputs.items():
            seen = exe.run.outputs.get(key)
            if seen is None:
                exe.run.outputs[key] = ds
            elif seen is not ds:  # a later step's facts (a table's column lineage) win, per field
                exe.run.outputs[key] = replace(seen)
                exe.run.outputs[key].merge(ds)
        for key, ds in run.inputs.items():
            exe.run.inputs.setdefault(key, ds)
        return out

    def _collect(
        self, target: dict[tuple[str, str], DatasetRef], refs: list[dict[str, Any]], exe: _Execution
    ) -> bool:
        new = False
        for ref in refs:
            ds = dataset_from_ref(ref)
            if ds is None:
                continue
            if ds.key in target:
                target[ds.key].merge(ds)
                continue
            target[ds.key] = ds
            new = True
            self._enrich(ds, exe)
        return new

    def _add_outputs(self, run: _RunState, refs: list[dict[str, Any]], exe: _Execution) -> bool:
        new = self._collect(run.outputs, refs, exe)
        for ds in list(run.outputs.values()):
            # registry lineage: what a published resource was derived from is an input of this run
            for uri in ds.derived_from:
                self._collect(run.inputs, [{"uri": uri}], exe)
        return new

    def _add_inputs(self, run: _RunState, refs: list[dict[str, Any]], exe: _Execution) -> bool:
        return self._collect(run.inputs, refs, exe)

    def _add_sql(self, run: _RunState, kind: Any, meta: Any) -> bool:
        """Tables a SQL task's statement (``outcome.meta.sql``, noted by the tool) reads and writes,
        with the columnLineage of each written table."""
        if not isinstance(meta, dict) or not isinstance(meta.get("sql"), str) or meta.get("sql_truncated"):
            return False  # a statement cut at the size bound would parse into wrong lineage
        namespace = meta.get("sql_namespace")
        if not isinstance(namespace, str) or "://" not in namespace:
            return False
        schema, database = meta.get("sql_default_schema"), meta.get("sql_database")
        parsed = sql_lineage(meta["sql"], namespace, kind=str(kind or "generic"),
                             default_schema=schema if isinstance(schema, str) else None,
                             database=database if isinstance(database, str) else None)  # fmt: skip
        new = False
        for name in parsed.inputs:
            if (namespace, name) not in run.inputs:
                run.inputs[(namespace, name)] = DatasetRef(namespace=namespace, name=name)
                new = True
        for name in parsed.outputs:
            ds = run.outputs.get((namespace, name))
            if ds is None:
                ds = run.outputs[(namespace, name)] = DatasetRef(namespace=namespace, name=name)
                new = True
            if name in parsed.column_lineage:
                ds.column_lineage = parsed.column_lineage[name]
        return new

    def _enrich(self, ds: DatasetRef, exe: _Execution) -> None:
        if self.describe is None or not ds.uri.startswith("noetl://"):
            return
        try:
            info = self.describe(ds.uri, exe.tenant, exe.project) or {}
        except Exception as exc:  # noqa: BLE001 - enrichment is best effort
            log.debug("lineage: cannot describe %s: %s", ds.uri, exc)
            return
        columns = info.get("columns")
        if ds.columns is None and isinstance(columns, list):
            ds.columns = [c for c in columns if isinstance(c, dict) and "name" in c] or None
        for key in ("rows", "size"):
            if getattr(ds, key) is None and _int(info.get(key)) is not None:
                setattr(ds, key, info[key])
        for key in ("format", "store"):
            if getattr(ds, key) is None and info.get(key):
                setattr(ds, key, str(info[key]))
        ds.derived_from = [u for u in info.get("inputs") or () if isinstance(u, str)]

    # -- building RunEvents --------------------------------------------------------

    def _job_facets(self, job_type: str) -> dict[str, Any]:
        return {
            "jobType": job_type_job.JobTypeJobFacet(
                processingType="BATCH", integration=INTEGRATION, jobType=job_type, producer=self.producer
            )
        }

    def _run_facets(self, exe: _Execution, run: _RunState, state: RunState) -> dict[str, Any]:
        facets: dict[str, Any] = {
            "processing_engine": processing_engine_run.ProcessingEngineRunFacet(
                version=NOETL_VERSION,
                name="noetl-dagster",
                openlineageAdapterVersion=OPENLINEAGE_VERSION,
                producer=self.producer,
            )
        }
        if run.job_type == "PLAYBOOK":
            if exe.nominal_time:
                facets["nominalTime"] = nominal_time_run.NominalTimeRunFacet(
                    nominalStartTime=exe.nominal_time, producer=self.producer
                )
            if exe.parent is not None:
                facets["parent"] = self._parent(exe.parent.run, exe.root)
        else:
            facets["parent"] = self._parent(exe.run, exe.root)
        if run.quantum:
            facets[QUANTUM_FACET] = QuantumJobsRunFacet(jobs=list(run.quantum), truncated=run.quantum_dropped,
                                                        producer=self.producer)  # fmt: skip
        if state == RunState.FAIL and run.error is not None:
            err = run.error
            message = str(err.get("message") or err.get("kind") or "failed")
            if err.get("kind"):
                message = f"{err['kind']}: {message}"
            facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
                message=message,
                programmingLanguage="python",
                stackTrace=str(err["traceback"]) if err.get("traceback") else None,
                producer=self.producer,
            )
        return facets

    def _parent(self, parent: _RunState, root: _Execution) -> parent_run.ParentRunFacet:
        return parent_run.ParentRunFacet(
            run=parent_run.Run(runId=parent.run_id),
            job=parent_run.Job(namespace=parent.namespace, name=parent.job_name),
            root=parent_run.Root(
                run=parent_run.RootRun(runId=root.run.run_id),
                job=parent_run.RootJob(namespace=root.run.namespace, name=root.run.job_name),
            ),
            producer=self.producer,
        )

    def _dataset_facets(self, ds: DatasetRef) -> dict[str, Any]:
        facets: dict[str, Any] = {}
        if ds.columns:
            facets["schema"] = schema_dataset.SchemaDatasetFacet(
                fields=[
                    schema_dataset.SchemaDatasetFacetFields(
                        name=str(c["name"]), type=str(c["type"]) if c.get("type") is not None else None
                    )
                    for c in ds.columns
                ],
                producer=self.producer,
            )
        if ds.version:
            facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(
                datasetVersion=ds.version, producer=self.producer
            )
        facets["dataSource"] = datasource_dataset.DatasourceDatasetFacet(
            name=ds.namespace,
            uri=ds.namespace if "://" in ds.namespace else f"{ds.namespace}://",
            producer=self.producer,
        )
        if ds.column_lineage is not None:
            facets["columnLineage"] = ds.column_lineage
        if ds.store:
            facets["storage"] = storage_dataset.StorageDatasetFacet(
                storageLayer=ds.store, fileFormat=ds.format, producer=self.producer
            )
        return facets

    def _inputs(
        self, run: _RunState, exclude: dict[tuple[str, str], DatasetRef] | None = None
    ) -> list[InputDataset]:
        return [
            InputDataset(namespace=ds.namespace, name=ds.name, facets=self._dataset_facets(ds))
            for key, ds in run.inputs.items()
            if not exclude or key not in exclude
        ]

    def _outputs(self, run: _RunState) -> list[OutputDataset]:
        out = []
        for ds in run.outputs.values():
            stats = {}
            if ds.rows is not None or ds.size is not None:
                stats["outputStatistics"] = (
                    output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                        rowCount=ds.rows, size=ds.size, producer=self.producer
                    )
                )
            out.append(
                OutputDataset(
                    namespace=ds.namespace, name=ds.name, facets=self._dataset_facets(ds), outputFacets=stats
                )
            )
        return out

    def _playbook_event(self, exe: _Execution, state: RunState, e: Event) -> RunEvent:
        exe.run.started = True
        terminal = state in (RunState.COMPLETE, RunState.FAIL)
        return RunEvent(
            eventType=state,
            eventTime=e.timestamp,
            run=Run(runId=exe.run.run_id, facets=self._run_facets(exe, exe.run, state)),
            job=Job(namespace=exe.run.namespace, name=exe.run.job_name, facets=self._job_facets("PLAYBOOK")),
            # what the execution read from outside itself; at the end, everything it wrote
            inputs=self._inputs(exe.run, exclude=exe.run.outputs),
            outputs=self._outputs(exe.run) if terminal else [],
            producer=self.producer,
        )

    def _step_event(self, exe: _Execution, run: _RunState, state: RunState, e: Event) -> RunEvent:
        return RunEvent(
            eventType=state,
            eventTime=e.timestamp,
            run=Run(runId=run.run_id, facets=self._run_facets(exe, run, state)),
            job=Job(namespace=run.namespace, name=run.job_name, facets=self._job_facets("STEP")),
            inputs=self._inputs(run),
            outputs=self._outputs(run),
            producer=self.producer,
        )

    def finished(self, execution_id: str) -> bool:
        exe = self._executions.get(execution_id)
        return exe is not None and exe.run.finished


def _nominal_time(data: dict[str, Any]) -> str | None:
    """The schedule time of a scheduled execution, when the requester recorded one."""
    for key in ("nominal_time", "scheduled_execution_time", "scheduled_at"):
        value = data.get(key)
        if isinstance(value, str) and "T" in value:
            return value
    schedule = data.get("schedule")
    if isinstance(schedule, dict) and isinstance(schedule.get("nominal_time"), str):
        return schedule["nominal_time"]
    return None


def convert_all(events: Iterable[Event], *, describe: Describer | None = None) -> list[RunEvent]:
    conv = LineageConverter(describe=describe)
    out: list[RunEvent] = []
    for e in events:
        out.extend(conv.convert(e))
    return out
