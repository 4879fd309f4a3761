"""``executor`` keys: which ones the engine implements, which it accepts without effect (warned),
and the rest (errors). Nothing under ``executor`` is silently ignored (issue 16.4).

NoETL's schema (noetl/core/dsl/playbook.schema.json, Executor / ExecutorSpecFull) has
``profile``, ``version``, ``requires`` and ``spec: {entry_step, final_step, no_next_is_error,
policy}``; this project adds ``spec.dagster``, ``spec.schedule``, ``spec.max_step_runs`` and
``spec.generated``.
"""

from __future__ import annotations

from typing import Any

from noetl_dagster.dsl.loader import PathT

EXECUTOR_KEYS = {"profile", "version", "requires", "spec"}
SPEC_IMPLEMENTED = {"entry_step", "final_step", "no_next_is_error", "dagster", "schedule", "max_step_runs", "generated"}
# accepted for NoETL compatibility and warned: they select NoETL server behaviour with no counterpart here
NO_EFFECT = {
    ("profile",): "the runtime profile (local/distributed) is chosen by the runner here",
    ("version",): "the runtime contract version is not checked",
    ("requires",): "capability requirements are not checked (validate checks tool kinds itself)",
    ("spec", "policy"): "executor-wide policy defaults (timeouts, reference_first results, limits) are not applied",
}


def check_executor(ctx: Any, executor: dict[str, Any], step_names: list[str], workflow: list[Any]) -> None:
    """Errors for ``executor`` (ctx is dsl.parse's collector; step_names in workflow order)."""
    for k in sorted(str(k) for k in executor if k not in EXECUTOR_KEYS):
        ctx.err(("executor", k), "executor-key", f"unknown `executor` key {k!r}; known: {sorted(EXECUTOR_KEYS)}")
    spec = executor.get("spec")
    if spec is None:
        return
    if not isinstance(spec, dict):
        ctx.err(("executor", "spec"), "executor-shape", "`executor.spec` must be a mapping")
        return
    known = SPEC_IMPLEMENTED | {"policy"}
    for k in sorted(str(k) for k in spec if k not in known):
        ctx.err(("executor", "spec", k), "executor-spec-key", f"unknown `executor.spec` key {k!r}; known: {sorted(known)}")
    nne = spec.get("no_next_is_error")
    if nne is not None and not isinstance(nne, bool):
        ctx.err(("executor", "spec", "no_next_is_error"), "no-next-is-error", "`no_next_is_error` must be true or false")
    final = spec.get("final_step")
    if final is None:
        return
    fp: PathT = ("executor", "spec", "final_step")
    if not isinstance(final, str) or final not in step_names:
        ctx.err(fp, "unknown-final-step", f"final step {final!r} is not defined")
        return
    entry = spec.get("entry_step") or ("start" if "start" in step_names else step_names[0])
    if final == entry:
        ctx.err(fp, "final-step-entry", f"final step {final!r} is also the entry step")
    for i, s in enumerate(workflow):
        if not isinstance(s, dict):
            continue
        if s.get("step") == final and s.get("next"):
            # it runs once, after everything else: there is nothing left to route to
            ctx.err(("workflow", i, "next"), "final-step-next", f"final step {final!r} cannot have `next`")
        nxt = s.get("next")
        arcs = nxt.get("arcs") if isinstance(nxt, dict) else None
        for j, a in enumerate(arcs if isinstance(arcs, list) else []):
            if isinstance(a, dict) and a.get("step") == final:
                ctx.err(("workflow", i, "next", "arcs", j, "step"), "final-step-routed",
                        f"final step {final!r} runs once after the workflow; an arc cannot route to it")  # fmt: skip


def no_effect_keys(raw: Any) -> list[tuple[PathT, str]]:
    """(path, why) per NoETL executor key this engine accepts but does not apply (warned by validate)."""
    ex = raw.get("executor") if isinstance(raw, dict) else None
    if not isinstance(ex, dict):
        return []
    out: list[tuple[PathT, str]] = []
    for path, why in NO_EFFECT.items():
        node: Any = ex
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            out.append((("executor", *path), why))
    return out


def final_step(pb: Any) -> str | None:
    value = pb.executor.spec.get("final_step") if pb.executor else None
    return value if isinstance(value, str) and value else None


def no_next_is_error(pb: Any) -> bool:
    return bool(pb.executor.spec.get("no_next_is_error")) if pb.executor else False
