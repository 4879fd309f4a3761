"""``noetl-dagster run --runner dagster``: run a playbook through a real Dagster instance.

The playbook is translated like any code location and its job is executed
with ``execute_in_process`` on an instance: ``$DAGSTER_HOME`` when set (the
runs show in ``dagster dev``), else an ephemeral one. Per-step playbooks and
executions with work left after a run (a failed branch next to a join, a
separate step) continue the way the daemon would: the router's tick decides
the next runs, which are executed here in turn. The result is the same
:class:`~noetl_dagster.runners.local.ExecutionResult` as the local runner's,
read back from the event log.

``detach=True`` only records the request (``requested_by: detached:cli``) and
returns: a running ``dagster-daemon`` with the ``noetl_router`` sensor of a
code location holding the playbook launches it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from noetl_dagster.dsl import load_playbook
from noetl_dagster.dsl.model import Playbook
from noetl_dagster.engine import usage
from noetl_dagster.engine.control import Engine, Services
from noetl_dagster.engine.events import uuid7
from noetl_dagster.engine.state import fold
from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.resources.runtime import (
    REQUESTED_BY_DETACHED,
    TAG_EXECUTION,
    register_engine,
)
from noetl_dagster.runners.local import ExecutionResult, readable_results
from noetl_dagster.sensors.router import RouterCursor, instance_run_lookup, router_tick
from noetl_dagster.storage.events import EventStore
from noetl_dagster.translator.build import CompiledPlaybook, NoetlCodeLocation, compile_playbooks
from noetl_dagster.translator.translator import NoetlTranslator
from noetl_dagster.util.links import link_tags

MAX_RUNS = 10_000  # per execution; a guard against a routing bug looping forever


class DagsterRunError(RuntimeError):
    """The execution could not be driven to its end through Dagster (not a playbook failure)."""


@dataclass
class DagsterRunInfo:
    run_ids: list[str]
    statuses: list[str]


_log = logging.getLogger(__name__)


class _ToLog(logging.Filter):
    """Re-logs Dagster's instance chatter on our logger (the log, not the terminal) and drops it there."""

    def filter(self, record: logging.LogRecord) -> bool:
        _log.info("dagster: %s", record.getMessage())
        return False


@contextlib.contextmanager
def dagster_chatter_to_log() -> Iterator[None]:
    """While opening an instance: Dagster's first-use telemetry notice and "Welcome to Dagster!"
    (click on stderr) and its warnings about the instance (a missing dagster.yaml) go to the log.
    Our commands print only what they say they print (docs/cli.md)."""
    quiet = _ToLog()
    dagster_logger = logging.getLogger("dagster")
    dagster_logger.addFilter(quiet)
    try:
        yield
    finally:
        dagster_logger.removeFilter(quiet)


def _telemetry_id_quietly(instance: dg.DagsterInstance) -> None:
    """Dagster writes its telemetry instance id (and prints the notice on stderr) at the first run of
    a DAGSTER_HOME; write it here with the notice captured, so the run itself stays quiet."""
    if not getattr(instance, "telemetry_enabled", False):
        return
    try:
        from dagster_shared.telemetry import get_or_set_instance_id  # noqa: PLC0415
    except ImportError:  # an older Dagster: the notice stays Dagster's
        return
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf), contextlib.redirect_stdout(buf):
        get_or_set_instance_id()
    if buf.getvalue().strip():
        _log.info("dagster: %s", " ".join(buf.getvalue().split()))


def open_instance(dagster_home: str | os.PathLike[str] | None = None) -> dg.DagsterInstance:
    """``dagster_home`` (or ``$DAGSTER_HOME``) when given, else an ephemeral in-memory instance."""
    home = dagster_home or os.environ.get("DAGSTER_HOME")
    with dagster_chatter_to_log():
        if home:
            Path(home).mkdir(parents=True, exist_ok=True)
            instance = dg.DagsterInstance.from_config(str(home))
        else:
            instance = dg.DagsterInstance.ephemeral()
            _one_event_connection(instance)
        _telemetry_id_quietly(instance)
    return instance


def _one_event_connection(instance: dg.DagsterInstance) -> None:
    """The ephemeral instance's in-memory event log writes each event on a fresh SQLite connection
    (NullPool, two PRAGMAs a write) beside the one it holds for its life: ~14 % of a small
    execution's CPU (benchmarks/bench_platform_line.py). Its writes are serialized by its own lock
    and never nest, so they can share the held connection, one transaction each. Left as Dagster
    made it when the storage is not the one this was measured on."""
    storage = getattr(instance, "_event_storage", None)
    held, lock = getattr(storage, "_held_conn", None), getattr(storage, "_db_lock", None)
    if type(storage).__name__ != "InMemoryEventLogStorage" or held is None or lock is None:
        return

    @contextlib.contextmanager
    def _connect() -> Iterator[Any]:
        with lock, held.begin():
            yield held

    storage._connect = _connect  # type: ignore[union-attr]


def run_playbook_dagster(
    playbook: Playbook | str | os.PathLike[str],
    workload: Mapping[str, Any] | None = None,
    *,
    event_store: EventStore | str | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    catalog_dirs: Iterable[str | os.PathLike[str]] = (),
    tenant: str = "default",
    project: str = "default",
    mode: str = "default",
    detach: bool = False,
    instance: dg.DagsterInstance | None = None,
    dagster_home: str | os.PathLike[str] | None = None,
    translator: NoetlTranslator | None = None,
    execution_id: str | None = None,
    location: NoetlCodeLocation | None = None,
    log_level: str = "WARNING",
) -> ExecutionResult:
    """Run one playbook to completion through Dagster and return the local runner's summary shape."""
    pb = playbook if isinstance(playbook, Playbook) else load_playbook(playbook)
    if isinstance(event_store, EventStore):
        raise TypeError("pass the event store as a URL: Dagster resources are configured by value")
    if detach and not (event_store or data_dir or os.environ.get("NOETL_EVENT_STORE_URL")
                       or os.environ.get("NOETL_DAGSTER_HOME")):  # fmt: skip
        raise DetachTargetMissing(
            "--detach records the request in the event log the code location's noetl_router sensor reads; "
            "name it with --data-dir (the location's NOETL_DAGSTER_HOME, e.g. example_project/.noetl) or "
            "--event-store, or set NOETL_DAGSTER_HOME / NOETL_EVENT_STORE_URL"
        )
    eid = execution_id or uuid7()
    if not detach:  # the execution's platform usage counts from here: compiling the job is its work too
        usage.window(eid)
    resource = NoetlResource(
        event_store_url=event_store,
        data_dir=str(Path(data_dir).resolve()) if data_dir else None,
        tenant=tenant,
        project=project,
        catalog_dirs=[str(Path(d).resolve()) for d in catalog_dirs],
    )
    if location is None:
        location = compile_playbooks([pb], translator, mode, resource=resource, include_sensor=False)
    compiled = location.index.find(pb.metadata.path) or location.index.playbooks[0]
    res = location.index.resource
    svc = res.services()
    if detach:
        return _detach(compiled, svc, eid, dict(workload or {}))
    own_instance = instance is None
    inst = instance or open_instance(dagster_home)
    try:
        info = drive(location, compiled, eid, dict(workload or {}), inst, log_level=log_level)
    finally:
        if own_instance:
            inst.dispose()
    result = result_from_log(svc, eid, pb)
    result.extra["dagster"] = {"run_ids": info.run_ids, "statuses": info.statuses}
    return result


def run_with_dagster(playbook: Playbook | str | os.PathLike[str], workload: Mapping[str, Any] | None = None,
                     **kwargs: Any) -> ExecutionResult:  # fmt: skip
    """The ``run --runner dagster`` entry point (same keywords as :func:`run_playbook_dagster`)."""
    return run_playbook_dagster(playbook, workload, **kwargs)


def _detach(compiled: CompiledPlaybook, svc: Services, eid: str, workload: dict[str, Any]) -> ExecutionResult:
    pb = compiled.playbook
    if pb.base_dir:
        svc.catalog.add_dir(pb.base_dir)
    eng = Engine(pb, svc, execution_id=eid)
    eng.start(workload, requested_by=f"{REQUESTED_BY_DETACHED}cli")
    register_engine(eng)
    # "requested": nothing ran yet; the router sensor of a running dagster-daemon launches it
    result = ExecutionResult(
        eid, "requested", dict(eng.state.ctx), {}, {}, svc.event_store.url, pb.metadata.path
    )
    where = f"--event-store {svc.event_store.url}"
    if svc.event_store.url.startswith("sqlite:///") and svc.event_store.url.endswith("/events.db"):
        where = f"--data-dir {svc.event_store.url.removeprefix('sqlite:///').removesuffix('/events.db')}"
    result.extra["follow"] = (
        f"requested execution {eid} of {pb.metadata.path} (tenant {svc.tenant}, "
        f"project {svc.project}); the noetl_router sensor of a running dagster-daemon / dagster dev over "
        f"{svc.event_store.url} launches it within a tick.\n"
        f"  follow: noetl-dagster events {eid} {where}\n"
        f"  in the Dagster UI: Runs, filter by tag noetl/execution_id={eid}"
    )
    return result


class DetachTargetMissing(ValueError):
    """``--detach`` without an event log the code location reads: the request would be lost."""


def drive(
    location: NoetlCodeLocation,
    compiled: CompiledPlaybook,
    eid: str,
    workload: dict[str, Any],
    instance: dg.DagsterInstance,
    *,
    log_level: str = "WARNING",
) -> DagsterRunInfo:
    """Execute the playbook's job, then whatever the router would launch, until the execution ends."""
    defs = location.definitions
    svc = location.index.resource.services()
    tags = {TAG_EXECUTION: eid, **link_tags(eid)}  # launched with its links, as the router's runs are
    # the console logger only; every message still goes to the instance's event log
    loggers = {"loggers": {"console": {"config": {"log_level": log_level.upper()}}}}
    run_config: dict[str, Any] = dict(loggers)
    if workload:
        run_config["ops"] = {compiled.start_op: {"config": {"workload_json": _json(workload)}}}
    info = DagsterRunInfo([], [])
    _execute(defs, compiled.job_name, instance, tags, run_config, info)
    cursor = RouterCursor(watch={eid: "dagster"})
    lookup = instance_run_lookup(instance)
    for _ in range(MAX_RUNS):
        state = fold(svc.event_store.read(eid))
        if state.finished:
            return info
        tick = router_tick(location.index, svc, lookup, cursor, grace_seconds=0.0, only=[eid])
        cursor = tick.cursor
        launches = [launch for launch in tick.launches if launch.execution_id == eid]
        if not launches:
            raise DagsterRunError(
                f"execution {eid} stopped unfinished after {len(info.run_ids)} run(s) "
                f"(last run {info.statuses[-1] if info.statuses else '-'}): {'; '.join(tick.notes) or 'no runnable work'}"
            )
        for launch in launches:
            _execute(
                defs,
                launch.job_name,
                instance,
                {**launch.tags, "dagster/run_key": launch.run_key},
                loggers,
                info,
            )
    raise DagsterRunError(f"execution {eid} needed more than {MAX_RUNS} runs")


def _execute(
    defs: dg.Definitions,
    job_name: str,
    instance: dg.DagsterInstance,
    tags: dict[str, str],
    run_config: dict[str, Any] | None,
    info: DagsterRunInfo,
) -> dg.ExecuteInProcessResult:
    job = defs.resolve_job_def(job_name)
    result = job.execute_in_process(run_config=run_config, instance=instance, tags=tags, raise_on_error=False)
    info.run_ids.append(result.run_id)
    info.statuses.append(result.dagster_run.status.value)
    if not result.success:
        # a NoETL step failure is recorded in the log and raised as dg.Failure; anything else is a runner problem
        for ev in result.all_events:
            data = ev.step_failure_data if ev.is_step_failure else None
            if data is not None and data.user_failure_data is None and data.error is not None:
                raise DagsterRunError(f"run {result.run_id} of {job_name} failed: {data.error.to_string()}")
    return result


def result_from_log(svc: Services, eid: str, pb: Playbook) -> ExecutionResult:
    events = svc.event_store.read(eid)
    if not events:
        raise DagsterRunError(f"execution {eid} has no events in {svc.event_store.url}")
    st = fold(events, svc.offloader.resolve)
    return ExecutionResult(
        execution_id=eid,
        status=st.status,
        ctx=dict(st.ctx),
        results=readable_results(st),
        runs=dict(st.runs),
        event_store_url=svc.event_store.url,
        playbook=pb.metadata.path,
    )


def _json(value: Any) -> str:
    import json

    from noetl_dagster.util.jsonutil import plain

    return json.dumps(plain(value))
