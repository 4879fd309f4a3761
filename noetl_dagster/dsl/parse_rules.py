"""The parts of a step that are rules: `set` and `input` blocks, policy rules and their `then`, loops and cursor loops."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from noetl_dagster.dsl.model import (
    Cursor,
    FramePolicy,
    Loop,
    PolicyRule,
    RuleThen,
    SetBlock,
    is_template,
)
from noetl_dagster.dsl.parse_context import (
    BACKOFFS,
    DIRECTIVES,
    MAX_RETRY_ATTEMPTS,
    MAX_RETRY_DELAY,
    MIGRATE_HINT,
    ParseContext,
)
from noetl_dagster.dsl.source import PathT


def split_set(ctx: ParseContext, raw: Any, path: PathT) -> SetBlock:
    """``set: {ctx.x, iter.y, step.z, bare}`` (runtime dialect) -> SetBlock."""
    if raw is None:
        return SetBlock()
    if not isinstance(raw, dict):
        ctx.err(path, "set-shape", "`set` must be a mapping of `ctx.<key>` / `iter.<key>` to values")
        return SetBlock()
    out = SetBlock()
    for k, v in raw.items():
        key = str(k)
        if key == "workload" or key.startswith("workload."):
            ctx.err(
                (*path, key),
                "set-workload",
                f"`set: {{{key}: …}}`: the workload is immutable; write ctx.<key> instead",
            )
            continue
        if key.startswith("iter."):
            out.iter[key[5:]] = v
        elif key.startswith(("ctx.", "step.")):
            out.ctx[key.split(".", 1)[1]] = v
        else:
            out.ctx[key] = v
    return out


def set_with_legacy(ctx: ParseContext, raw: dict[str, Any], path: PathT) -> SetBlock:
    """``set`` plus the deprecated ``set_ctx`` / ``set_iter`` spellings of the same writes."""
    sb = split_set(ctx, raw.get("set"), (*path, "set"))
    for key in ("set_ctx", "set_iter"):
        if key in raw:
            if not isinstance(raw[key], dict):
                ctx.err((*path, key), "set-shape", f"`{key}` must be a mapping")
            else:
                (sb.ctx if key == "set_ctx" else sb.iter).update(raw[key])
    return sb


def input_with_legacy(ctx: ParseContext, raw: dict[str, Any], path: PathT, what: str) -> Any:
    """``input``, or its deprecated spelling ``args`` (never both)."""
    if "args" in raw and "input" in raw:
        ctx.err(
            (*path, "args"),
            "input-and-args",
            f"{what} has both `input` and its old spelling `args`; keep `input`",
        )
    return raw["input"] if "input" in raw else raw.get("args")


def parse_policy_rules(
    ctx: ParseContext, raw: Any, path: PathT, task_labels: set[str] | None
) -> list[PolicyRule] | None:
    if not isinstance(raw, dict) or "rules" not in raw:
        ctx.err(path, "policy-shape", "a task policy must be an object with `rules` (a list)")
        return None
    rules_raw = raw["rules"]
    if not isinstance(rules_raw, list):
        ctx.err((*path, "rules"), "policy-shape", "`rules` must be a list")
        return None
    rules: list[PolicyRule] = []
    for i, r in enumerate(rules_raw):
        rp = (*path, "rules", i)
        if not isinstance(r, dict):
            ctx.err(rp, "policy-shape", "a rule must be `{when, then}` or `{else: {then}}`")
            continue
        if "else" in r:
            body = r["else"]
            when = None
            if body is None and "then" in r:  # `- else:` with `then:` mis-indented beside it
                then_raw, tp = r["then"], (*rp, "then")
            else:
                then_raw = body.get("then", body) if isinstance(body, dict) else body
                tp = (*rp, "else", "then") if isinstance(body, dict) and "then" in body else (*rp, "else")
        elif "then" in r:
            when = r.get("when", True)
            if not isinstance(when, (str, bool)):
                when = str(when)
            then_raw = r["then"]
            tp = (*rp, "then")
        else:
            ctx.err(rp, "policy-shape", "a rule needs `then` (or is `else: {then: ...}`)")
            continue
        then = _parse_then(ctx, then_raw, tp, task_labels)
        if then is not None:
            rules.append(PolicyRule(when=when, then=then))
    return rules


def _parse_then(ctx: ParseContext, raw: Any, path: PathT, task_labels: set[str] | None) -> RuleThen | None:
    if not isinstance(raw, dict):
        ctx.err(path, "policy-shape", "`then` must be a mapping with `do`")
        return None
    do = raw.get("do", "continue")
    if not isinstance(do, str) or do not in DIRECTIVES:
        ctx.err(
            (*path, "do"), "policy-directive", f"unknown directive {do!r}; use one of {sorted(DIRECTIVES)}"
        )
        return None
    backoff = raw.get("backoff")
    if backoff is not None and (not isinstance(backoff, str) or backoff not in BACKOFFS):
        ctx.err(
            (*path, "backoff"),
            "policy-backoff",
            f"unknown backoff {backoff!r}; use one of {sorted(BACKOFFS)}",
        )
        backoff = None
    to = raw.get("to")
    if do == "jump":
        if not to:
            ctx.err(path, "policy-jump", "`do: jump` needs `to` (a task label or `previous`)")
        elif not isinstance(to, str) or (
            task_labels is not None and to != "previous" and to not in task_labels
        ):
            ctx.err((*path, "to"), "policy-jump", f"jump target {to!r} is not a task of this pipeline")
    sb = set_with_legacy(ctx, raw, path)
    attempts = raw.get("attempts", raw.get("max_attempts"))
    delay = raw.get("delay")
    if (
        attempts is not None
        and not isinstance(attempts, str)
        and (
            not isinstance(attempts, int)
            or isinstance(attempts, bool)
            or not 1 <= attempts <= MAX_RETRY_ATTEMPTS
        )
    ):
        ctx.err(
            (*path, "attempts"),
            "policy-attempts",
            f"`attempts` must be an integer 1..{MAX_RETRY_ATTEMPTS} or a template",
        )
        attempts = None
    if isinstance(delay, str) and not is_template(delay):
        try:
            delay = float(delay)  # `1e308` is a string to YAML 1.1
        except ValueError:
            pass
    if (
        delay is not None
        and not isinstance(delay, str)
        and (
            not isinstance(delay, (int, float))
            or isinstance(delay, bool)
            or not 0 <= delay <= MAX_RETRY_DELAY
        )
    ):
        ctx.err(
            (*path, "delay"), "policy-delay", f"`delay` must be 0..{MAX_RETRY_DELAY} seconds or a template"
        )
        delay = None
    if to is not None and not isinstance(to, str):
        to = None
    return RuleThen(do=do, attempts=attempts, backoff=backoff, delay=delay, to=to, set=sb)


def parse_loop(ctx: ParseContext, raw: Any, path: PathT) -> Loop | None:
    if not isinstance(raw, dict):
        ctx.err(path, "loop-shape", "`loop` must be a mapping with `in` and `iterator`")
        return None
    spec = raw.get("spec") or {}
    if not isinstance(spec, dict):
        ctx.err((*path, "spec"), "loop-shape", "`loop.spec` must be a mapping")
        spec = {}
    if "cursor" in raw:
        return _parse_cursor_loop(ctx, raw, spec, path)
    if "in" not in raw or "iterator" not in raw:
        missing = [k for k in ("in", "iterator") if k not in raw]
        ctx.err(path, "loop-in-iterator", f"a loop needs both `in` and `iterator`; missing {missing}")
        return None
    mode = spec.get("mode", raw.get("mode", "sequential"))
    if "mode" in raw and "mode" not in spec:
        ctx.err(
            (*path, "mode"), "legacy-construct", f"`loop.mode` belongs under `loop.spec.mode`; {MIGRATE_HINT}"
        )
    if mode == "cursor":
        ctx.err(
            (*path, "spec", "mode"),
            "loop-mode",
            "`spec.mode: cursor` needs a `loop.cursor` source, not `loop.in`",
        )
        return None
    if mode not in ("sequential", "parallel"):
        ctx.err((*path, "spec", "mode"), "loop-mode", f"loop mode {mode!r} is not sequential or parallel")
        return None
    if not isinstance(raw["iterator"], str) or not raw["iterator"].isidentifier():
        ctx.err((*path, "iterator"), "loop-in-iterator", "`iterator` must be a plain name")
        return None
    policy = spec.get("policy") or {}
    exec_ = policy.get("exec") if isinstance(policy, dict) else None
    if exec_ not in (None, "distributed", "local"):
        ctx.err(
            (*path, "spec", "policy", "exec"),
            "loop-exec",
            f"`exec` must be distributed or local, not {exec_!r}",
        )
        exec_ = None
    return Loop(
        **{"in": raw["in"]},
        iterator=raw["iterator"],
        mode=mode,
        max_in_flight=spec.get("max_in_flight"),
        exec=exec_,
        spec={k: v for k, v in spec.items() if k not in ("mode", "max_in_flight")},
    )


CURSOR_KINDS = ("postgres", "duckdb", "nats_stream")


def _parse_cursor_loop(
    ctx: ParseContext, raw: dict[str, Any], spec: dict[str, Any], path: PathT
) -> Loop | None:
    """``loop: {cursor: {kind, auth, claim, options}, iterator, spec: {mode: cursor, max_in_flight, frame}}``."""
    cur, cp = raw["cursor"], (*path, "cursor")
    n = len(ctx.issues)
    if "in" in raw:
        ctx.err(
            (*path, "in"),
            "loop-source",
            "a loop takes either `in` (a collection) or `cursor` (a pull source), not both",
        )
    if not isinstance(raw.get("iterator"), str) or not raw["iterator"].isidentifier():
        ctx.err((*path, "iterator"), "loop-in-iterator", "a cursor loop needs `iterator: <name>`")
    if spec.get("mode") != "cursor":
        ctx.err(
            (*path, "spec", "mode"),
            "loop-mode",
            f"`loop.cursor` needs `spec.mode: cursor` (got {spec.get('mode')!r})",
        )
    if not isinstance(cur, dict):
        ctx.err(cp, "cursor-shape", "`loop.cursor` must be a mapping with `kind` and `claim`")
        return None
    if cur.get("kind") not in CURSOR_KINDS:
        ctx.err(
            (*cp, "kind"),
            "cursor-kind",
            f"cursor kind {cur.get('kind')!r} is not one of {', '.join(CURSOR_KINDS)}",
        )
    if not isinstance(cur.get("claim"), str) or not cur["claim"].strip():
        ctx.err(
            (*cp, "claim"),
            "cursor-claim",
            "`cursor.claim` must be the claim statement (SQL) or subject (nats_stream)",
        )
    if not isinstance(cur.get("options", {}), dict):
        ctx.err((*cp, "options"), "cursor-shape", "`cursor.options` must be a mapping")
    unknown = sorted(set(cur) - {"kind", "auth", "claim", "options"})
    if unknown:
        ctx.err(
            (*cp, unknown[0]),
            "cursor-shape",
            f"unknown cursor key {unknown[0]!r} (kind, auth, claim, options)",
        )
    frame = spec.get("frame", spec.get("frame_policy")) or {}
    if not isinstance(frame, dict):
        ctx.err((*path, "spec", "frame"), "loop-frame", "`spec.frame` must be a mapping")
    else:
        try:  # templated values (`lease_seconds: "{{ workload.lease }}"`) are checked when rendered
            FramePolicy(**{k: v for k, v in frame.items() if not is_template(v)})
        except ValidationError as e:
            for err in e.errors()[:3]:
                ctx.err((*path, "spec", "frame", *err["loc"]), "loop-frame", err["msg"])
    if len(ctx.issues) > n:
        return None
    return Loop(
        iterator=raw["iterator"],
        mode="cursor",
        max_in_flight=spec.get("max_in_flight"),
        spec={k: v for k, v in spec.items() if k not in ("mode", "max_in_flight", "frame", "frame_policy")},
        cursor=Cursor(
            kind=cur["kind"], auth=cur.get("auth"), claim=cur["claim"], options=dict(cur.get("options") or {})
        ),
        frame=frame,
    )
