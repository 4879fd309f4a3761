"""A loop step as Dagster frames: plan -> frame (mapped, DynamicOut) -> collect.

- ``<job>__<step>`` (plan): schedules the step's activation, records step.started
  and loop.started (``loop.in`` rendered once), and yields one frame per slice of
  iterations: a sequential loop is one frame (its iterations depend on each
  other's writes); a parallel loop is split into frames of ``frame_size``
  iterations (default: at most 16 frames), which the multiprocess or Kubernetes
  executor runs side by side.
- ``<job>__<step>__frame`` (mapped): runs its iterations with the engine's own
  ``Worker.loop_iteration`` (the same code the local runner uses), skipping any
  the log already holds (re-execution after a frame died).
- ``<job>__<step>__collect``: rebuilds the iteration results from the log, records
  loop.done and step.done (``Worker.loop_end`` / ``step_end``), routes, and yields
  towards the work left, like any step op.

The events are the local runner's, per step and per iteration. When the step
has no single fresh activation to split (several tokens, or a step run left by a
dead run) the plan op runs it whole, and one empty frame keeps Dagster going to
``collect`` (a DynamicOut with no entries would skip it).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import dagster as dg
from dagster._core.definitions.dependency import (
    DynamicCollectDependencyDefinition,  # stable since 0.12; no public alias
)

from noetl_dagster.dsl.model import Playbook
from noetl_dagster.engine import events as E
from noetl_dagster.resources.runtime import (
    TAG_STATUS,
    OpReport,
    StepOutcome,
    attach,
    error_text,
    execution_lock,
    forget,
    json_safe,
    op_log,
    sync,
    work_steps,
)
from noetl_dagster.translator.ops import (
    RESOURCE_KEY,
    RESULT_OUTPUT,
    _execution_id,
    _report_outputs,
    _tag_run,
    op_tags,
    run_tagger,
)
from noetl_dagster.translator.plan import JobPlan, Node
from noetl_dagster.translator.translator import NoetlOpSpec

MAX_FRAMES = 16
FRAMES_OUT = "frames"
DONE_OUT = "done"


def frame_size_for(total: int, parallel: bool, configured: int | None) -> int:
    if not parallel:
        return max(1, total)
    if configured and configured > 0:
        return configured
    return max(1, math.ceil(total / MAX_FRAMES))


def loop_dependencies(plan_op: str, frame_op: str, collect_op: str) -> dict[str, dict[str, Any]]:
    return {
        frame_op: {"frame": dg.DependencyDefinition(plan_op, FRAMES_OUT)},
        collect_op: {"frames": DynamicCollectDependencyDefinition(frame_op, DONE_OUT)},
    }


def make_loop_ops(
    pb: Playbook,
    plan_spec: NoetlOpSpec,
    frame_spec: NoetlOpSpec,
    collect_spec: NoetlOpSpec,
    plan: JobPlan,
    node: Node,
    node_outputs: dict[str, str],
    *,
    frame_size: int | None,
    asset_key: Callable[[str], dg.AssetKey] | None = None,
) -> tuple[dg.OpDefinition, dg.OpDefinition, dg.OpDefinition]:
    (step_name,) = node.steps
    step = pb.step(step_name)
    assert step.loop is not None
    downstream: set[str] = set()
    for key in node.succ:
        downstream |= plan.nodes[key].reach

    def _plan(context, _inputs):  # noqa: ANN001
        res = getattr(context.resources, RESOURCE_KEY)
        svc = res.services()
        eid = _execution_id(context)
        frames: list[dict[str, Any]] = []
        failed: list[StepOutcome] = []
        with op_log(eid, context.log, run_tagger(context)) as sink:
            try:
                eng = attach(pb, svc, eid)
                if eng is None:
                    raise LookupError(f"execution {eid} is not in the event log {svc.event_store.url}")
                if not eng.state.finished:

                    def record(run, fired=None):  # noqa: ANN001
                        if not run.ok and (not fired if fired is not None else eng.state.failed):
                            failed.append(StepOutcome(run.step, run.step_run_id, run.ok, run.error, True))

                    recovered = eng.recover(
                        on_step=record, allowed=[step_name]
                    )  # a dead run's step run, whole
                    acts = eng.ready([step_name])
                    if len(acts) == 1 and not recovered:
                        frames, run, fired = _begin_frames(eng, acts[0], frame_size)
                        if run is not None:  # loop.in did not render: the step failed (and was routed)
                            record(run, fired)
                    else:
                        for act in acts:
                            run = eng.run(act)
                            record(run, eng.route(run))
                    eng.recorder.flush()
                    sink.flush()
                    eng = sync(eng, sink.mine)
                    if eng.is_done() and not eng.state.finished:
                        with execution_lock(res.locks_dir(), eid):
                            eng = sync(eng, sink.mine)
                            if eng.is_done() and not eng.state.finished:
                                _tag_run(context, {TAG_STATUS: eng.finish()})
                                forget(svc, eid)
                pending = work_steps(eng.state)
            except BaseException:
                forget(svc, eid)
                raise
        if frames:
            for k, fr in enumerate(frames):
                yield dg.DynamicOutput(fr, mapping_key=f"f{k}", output_name=FRAMES_OUT)
        elif step_name in pending or downstream & pending:
            yield dg.DynamicOutput({"noop": True}, mapping_key="none", output_name=FRAMES_OUT)
        if failed:
            raise dg.Failure(
                description=f"step {step_name!r} failed: {error_text(failed[0].error)}", allow_retries=False
            )

    def _frame(context, inputs):  # noqa: ANN001
        fr = inputs["frame"]
        if fr.get("noop"):
            yield dg.Output({"noop": True}, DONE_OUT)
            return
        res = getattr(context.resources, RESOURCE_KEY)
        svc = res.services()
        eid = _execution_id(context)
        with op_log(eid, context.log, run_tagger(context)) as sink:
            try:
                eng = attach(pb, svc, eid)
                if eng is None:
                    raise LookupError(f"execution {eid} is not in the event log {svc.event_store.url}")
                pos = eng.state.loops.get(fr["loop_id"])
                seen = (pos.done | pos.failed) if pos is not None else set()
                todo = [i for i in fr["indices"] if i not in seen]
                if len(todo) < len(fr["indices"]):
                    context.log.warning(
                        f"{len(fr['indices']) - len(todo)} iteration(s) of this frame are in the log already"
                    )
                items: list[Any] = [None] * fr["total"]
                for i, item in zip(fr["indices"], fr["items"], strict=True):
                    items[i] = item
                writers = _ctx_writers(eng, fr["loop_id"]) if step.loop.mode == "parallel" else None
                lr = eng.worker.loop_resume(step, fr["step_run_id"], fr["args"], fr["loop_id"], items,
                                            fr["max_in_flight"], time.perf_counter(), writers)  # fmt: skip
                if lr.parallel and len(todo) > 1:
                    with ThreadPoolExecutor(max_workers=min(lr.max_in_flight, len(todo))) as pool:
                        for fut in [pool.submit(eng.worker.loop_iteration, lr, i) for i in todo]:
                            fut.result()
                else:
                    for i in todo:
                        eng.worker.loop_iteration(lr, i)
                eng.recorder.flush()
                sink.flush()
                sync(eng, sink.mine)
                ok = sum(1 for i in todo if lr.oks[i])
            except BaseException:
                forget(svc, eid)
                raise
        yield dg.Output(
            {"loop_id": fr["loop_id"], "step_run_id": fr["step_run_id"], "indices": fr["indices"]},
            DONE_OUT,
            metadata={"iterations": len(todo), "ok": ok, "failed": len(todo) - ok,
                      "range": f"{fr['indices'][0]}..{fr['indices'][-1]}" if fr["indices"] else "-"},
        )  # fmt: skip

    def _collect(context, inputs):  # noqa: ANN001
        done = [d for d in inputs["frames"] if not d.get("noop")]
        res = getattr(context.resources, RESOURCE_KEY)
        svc = res.services()
        eid = _execution_id(context)
        report = OpReport(eid, None)
        with op_log(eid, context.log, run_tagger(context)) as sink:
            try:
                eng = attach(pb, svc, eid)
                if eng is None:
                    raise LookupError(f"execution {eid} is not in the event log {svc.event_store.url}")
                report.engine = eng
                if done and not eng.state.finished:
                    srid, loop_id = done[0]["step_run_id"], done[0]["loop_id"]
                    if srid in eng.state.running:  # not finished by an earlier attempt of this op
                        run = _finish_loop(eng, step, srid, loop_id)
                        fired = eng.route(run)
                        report.outcomes.append(
                            StepOutcome(run.step, srid, run.ok, run.error, not run.ok and not fired)
                        )
                eng.recorder.flush()
                report.task_results = sink.task_results
                sink.flush()
                eng = sync(eng, sink.mine)
                report.engine = eng
                if eng.is_done() and not eng.state.finished:
                    with execution_lock(res.locks_dir(), eid):
                        eng = sync(eng, sink.mine)
                        report.engine = eng
                        if eng.is_done() and not eng.state.finished:
                            report.finished = eng.finish()
                    if report.finished:
                        _tag_run(context, {TAG_STATUS: report.finished})
                        forget(svc, eid)
            except BaseException:
                forget(svc, eid)
                raise
        yield from _report_outputs(context, report, node, plan, node_outputs, asset_key)
        bad = report.unhandled
        if bad:
            raise dg.Failure(
                description=f"step {bad[0].step!r} failed: {error_text(bad[0].error)}",
                metadata={"execution_id": eid, "error": dg.MetadataValue.json(json_safe(bad[0].error or {}))},
                allow_retries=False,
            )

    outs = {name: dg.Out(dg.Nothing, is_required=False) for name in node_outputs.values()}
    outs[RESULT_OUTPUT] = dg.Out(dg.Nothing, is_required=False, description="the step's result (metadata)")
    common = {"required_resource_keys": {RESOURCE_KEY}}
    plan_op = dg.OpDefinition(
        compute_fn=_plan, name=plan_spec.name, description=plan_spec.description, tags=op_tags(plan_spec),
        ins={"after": dg.In(dg.Nothing)}, outs={FRAMES_OUT: dg.DynamicOut(dict, is_required=False)},
        retry_policy=plan_spec.retry_policy, pool=plan_spec.pool, **common,
    )  # fmt: skip
    frame_op = dg.OpDefinition(
        compute_fn=_frame, name=frame_spec.name, description=frame_spec.description, tags=op_tags(frame_spec),
        ins={"frame": dg.In(dict)}, outs={DONE_OUT: dg.Out(dict)},
        retry_policy=frame_spec.retry_policy, pool=frame_spec.pool, **common,
    )  # fmt: skip
    collect_op = dg.OpDefinition(
        compute_fn=_collect, name=collect_spec.name, description=collect_spec.description,
        tags=op_tags(collect_spec), ins={"frames": dg.In(list)}, outs=outs,
        retry_policy=collect_spec.retry_policy, pool=collect_spec.pool, **common,
    )  # fmt: skip
    return plan_op, frame_op, collect_op


def _begin_frames(eng: Any, act: Any, frame_size: int | None) -> tuple[list[dict[str, Any]], Any, Any]:
    """step.scheduled (done by ready) -> step.started -> loop.started, durably; (frames, None, None).

    When ``loop.in`` does not render the step fails at once, as in run_step: ([], run, fired)."""
    step = eng.playbook.step(act.step)
    worker = eng.worker
    t0 = worker.step_begin(step, act.step_run_id)
    lr, err = worker.step_loop_begin(step, act.step_run_id, act.args)
    if lr is None:
        run = worker.step_end(step, act.step_run_id, act.args, False, None, err, "loop.done", t0)
        return [], run, eng.route(run)
    eng.recorder.flush()  # the frames run elsewhere: what they continue must be in the log
    size = frame_size_for(lr.total, lr.parallel, frame_size)
    base = {"step_run_id": act.step_run_id, "loop_id": lr.loop_id, "args": act.args, "total": lr.total,
            "max_in_flight": lr.max_in_flight}  # fmt: skip
    frames = []
    for start in range(0, lr.total, size):
        idx = list(range(start, min(start + size, lr.total)))
        frames.append({**base, "indices": idx, "items": [lr.items[i] for i in idx]})
    return frames or [{**base, "indices": [], "items": []}], None, None  # an empty loop still has its collect


def _ctx_writers(eng: Any, loop_id: str) -> dict[str, int]:
    """ctx keys written by iterations of a parallel loop so far (the one-writer rule spans frames)."""
    writers: dict[str, int] = {}
    for ev in eng.services.event_store.read(eng.execution_id):
        if ev.name == E.CTX_PATCHED and ev.loop_id == loop_id and ev.iteration is not None:
            for k in ev.data.get("patch") or {}:
                writers.setdefault(k, ev.iteration)
    return writers


def _finish_loop(eng: Any, step: Any, srid: str, loop_id: str) -> Any:
    """loop.done and step.done from the iterations the log holds (the frames' work)."""
    events = eng.services.event_store.read(eng.execution_id)
    offloader, reader = eng.services.offloader, (eng.services.tenant, eng.services.project)

    def resolve(value: Any) -> Any:
        return offloader.resolve(value, reader)

    pos = eng.state.loops[loop_id]
    items: list[Any] = [None] * pos.total
    info = eng.state.step_runs[srid]
    started = loop_started = None
    results: dict[int, tuple[bool, Any]] = {}
    for ev in events:
        if ev.step_run_id != srid:
            continue
        if ev.name == E.STEP_STARTED:
            started = ev.timestamp
        elif ev.name == E.LOOP_STARTED and ev.loop_id == loop_id:
            loop_started = ev.timestamp
        elif ev.loop_id == loop_id and ev.name == E.LOOP_ITERATION_DONE:
            results[ev.iteration] = (True, resolve(ev.data.get("result")))
        elif ev.loop_id == loop_id and ev.name == E.LOOP_ITERATION_FAILED:
            results[ev.iteration] = (False, {"status": "error", "error": ev.data.get("error")})
    missing = [i for i in range(pos.total) if i not in results]
    if missing:
        raise RuntimeError(
            f"loop {loop_id} of step {step.name!r}: iterations {missing[:10]} have no result in the log"
        )
    lr = eng.worker.loop_resume(step, srid, info.get("args"), loop_id, items, 1, _perf_at(loop_started))
    for i, (ok, value) in results.items():
        lr.oks[i], lr.results[i] = ok, value
    ok, aggregate, err = eng.worker.loop_end(lr)
    return eng.worker.step_end(
        step, srid, info.get("args"), ok, aggregate, err, "loop.done", _perf_at(started)
    )


def _perf_at(ts: str | None) -> float:
    """A perf_counter origin for a wall-clock timestamp of the log (durations span ops and processes)."""
    if not ts:
        return time.perf_counter()
    elapsed = time.time() - datetime.fromisoformat(ts).timestamp()
    return time.perf_counter() - max(0.0, elapsed)
