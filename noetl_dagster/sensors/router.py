"""The token-routing sensor: the control plane between Dagster runs.

One sensor per code location tails the EventStore with a cursor (the global
``gid``) and keeps a small watch list of the executions Dagster drives. For
each watched execution it rebuilds the state from the log (the engine's fold)
and launches:

(a) the playbook's job for an execution requested outside Dagster
    (``noetl-dagster run --runner dagster --detach`` records the request with
    ``requested_by: detached:...``);
(b) a step's own job for every runnable token of a step compiled separately
    (``mode="per_step"`` or ``spec.dagster.run: separate``); a join is runnable
    once no step that could still reach it is pending or running, as in the
    engine;
(c) a resume run when an execution has work left (pending tokens, step runs
    that never finished, or nothing left but the final events) and no live run:
    its run died, was cancelled, or failed with other branches pending.

``run_key`` is the token id (or execution id and log position for resumes), so
Dagster never launches the same work twice, and a run that died without
progress is not relaunched in a loop. An unknown playbook or a bad event is
reported in the tick's log and skipped; it never stops the others.

Executions started by a Dagster run (``requested_by: dagster:<run id>``) are
only resumed once their last run has ended ``grace_seconds`` ago, so a runner
that continues its own execution is not raced. Executions driven elsewhere
(the local runner, sub-playbooks run inside a step) are never touched.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from noetl_dagster.engine import events as E
from noetl_dagster.engine.control import Engine, Services
from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.resources.runtime import (
    REQUESTED_BY_DAGSTER,
    REQUESTED_BY_DETACHED,
    TAG_EXECUTION,
    TAG_PLAYBOOK,
    TAG_PROJECT,
    TAG_STEP,
    TAG_TENANT,
    TAG_TOKEN,
    attach,
    work_steps,
)
from noetl_dagster.util.links import link_tags

log = logging.getLogger("noetl_dagster.router")

TAG_REASON = "noetl/reason"
RUN_KEY_TAG = "dagster/run_key"
MAX_WATCHED = 1000
TAIL_BATCH = 5000
DEFAULT_GRACE_SECONDS = 10.0
WAIT_POLL_SECONDS = 0.05  # how often a waiting tick looks at the event store (one indexed query)


@dataclass
class Launch:
    execution_id: str
    job_name: str
    run_key: str
    reason: str
    tags: dict[str, str] = field(default_factory=dict)
    partition_key: str | None = None  # a partitioned playbook's main job: the execution's partition

    def run_request(self) -> dg.RunRequest:
        # a run the router launches links to its execution's page like a job run (issue 42)
        return dg.RunRequest(run_key=self.run_key, job_name=self.job_name,
                             tags={**link_tags(self.execution_id), **self.tags},
                             partition_key=self.partition_key)  # fmt: skip


@dataclass
class RunInfo:
    run_id: str
    status: str  # DagsterRunStatus value
    job_name: str
    run_key: str | None
    step: str | None
    ended_at: float | None
    created_at: float

    @property
    def live(self) -> bool:
        return self.status not in ("SUCCESS", "FAILURE", "CANCELED")


RunLookup = Callable[[str], list[RunInfo]]


@dataclass
class RouterCursor:
    gid: int = 0
    watch: dict[str, str] = field(default_factory=dict)  # execution id -> "detached" | "dagster"

    @classmethod
    def parse(cls, raw: str | None) -> RouterCursor:
        if not raw:
            return cls()
        try:
            d = json.loads(raw)
            return cls(int(d.get("gid", 0)), {str(k): str(v) for k, v in (d.get("watch") or {}).items()})
        except (ValueError, TypeError, AttributeError):
            return cls()  # an unreadable cursor restarts the tail; run keys keep launches idempotent

    def dumps(self) -> str:
        return json.dumps({"gid": self.gid, "watch": self.watch}, separators=(",", ":"))


@dataclass
class Tick:
    launches: list[Launch]
    cursor: RouterCursor
    notes: list[str]  # reported problems (bad playbook, bad event, stuck execution)


def instance_run_lookup(instance: dg.DagsterInstance, limit: int = 200) -> RunLookup:
    def lookup(eid: str) -> list[RunInfo]:
        records = instance.get_run_records(filters=dg.RunsFilter(tags={TAG_EXECUTION: eid}), limit=limit)
        out = []
        for r in records:
            run = r.dagster_run
            out.append(
                RunInfo(
                    run.run_id,
                    run.status.value,
                    run.job_name,
                    run.tags.get(RUN_KEY_TAG),
                    run.tags.get(TAG_STEP),
                    r.end_time,
                    r.create_timestamp.timestamp(),
                )
            )
        return out

    return lookup


def router_tick(
    index: Any,  # translator.build.PlaybookIndex
    svc: Services,
    runs_of: RunLookup,
    cursor: RouterCursor,
    *,
    now: float | None = None,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    only: Iterable[str] | None = None,
) -> Tick:
    """One evaluation: tail the log, update the watch list, decide the launches."""
    now = time.time() if now is None else now
    notes: list[str] = []
    cur = RouterCursor(cursor.gid, dict(cursor.watch))
    last_activity: dict[str, float] = {}
    while True:
        batch = svc.event_store.tail(cur.gid, TAIL_BATCH)
        if not batch:
            break
        for stored in batch:
            cur.gid = stored.gid
            ev = stored.event
            try:
                if ev.name == E.EXECUTION_REQUESTED:
                    _watch_request(index, cur, ev, notes)
                elif ev.name == E.WORKFLOW_FINISHED:
                    cur.watch.pop(ev.execution_id, None)
            except Exception as e:  # noqa: BLE001 - one bad event never stops routing
                notes.append(f"skipped event {ev.event_id} ({ev.name}) of execution {ev.execution_id}: {e}")
            if ev.execution_id in cur.watch:
                last_activity[ev.execution_id] = now
        if len(batch) < TAIL_BATCH:
            break
    while len(cur.watch) > MAX_WATCHED:
        dropped = next(iter(cur.watch))
        cur.watch.pop(dropped)
        notes.append(f"watch list full: no longer routing execution {dropped}")

    launches: list[Launch] = []
    targets = list(only) if only is not None else list(cur.watch)
    for eid in targets:
        kind = cur.watch.get(eid)
        if kind is None:
            continue
        try:
            keep, found = _plan_execution(index, svc, runs_of, eid, kind, now, grace_seconds, notes)
        except Exception as e:  # noqa: BLE001 - one bad execution never stops routing
            notes.append(f"execution {eid}: {type(e).__name__}: {e}")
            continue
        launches += found
        if not keep:
            cur.watch.pop(eid, None)
    return Tick(launches, cur, notes)


def _watch_request(index: Any, cur: RouterCursor, ev: E.Event, notes: list[str]) -> None:
    by = str(ev.data.get("requested_by") or "")
    if by.startswith(REQUESTED_BY_DETACHED):
        kind = "detached"
    elif by.startswith(REQUESTED_BY_DAGSTER):
        kind = "dagster"
    else:
        return  # the local runner or a parent step drives it
    ref = ev.data.get("playbook") or ev.data.get("name")
    if index.find(ref) is None and index.find(ev.data.get("file")) is None:
        if kind == "detached":
            bad = _find_invalid(index, ev.data.get("file"))
            why = f"is invalid ({bad.issues[0]})" if bad else "is not in this code location"
            notes.append(f"execution {ev.execution_id}: playbook {ref!r} {why}; not launched")
        return
    cur.watch[ev.execution_id] = kind


def _find_invalid(index: Any, file: Any) -> Any:
    finder = getattr(index, "find_invalid", None)
    return finder(file) if finder and file else None


def _plan_execution(
    index: Any,
    svc: Services,
    runs_of: RunLookup,
    eid: str,
    kind: str,
    now: float,
    grace: float,
    notes: list[str],
) -> tuple[bool, list[Launch]]:
    """(keep watching, launches) for one execution."""
    first = svc.event_store.read(eid, after_sequence=0)[:1]
    if not first:
        notes.append(f"execution {eid}: no events; dropped")
        return False, []
    req = first[0].data if first[0].name == E.EXECUTION_REQUESTED else {}
    compiled = index.find(req.get("playbook") or req.get("name")) or index.find(req.get("file"))
    if compiled is None:
        notes.append(
            f"execution {eid}: playbook {req.get('playbook')!r} is not in this code location; dropped"
        )
        return False, []
    eng = attach(compiled.playbook, svc, eid)
    if eng is None:
        return False, []
    st = eng.state
    if st.finished:
        return False, []
    runs = runs_of(eid)
    live = [r for r in runs if r.live and not _stale_unstarted(r, now, grace)]
    if kind == "dagster" and not live:
        ended = max((r.ended_at or r.created_at for r in runs), default=None)
        if ended is None or now - ended < grace:
            return True, []  # its own run is (about to be) driving it
    used_keys = {r.run_key for r in runs if r.run_key}
    base_tags = {
        TAG_EXECUTION: eid,
        TAG_PLAYBOOK: compiled.path,
        TAG_TENANT: first[0].tenant_id or svc.tenant,  # the request's, for the whole execution
        TAG_PROJECT: first[0].project_id or svc.project,
    }
    launches: list[Launch] = []
    separate = set(compiled.step_jobs)
    live_main = any(r.job_name == compiled.job_name for r in live)
    live_steps = {r.step for r in live if r.step}

    # (b) separate steps: one run per runnable activation
    for step in _runnable_steps(eng, separate):
        if step in live_steps:
            continue
        tids = [t for t, tok in st.tokens.items() if tok.step == step]
        key = tids[0] if not eng.graph.is_join(step) else "join:" + tids[0]
        if key in used_keys:  # its run ended without consuming it (died): retry once per log position
            key = f"{key}:{st.sequence}"
        launches.append(
            Launch(
                eid,
                compiled.step_jobs[step],
                key,
                f"token for {step}",
                {**base_tags, TAG_STEP: step, TAG_TOKEN: tids[0]},
            )
        )
    left = list(st.running.items()) + [(r, st.step_runs[r]["step"]) for r in st.unrouted_runs()]
    for srid, step in left:  # a separate step's run died mid-step (or before routing)
        if step in separate and step not in live_steps:
            launches.append(
                Launch(
                    eid,
                    compiled.step_jobs[step],
                    f"{srid}:{st.sequence}",
                    f"recover {step}",
                    {**base_tags, TAG_STEP: step},
                )
            )

    # (a)/(c) the main job: a fresh detached request, or work left with no live run
    work = work_steps(st)
    main_work = any(s not in separate for s in work)
    needs_finish = eng.is_done() and not work and not st.finished and not live
    if (main_work or needs_finish) and not live_main and not (needs_finish and launches):
        reason = (
            "detached request" if not runs else ("finish" if needs_finish and not main_work else "resume")
        )
        pkey = compiled.partition_key(st.workload) if compiled.playbook.dagster.partitions else None
        launches.append(Launch(eid, compiled.job_name, f"{eid}:{st.sequence}", reason, dict(base_tags), pkey))
    if not launches and not live and not eng.is_done() and not _any_runnable(eng, separate):
        notes.append(f"execution {eid}: pending tokens but nothing runnable (waiting joins); not launched")
    for launch in launches:
        launch.tags[TAG_REASON] = launch.reason
    return True, launches


def _stale_unstarted(r: RunInfo, now: float, grace: float) -> bool:
    """A run created but never launched (its launcher died) does not block routing forever."""
    return r.status == "NOT_STARTED" and now - r.created_at > max(grace, 60.0)


def _runnable_steps(eng: Engine, steps: set[str]) -> list[str]:
    """Steps (among ``steps``) with pending tokens that ``engine.ready`` would schedule now."""
    st, g = eng.state, eng.graph
    out: list[str] = []
    for step in st.pending_steps():
        if step not in steps:
            continue
        if g.is_join(step) and not g.join_ready(step, st.pending_steps(), st.running.values()):
            continue
        out.append(step)
    return out


def _any_runnable(eng: Engine, separate: set[str]) -> bool:
    return bool(_runnable_steps(eng, set(eng.playbook.steps))) or bool(eng.state.running)


def build_router_sensor(
    index: Any,
    *,
    name: str = "noetl_router",
    minimum_interval_seconds: int = 5,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    wait_seconds: float = 0.0,
) -> dg.SensorDefinition:
    """``wait_seconds``: a tick with nothing to route keeps watching the event store that long
    (``WAIT_POLL_SECONDS`` apart) and routes as soon as something is recorded, so a detached
    request is seen in ~50 ms instead of at the next tick (up to ``minimum_interval_seconds``
    later: Dagster ticks a sensor at most once a second). Keep it under the interval."""
    jobs = [job for c in index.playbooks for job in c.jobs]
    with warnings.catch_warnings():  # Dagster's own beta `owners` parameter, which we do not use
        warnings.simplefilter("ignore", dg.BetaWarning)
        return _router_sensor(index, jobs, name, minimum_interval_seconds, grace_seconds, wait_seconds)


def wait_for_events(store: Any, after_gid: int, seconds: float, poll: float = WAIT_POLL_SECONDS) -> bool:
    """True as soon as the store holds an event past ``after_gid``; False after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        if store.tail(after_gid, 1):
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(poll, left))


def _merge(first: Tick, then: Tick) -> Tick:
    return Tick(first.launches + then.launches, then.cursor, first.notes + then.notes)


def _router_sensor(
    index: Any, jobs: list[dg.JobDefinition], name: str, minimum_interval_seconds: int, grace_seconds: float,
    wait_seconds: float = 0.0,
) -> dg.SensorDefinition:  # fmt: skip
    @dg.sensor(
        name=name,
        jobs=jobs or None,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Routes NoETL tokens between runs: starts detached executions, launches per-step jobs, "
        "resumes executions whose run died.",
    )
    def _router(context: dg.SensorEvaluationContext, noetl: NoetlResource) -> dg.SensorResult | dg.SkipReason:
        svc = noetl.services()
        cursor = RouterCursor.parse(context.cursor)
        lookup = instance_run_lookup(context.instance)
        tick = router_tick(index, svc, lookup, cursor, grace_seconds=grace_seconds)
        deadline = time.monotonic() + wait_seconds
        while not tick.launches and (left := deadline - time.monotonic()) > 0:  # see a new request at once
            if not wait_for_events(svc.event_store, tick.cursor.gid, left):
                break
            watched = set(tick.cursor.watch)  # the others are planned at the next tick, as before
            tick = _merge(
                tick, router_tick(index, svc, lookup, tick.cursor, grace_seconds=grace_seconds, only=())
            )
            new = [eid for eid in tick.cursor.watch if eid not in watched]
            if new:
                tick = _merge(
                    tick, router_tick(index, svc, lookup, tick.cursor, grace_seconds=grace_seconds, only=new)
                )
            elif not tick.launches:
                time.sleep(WAIT_POLL_SECONDS)  # events of running executions flow: look again in a while
        for note in tick.notes:
            context.log.warning(note)
        for launch in tick.launches:
            context.log.info(f"launch {launch.job_name} for execution {launch.execution_id}: {launch.reason}")
        if not tick.launches:
            context.update_cursor(tick.cursor.dumps())
            idle = (f"no work to route (watching {len(tick.cursor.watch)} execution(s); "
                    + (f"{len(tick.notes)} problem(s) reported" if tick.notes else "no problems") + ")")  # fmt: skip
            context.log.debug(idle)  # an idle tick says nothing at INFO (it ticks every few seconds)
            return dg.SkipReason(idle)
        return dg.SensorResult(
            run_requests=[launch.run_request() for launch in tick.launches], cursor=tick.cursor.dumps()
        )

    return _router
