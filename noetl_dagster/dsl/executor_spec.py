"""NoETL keys: ``executor`` keys: which ones the engine implements, which it accepts without effect (warned),
and the rest (errors). Nothing under ``executor`` is silently ignored (issue 16.4).

NoETL's schema (noetl/core/dsl/playbook.schema.json, Executor / ExecutorSpecFull) has
``profile``, ``version``, ``requires`` and ``spec: {entry_step, final_step, no_next_is_error,
policy}``; this project adds ``spec.dagster``, ``spec.schedule``, ``spec.max_step_runs``, ``spec.max_events``,
``spec.generated``, ``spec.isolation`` and the Kubernetes placement keys ``spec.profiles`` / ``spec.default_profile``. The step and task keys of NoETL's schema this engine keeps without an effect
are warned the same way (``no_effect_keys``; tests/engine/test_noetl_schema_keys walks the schema).
"""

from __future__ import annotations

from typing import Any

from noetl_dagster.dsl.source import PathT

EXECUTOR_KEYS = {"profile", "version", "requires", "spec"}
SPEC_IMPLEMENTED = {
    "entry_step",
    "final_step",
    "no_next_is_error",
    "dagster",
    "schedule",
    "max_step_runs",
    "generated",
    "max_events",  # events one execution may record (engine/recorder.py, docs/limits.md)
    "profiles",
    "default_profile",  # Kubernetes placement (translator/k8s.py, docs/deploy.md)
    "isolation",  # `sandbox`: tool code runs in the OS sandbox (tools/sandbox.py, docs/limits.md)
}
ISOLATION_VALUES = ("sandbox",)
# accepted for NoETL compatibility and warned: they select NoETL server behaviour with no counterpart here
NO_EFFECT = {
    ("profile",): "the runtime profile (local/distributed) is chosen by the runner here",
    ("version",): "the runtime contract version is not checked",
    ("requires",): "capability requirements are not checked (validate checks tool kinds itself)",
    (
        "spec",
        "policy",
    ): "executor-wide policy defaults (timeouts, reference_first results, limits) are not applied",
}


def check_executor(ctx: Any, executor: dict[str, Any], step_names: list[str], workflow: list[Any]) -> None:
    """Errors for ``executor`` (ctx is dsl.parse's collector; step_names in workflow order)."""
    for k in sorted(str(k) for k in executor if k not in EXECUTOR_KEYS):
        ctx.err(
            ("executor", k), "executor-key", f"unknown `executor` key {k!r}; known: {sorted(EXECUTOR_KEYS)}"
        )
    spec = executor.get("spec")
    if spec is None:
        return
    if not isinstance(spec, dict):
        ctx.err(("executor", "spec"), "executor-shape", "`executor.spec` must be a mapping")
        return
    known = SPEC_IMPLEMENTED | {"policy"}
    for k in sorted(str(k) for k in spec if k not in known):
        ctx.err(
            ("executor", "spec", k),
            "executor-spec-key",
            f"unknown `executor.spec` key {k!r}; known: {sorted(known)}",
        )
    iso = spec.get("isolation")
    if iso is not None and iso not in ISOLATION_VALUES:
        ctx.err(("executor", "spec", "isolation"), "executor-isolation",
                f"`isolation` must be one of {list(ISOLATION_VALUES)}, got {iso!r}")  # fmt: skip
    nne = spec.get("no_next_is_error")
    if nne is not None and not isinstance(nne, bool):
        ctx.err(
            ("executor", "spec", "no_next_is_error"),
            "no-next-is-error",
            "`no_next_is_error` must be true or false",
        )
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


# NoETL step and task keys (playbook.schema.json Step/StepPolicy/Arc, ToolSpec/TaskPolicy) kept
# for compatibility without an effect here; each is warned where it appears
STEP_NO_EFFECT = {
    ("spec", "timeout"): "a step timeout is not enforced (a task's own `timeout` is its tool's)",
    ("spec", "policy", "lifecycle"): "step lifecycle policy is NoETL server behaviour",
    ("spec", "policy", "failure"): "step failure policy is not applied; route failures with `next` arcs",
    ("spec", "policy", "emit"): "custom event emission is not supported",
    ("spec", "policy", "admit", "mode"): "admission rules are always first-match",
    **{
        (
            "loop",
            "spec",
            "frame",
            k,
        ): f"cursor frame `{k}` is not applied (frames are bounded by max_rows and the lease)"
        for k in ("max_seconds", "max_bytes", "verify_ipc", "retry_mode")
    },
}
ARC_NO_EFFECT = {("spec",): "arc `spec` is not used"}
TASK_NO_EFFECT = {
    ("spec", "timeout"): "a task `spec.timeout` is enforced only for python with `isolation: process`",
    ("spec", "policy", "mode"): "task policy rules are always first-match",
    ("spec", "policy", "on_unmatched"): "an unmatched task policy continues on success and fails on error",
    ("spec", "policy", "before"): "task policy before-hooks are not run",
    ("spec", "policy", "after"): "task policy after-hooks are not run",
    ("spec", "policy", "finally"): "task policy finally-hooks are not run",
    (
        "output",
    ): "the tool `output` storage policy is not applied; results are offloaded by the engine's own rules",
}


def _found(node: Any, path: PathT) -> bool:
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _tasks(tool: Any, path: PathT) -> list[tuple[Any, PathT]]:
    if isinstance(tool, dict) and "kind" in tool:
        return [(tool, path)]
    out: list[tuple[Any, PathT]] = []
    for i, item in enumerate(tool if isinstance(tool, list) else []):
        if isinstance(item, dict) and "kind" not in item and len(item) == 1:  # label map `- name: {kind}`
            ((label, body),) = item.items()
            out.append((body, (*path, i, label)))
        elif isinstance(item, dict):
            out.append((item, (*path, i)))
    return out


def no_effect_keys(raw: Any) -> list[tuple[PathT, str]]:
    """(path, why) per NoETL key this engine accepts but does not apply (warned by validate)."""
    if not isinstance(raw, dict):
        return []
    out: list[tuple[PathT, str]] = []
    ex = raw.get("executor")
    # executor.profile names a Kubernetes placement profile when spec.profiles defines it (docs/deploy.md)
    spec = ex.get("spec") if isinstance(ex, dict) else None
    placement = (
        isinstance(spec, dict)
        and isinstance(spec.get("profiles"), dict)
        and ex.get("profile") in spec["profiles"]
    )
    out += [
        (("executor", *p), why)
        for p, why in NO_EFFECT.items()
        if _found(ex, p) and not (p == ("profile",) and placement)
    ]
    tasks: list[tuple[Any, PathT]] = []
    for i, w in enumerate(raw.get("workbook") if isinstance(raw.get("workbook"), list) else []):
        if isinstance(w, dict):
            tasks += _tasks(w.get("tool"), ("workbook", i, "tool"))
    for i, s in enumerate(raw.get("workflow") if isinstance(raw.get("workflow"), list) else []):
        if not isinstance(s, dict):
            continue
        out += [(("workflow", i, *p), why) for p, why in STEP_NO_EFFECT.items() if _found(s, p)]
        nxt = s.get("next")
        arcs = nxt.get("arcs") if isinstance(nxt, dict) else None
        for j, a in enumerate(arcs if isinstance(arcs, list) else []):
            out += [
                (("workflow", i, "next", "arcs", j, *p), why)
                for p, why in ARC_NO_EFFECT.items()
                if _found(a, p)
            ]
        tasks += _tasks(s.get("tool"), ("workflow", i, "tool"))
    for body, tp in tasks:
        out += [((*tp, *p), why) for p, why in TASK_NO_EFFECT.items() if _found(body, p)]
    return out


def final_step(pb: Any) -> str | None:
    value = pb.executor.spec.get("final_step") if pb.executor else None
    return value if isinstance(value, str) and value else None


def no_next_is_error(pb: Any) -> bool:
    return bool(pb.executor.spec.get("no_next_is_error")) if pb.executor else False
