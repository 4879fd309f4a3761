"""Where two executions of one playbook diverge (issue 36): ``noetl-dagster diff A B``.

Each execution folds into its step activations in order; the k-th activation of step S in A
is matched with the k-th of S in B (by name, so two versions of a playbook compare as long as
their step names do; steps that exist in one version only show as such). The first activation,
in A's order, whose outcome differs is the divergence, at the earliest event of it where the two
logs differ (a task that failed in B is reported at its ``task.done``, not at the arc its error
fired later):

- ``arc``: different arcs fired (or B never ran that activation: A took a path B did not);
- ``status``: a task outcome (``task.done`` success / error) or the step's outcome differs;
- ``retries``: a different number of task retries (loop iterations' retries included);
- ``result``: a different result checksum (a payload reference's own checksum).

With it: the sequence numbers of the deciding events in both logs, the arc conditions
(``when``) of that step when the playbook could be loaded, and the context that decided
it: the ``ctx`` keys, workload keys and step input that differ between A and B at that point.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from noetl_dagster.engine.error_location import code_frame
from noetl_dagster.engine.events import Event
from noetl_dagster.engine.explain import UnknownExecution, checksum

KINDS = ("arc", "status", "retries", "result")


class _Act:
    __slots__ = ("step", "k", "seq", "decided", "fired", "status", "retries", "checksum", "ctx", "args", "error",
                 "result_seq", "retry_seq", "tasks", "error_at")  # fmt: skip

    def __init__(self, step: str, k: int, seq: int | None, args: Any):
        self.step, self.k, self.seq, self.args = step, k, seq, args
        self.decided = self.result_seq = self.retry_seq = None
        self.fired: list[str] | None = None
        self.status, self.retries, self.checksum, self.error = "running", 0, None, None
        self.ctx: dict[str, Any] = {}
        self.error_at: tuple[Any, int | None] | None = None  # (task, raising line in its code) of its failure
        self.tasks: list[tuple[Any, int]] = []  # ((task, iteration, attempt, status), sequence) per task.done

    def value(self, kind: str) -> Any:
        return {"arc": self.fired, "status": self.status, "retries": self.retries, "result": self.checksum}[
            kind
        ]

    def outcomes(self) -> list[tuple[Any, int | None]]:
        """What ``status`` compares, in log order: each task.done's outcome, then the step's."""
        return [*self.tasks, (self.status, self.result_seq)]

    def seq_of(self, kind: str) -> int | None:
        return {"arc": self.decided, "status": self.result_seq, "retries": self.retry_seq,
                "result": self.result_seq}[kind] or self.seq  # fmt: skip


def activations(events: Iterable[Event]) -> tuple[list[_Act], dict[str, Any], dict[str, Any]]:
    """(activations in scheduling order, the execution's facts, its final ctx)."""
    acts: list[_Act] = []
    by_run: dict[str, _Act] = {}
    count: dict[str, int] = {}
    ctx: dict[str, Any] = {}
    info: dict[str, Any] = {}
    for ev in events:
        d = ev.data if isinstance(ev.data, dict) else {}
        if not info:
            info.update(execution_id=ev.execution_id, tenant=ev.tenant_id, project=ev.project_id)
        name = ev.name
        if name == "playbook.execution.requested":
            info.update(playbook=d.get("playbook"), file=d.get("file"))
        elif name == "workflow.started":
            info["workload"] = d.get("workload") if isinstance(d.get("workload"), dict) else {}
        elif name == "workflow.finished":
            info["status"] = d.get("status")
        elif name == "ctx.patched" and isinstance(d.get("patch"), dict):
            ctx.update(d["patch"])
        elif name in ("step.scheduled", "step.skipped"):
            step = ev.step or ""
            k = count[step] = count.get(step, 0) + 1
            a = _Act(step, k, ev.sequence, d.get("args"))
            acts.append(a)
            if name == "step.skipped":
                a.status, a.fired, a.ctx = "skipped", [], dict(ctx)
            else:
                by_run[ev.step_run_id or ""] = a
        elif (a := by_run.get(ev.step_run_id or "")) is not None:
            if name == "task.done":
                a.tasks.append(((d.get("task"), ev.iteration, ev.attempt or 1, ev.status), ev.sequence))
                if ev.status == "error":
                    a.error_at = (d.get("task"), code_frame(d.get("outcome")))
            if name == "task.done" and (ev.attempt or 1) > 1:
                a.retries += 1
                a.retry_seq = a.retry_seq or ev.sequence
            elif name in ("step.done", "step.failed"):
                a.status = "success" if name == "step.done" else "error"
                a.checksum = checksum(d.get("result")) if name == "step.done" else None
                a.error = d.get("error")
                a.result_seq = ev.sequence
            elif name == "next.evaluated":
                a.fired = sorted(str(f.get("step")) for f in d.get("fired") or () if isinstance(f, dict))
                a.decided, a.ctx = ev.sequence, dict(ctx)
    if not info:
        raise UnknownExecution("no events")
    return acts, info, ctx


def _differs(x: Any, y: Any) -> bool:
    return checksum(x) != checksum(y)


def _changed_keys(x: dict[str, Any], y: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        k: {"a": x.get(k), "b": y.get(k)} for k in sorted(x.keys() | y.keys()) if _differs(x.get(k), y.get(k))
    }


def diff(events_a: Iterable[Event], events_b: Iterable[Event], *, when: dict[str, list[str | None]] | None = None,
         changed: dict[str, list[str]] | None = None) -> dict[str, Any]:  # fmt: skip
    """The first divergence of B from A (None when they agree), and what differed around it.
    ``when``: step -> its arcs' conditions (from the playbook), ``changed``: steps added /
    removed / changed between the two playbook versions (explain_playbook.changed_steps)."""
    acts_a, info_a, _ = activations(events_a)
    acts_b, info_b, _ = activations(events_b)
    index_b = {(x.step, x.k): x for x in acts_b}
    matched_b: set[tuple[str, int]] = set()
    first: dict[str, Any] | None = None
    compared = 0
    for a in acts_a:
        b = index_b.get((a.step, a.k))
        if b is None:
            first = _divergence("arc", a, None, info_a, info_b, when)
            first["why"] = f"A ran {a.step} (activation {a.k}); B never did"
            break
        matched_b.add((a.step, a.k))
        compared += 1
        found = _first_difference(a, b)
        if found is not None:
            first = _divergence(found[0], a, b, info_a, info_b, when)
            first["a_sequence"], first["b_sequence"] = found[1], found[2]
            if found[3]:
                first["why"] = f"{a.step} (activation {a.k}): {found[3]}"
            break
    if first is None:
        extra = next((x for x in acts_b if (x.step, x.k) not in matched_b), None)
        if extra is not None:
            first = _divergence("arc", None, extra, info_a, info_b, when)
            first["why"] = f"B ran {extra.step} (activation {extra.k}); A never did"
    same_playbook = info_a.get("playbook") == info_b.get("playbook")
    return {
        "a": _info(info_a, acts_a), "b": _info(info_b, acts_b), "same_playbook": same_playbook,
        "compared_activations": compared, "diverged": first is not None, "first": first,
        "steps_changed": changed,
        "steps_only_in": {"a": sorted({x.step for x in acts_a} - {x.step for x in acts_b}),
                          "b": sorted({x.step for x in acts_b} - {x.step for x in acts_a})},
        "workload_diff": _changed_keys(info_a.get("workload") or {}, info_b.get("workload") or {}),
    }  # fmt: skip


def _first_difference(a: _Act, b: _Act) -> tuple[str, int | None, int | None, str] | None:
    """The kind of the earliest differing event of two matched activations (A's log order), with the
    sequence of that event in each log (and for a task outcome, what differed)."""
    found: list[tuple[float, int, str, int | None, int | None, str]] = []
    for order, kind in enumerate(("arc", "retries", "status", "result")):  # at one event: a retry count first
        if kind == "status":
            xs, ys = a.outcomes(), b.outcomes()
            i = next((i for i, (x, y) in enumerate(zip(xs, ys, strict=False)) if x[0] != y[0]), None)
            if i is None and len(xs) != len(ys):
                i = min(len(xs), len(ys)) - 1  # one side has more task outcomes: the shorter's last differs
            if i is None:
                continue
            sa, sb = xs[i][1] or a.seq, ys[i][1] or b.seq
            x, y = xs[i][0], ys[i][0]
            what = (f"task {x[0]} {x[3]} in A, {y[0]} {y[3]} in B" if i < len(a.tasks) and i < len(b.tasks)
                    else "")  # fmt: skip
        elif a.value(kind) != b.value(kind):
            sa, sb, what = a.seq_of(kind), b.seq_of(kind), ""
        else:
            continue
        found.append((sa if sa is not None else float("inf"), order, kind, sa, sb, what))
    return min(found)[2:] if found else None


def _info(info: dict[str, Any], acts: list[_Act]) -> dict[str, Any]:
    return {"execution_id": info.get("execution_id"), "playbook": info.get("playbook"), "file": info.get("file"),
            "status": info.get("status"), "tenant": info.get("tenant"), "project": info.get("project"),
            "activations": len(acts)}  # fmt: skip


def _divergence(kind: str, a: _Act | None, b: _Act | None, info_a: dict[str, Any], info_b: dict[str, Any],
                when: dict[str, list[str | None]] | None) -> dict[str, Any]:  # fmt: skip
    x = a or b
    assert x is not None
    side = {"a": a, "b": b}
    out: dict[str, Any] = {
        "kind": kind, "step": x.step, "activation": x.k,
        **{f"{n}_value": (s.value(kind) if s else None) for n, s in side.items()},
        **{f"{n}_sequence": (s.seq_of(kind) if s else None) for n, s in side.items()},
        **{f"{n}_error": (s.error if s else None) for n, s in side.items()},
        **{f"{n}_error_at": (s.error_at if s and s.error else None) for n, s in side.items()},
        "when": (when or {}).get(x.step),
    }  # fmt: skip
    if kind == "arc" and a is not None and b is not None:
        out["why"] = f"{x.step} (activation {x.k}) fired {a.fired} in A, {b.fired} in B"
    elif a is not None and b is not None:
        out["why"] = f"{x.step} (activation {x.k}): {kind} {a.value(kind)!r} in A, {b.value(kind)!r} in B"
    # the context that decided it: what differs between the two at this point
    out["ctx_diff"] = _changed_keys(a.ctx if a else {}, b.ctx if b else {}) if a and b else {}
    out["args_diff"] = _changed_keys({"args": a.args}, {"args": b.args}) if a and b else {}
    out["workload_diff"] = _changed_keys(info_a.get("workload") or {}, info_b.get("workload") or {})
    out["ctx"] = {"a": a.ctx if a else None, "b": b.ctx if b else None}
    return out
