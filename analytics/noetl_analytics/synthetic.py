"""Synthetic NoETL event streams shaped like the engine's (for tests and benchmarks).

Each execution follows the engine's event order: request, workflow start, for
every step token/schedule/start, one ``task.done`` per attempt (a retried
attempt first fails), a loop with iterations on loop steps, ``step.done`` or
``step.failed``, routing, then finish and processed. Results over a size
threshold are ``$ref`` envelopes, as the engine offloads them.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from noetl_dagster.engine import events as ev
from noetl_dagster.engine.events import Event, uuid7_from


@dataclass(frozen=True)
class SyntheticSpec:
    executions: int = 10
    steps: int = 4
    tenants: tuple[str, ...] = ("acme", "globex")
    projects: tuple[str, ...] = ("etl", "ml")
    playbooks: tuple[str, ...] = ("catalog/ingest", "catalog/train", "catalog/report")
    kinds: tuple[str, ...] = ("python", "http", "duckdb", "postgres")
    retry_rate: float = 0.1
    fail_rate: float = 0.05
    loop_every: int = 3  # every n-th step is a loop step
    loop_items: int = 5
    ref_rate: float = 0.2
    start: datetime = datetime(2026, 1, 1, tzinfo=UTC)
    seed: int = 7


def _ts(t: datetime) -> str:
    return t.isoformat(timespec="microseconds")


def generate(spec: SyntheticSpec = SyntheticSpec()) -> Iterator[Event]:
    rnd = random.Random(spec.seed)
    for x in range(spec.executions):
        yield from _execution(spec, rnd, x)


def _execution(spec: SyntheticSpec, rnd: random.Random, x: int) -> Iterator[Event]:
    tenant = spec.tenants[x % len(spec.tenants)]
    project = spec.projects[(x // len(spec.tenants)) % len(spec.projects)]
    playbook = spec.playbooks[x % len(spec.playbooks)]
    exe = uuid7_from("synthetic", str(spec.seed), str(x))
    id_prefix = exe[:24]
    t = spec.start + timedelta(hours=x)
    seq = 0

    def make(name: str, data: dict, **kw) -> Event:
        nonlocal t, seq
        t += timedelta(milliseconds=1 + 19 * rnd.random())
        seq += 1
        return Event(
            name=name,
            execution_id=exe,
            data=data,
            tenant_id=tenant,
            project_id=project,
            event_id=f"{id_prefix}{seq:012x}",  # unique per execution, cheap to make
            timestamp=_ts(t),
            sequence=seq,
            **kw,
        )

    yield make(
        ev.EXECUTION_REQUESTED, {"playbook": playbook, "name": playbook.rsplit("/", 1)[-1], "workload": {}}
    )
    yield make(ev.WORKFLOW_STARTED, {"workload": {}, "entry": "s0"})
    started = t
    failed = False
    for s in range(spec.steps):
        step = f"s{s}"
        srun = uuid7_from(exe, step, "run")
        token = uuid7_from(exe, step, "token")
        yield make(
            ev.TOKEN_ENQUEUED,
            {"token_id": token, "step": step, "args": {}, "from_step": f"s{s - 1}" if s else None},
        )
        yield make(ev.STEP_SCHEDULED, {"token_ids": [token], "args": {}}, step=step, step_run_id=srun)
        yield make(ev.STEP_STARTED, {}, step=step, step_run_id=srun, status="in_progress")
        step_t0 = t
        kind = spec.kinds[s % len(spec.kinds)]
        step_failed = False
        if spec.loop_every and (s + 1) % spec.loop_every == 0:
            loop_id = uuid7_from(exe, step, "loop")
            yield make(
                ev.LOOP_STARTED,
                {"total": spec.loop_items, "mode": "parallel", "max_in_flight": 4},
                step=step,
                step_run_id=srun,
                loop_id=loop_id,
            )
            ok = bad = 0
            for i in range(spec.loop_items):
                yield make(
                    ev.LOOP_ITERATION_STARTED, {}, step=step, step_run_id=srun, loop_id=loop_id, iteration=i
                )
                yield from _task(make, rnd, spec, step, srun, kind, loop_id=loop_id, iteration=i)
                if rnd.random() < spec.fail_rate:
                    bad += 1
                    yield make(
                        ev.LOOP_ITERATION_FAILED,
                        {"error": {"kind": "tool", "message": "boom"}},
                        step=step,
                        step_run_id=srun,
                        loop_id=loop_id,
                        iteration=i,
                        status="error",
                    )
                else:
                    ok += 1
                    yield make(
                        ev.LOOP_ITERATION_DONE, {}, step=step, step_run_id=srun, loop_id=loop_id, iteration=i
                    )
            yield make(
                ev.LOOP_DONE,
                {
                    "result": {"results": [], "stats": {"total": spec.loop_items, "ok": ok, "failed": bad}},
                    "duration_ms": (t - step_t0).total_seconds() * 1000,
                },
                step=step,
                step_run_id=srun,
                loop_id=loop_id,
            )
        else:
            for event in _task(make, rnd, spec, step, srun, kind):
                if event.status == "error" and event.data["directive"] == "fail":
                    step_failed = True
                yield event
        duration = (t - step_t0).total_seconds() * 1000
        if step_failed:
            failed = True
            yield make(
                ev.STEP_FAILED,
                {"error": {"kind": "tool", "message": f"{step} failed"}, "duration_ms": duration},
                step=step,
                step_run_id=srun,
                status="error",
            )
            break
        result = _result(rnd, spec, exe, step)
        yield make(ev.STEP_DONE, {"result": result, "duration_ms": duration}, step=step, step_run_id=srun)
        yield make(
            ev.NEXT_EVALUATED, {"event_name": "step.done", "mode": "exclusive", "fired": []}, step=step
        )
    status = "failed" if failed else "completed"
    yield make(
        ev.WORKFLOW_FINISHED,
        {"status": status, "duration_ms": (t - started).total_seconds() * 1000},
        status="error" if failed else "success",
    )
    yield make(ev.PLAYBOOK_PROCESSED, {"status": status})


def _result(rnd: random.Random, spec: SyntheticSpec, exe: str, step: str) -> object:
    if rnd.random() < spec.ref_rate:
        size = rnd.randint(70_000, 5_000_000)
        return {
            "$ref": {
                "uri": f"file:///payloads/{exe}/{step}.json",
                "store": "file",
                "format": "json",
                "size": size,
                "checksum": "sha256:" + "0" * 64,
                "rows": size // 100,
            }
        }
    return {"status": "ok", "n": rnd.randint(0, 100)}


def _task(
    make,
    rnd: random.Random,
    spec: SyntheticSpec,
    step: str,
    srun: str,
    kind: str,
    loop_id: str | None = None,
    iteration: int | None = None,
) -> Iterator[Event]:
    attempts = 2 if rnd.random() < spec.retry_rate else 1
    fail_last = loop_id is None and rnd.random() < spec.fail_rate
    for attempt in range(1, attempts + 1):
        trun = f"{srun[:24]}{(iteration or 0) * 16 + attempt:012x}"
        yield make(
            ev.TASK_STARTED,
            {"task": f"{step}_task", "kind": kind},
            step=step,
            step_run_id=srun,
            task_run_id=trun,
            attempt=attempt,
            loop_id=loop_id,
            iteration=iteration,
            status="in_progress",
        )
        duration = rnd.uniform(1, 500)
        error = attempt < attempts or fail_last
        outcome = {
            "status": "error" if error else "ok",
            "result": None if error else {"value": attempt},
            "error": {
                "kind": "http" if kind == "http" else "tool",
                "message": "transient",
                "retryable": attempt < attempts,
            }
            if error
            else None,
            "meta": {"attempt": attempt, "duration_ms": duration, "started_at": None},
        }
        directive = "retry" if attempt < attempts else ("fail" if error else "continue")
        yield make(
            ev.TASK_DONE,
            {"task": f"{step}_task", "kind": kind, "outcome": outcome, "directive": directive},
            step=step,
            step_run_id=srun,
            task_run_id=trun,
            attempt=attempt,
            loop_id=loop_id,
            iteration=iteration,
            status="error" if error else "success",
        )
