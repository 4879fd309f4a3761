"""Raw YAML data -> canonical :class:`Playbook`, with every validation rule.

One walk over the document both normalizes the two author dialects
(SEMANTICS.md §1) and collects every error at once, each with the file, the
YAML path, the line and the rule broken.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from noetl_dagster.dsl.executor_spec import check_executor, no_effect_keys
from noetl_dagster.dsl.kinds import (
    PURE_KINDS,
    PURE_WHEN_MARKED,
    UNOFFERED_KINDS,
    is_known,
    missing_extra,
    raw_keys,
    required_keys,
)
from noetl_dagster.dsl.legacy import ARGS_NATIVE_KINDS, find_legacy_constructs
from noetl_dagster.dsl.model import (
    AdmitRule,
    Arc,
    Executor,
    Metadata,
    Playbook,
    Router,
    Step,
    Task,
    WorkbookEntry,
    is_template,
)
from noetl_dagster.dsl.outputs import check_dagster_spec, parse_outputs
from noetl_dagster.dsl.parse_context import (  # re-exported: callers import these from dsl.parse
    API_VERSION,
    LEGACY_STEP_KEYS,
    MAX_RETRY_ATTEMPTS,
    MAX_RETRY_DELAY,
    MIGRATE_HINT,
    TASK_META_KEYS,
    TASK_SPEC_KNOBS,
    ParseContext,
    PlaybookInvalid,
    ValidationIssue,
)
from noetl_dagster.dsl.parse_rules import (
    input_with_legacy,
    parse_loop,
    parse_policy_rules,
    set_with_legacy,
    split_set,
)
from noetl_dagster.dsl.serialize import playbook_to_raw
from noetl_dagster.dsl.source import PathT, SourceMap, format_path
from noetl_dagster.dsl.templates import iter_template_strings, template_env
from noetl_dagster.dsl.upstream_kinds import iterator_body, playbooks_body

__all__ = [
    "API_VERSION",
    "LEGACY_STEP_KEYS",
    "MAX_RETRY_ATTEMPTS",
    "MAX_RETRY_DELAY",
    "PlaybookInvalid",
    "ValidationIssue",
    "check_playbook",
    "executor_warnings",
    "load_playbook_dict",
    "parse_playbook",
]


def _task_items(ctx: ParseContext, raw: Any, path: PathT) -> list[tuple[str | None, dict[str, Any], PathT]]:
    """Every accepted pipeline form -> [(label or None, body, path)]."""
    if isinstance(raw, dict):
        if "kind" in raw:
            return [(raw.get("name"), raw, path)]
        if len(raw) == 1:  # {label: {kind...}} written as a mapping
            ((label, body),) = raw.items()
            return [(str(label), body, (*path, label))]
        ctx.err(path, "tool-shape", "`tool` must be `{kind: ...}` or a list of tasks")
        return []
    if isinstance(raw, list):
        out = []
        for i, item in enumerate(raw):
            ip = (*path, i)
            if not isinstance(item, dict):
                ctx.err(ip, "tool-shape", "a task must be a mapping")
            elif "kind" in item:
                out.append((item.get("name"), item, ip))
            elif len(item) == 1 and isinstance(next(iter(item.values())), dict):
                ((label, body),) = item.items()
                out.append((str(label), body, (*ip, label)))
            else:
                ctx.err(ip, "tool-kind", "a task needs `kind` (or is `- <label>: {kind: ...}`)")
        return out
    ctx.err(path, "tool-shape", "`tool` must be a mapping or a list of tasks")
    return []


def _parse_task(
    ctx: ParseContext, label: str, body: dict[str, Any], path: PathT, labels: set[str]
) -> Task | None:
    kind = body.get("kind")
    if not isinstance(kind, str) or not kind:
        ctx.err(path, "tool-kind", "a task needs a `kind`")
        return None
    if kind in ("iterator", "playbooks") and not ctx.registered(kind):  # NoETL's kinds, as task loops here
        inner = iterator_body(ctx, body, path) if kind == "iterator" else playbooks_body(ctx, body, path)
        return None if inner is None else _parse_task(ctx, label, inner, path, labels)
    if kind in UNOFFERED_KINDS and not ctx.known_kind(kind):
        ctx.err(
            (*path, "kind"),
            "unoffered-tool-kind",
            f"tool kind {kind!r} is NoETL's, but this runtime does not offer it: {UNOFFERED_KINDS[kind]}",
        )
    elif not ctx.known_kind(kind):
        ctx.err((*path, "kind"), "unknown-tool-kind", f"tool kind {kind!r} is not recognized")
    elif ctx.check_kinds and (hint := missing_extra(kind)):
        ctx.err((*path, "kind"), "missing-extra", hint)
    if (
        kind == "rhai"
        and isinstance(body.get("code"), str)
        and "{{" not in body["code"]
        and "{%" not in body["code"]
    ):
        from noetl_dagster.dsl.rhai import RhaiError, parse  # noqa: PLC0415 - lark grammar, only for rhai tasks

        budget = body.get("max_operations")
        try:  # the parse counts against the script's operation budget, as at run time
            parse(
                body["code"], *([budget] if isinstance(budget, int) and not isinstance(budget, bool) else [])
            )
        except RhaiError as e:
            ctx.err((*path, "code"), e.kind.replace("_", "-"), f"script {e}")
    if "retry" in body and isinstance(body["retry"], dict):
        ctx.err((*path, "retry"), "legacy-construct",
                "task `retry:` blocks are legacy: NoETL's current runtime accepts the key but never retries on it, "
                f"so it is refused rather than silently ignored; retries are `spec.policy.rules` `do: retry`; {MIGRATE_HINT}")  # fmt: skip
    spec_raw = body.get("spec") or {}
    if not isinstance(spec_raw, dict):
        ctx.err((*path, "spec"), "tool-shape", "`spec` must be a mapping")
        spec_raw = {}
    config = {k: v for k, v in body.items() if k not in TASK_META_KEYS}
    if isinstance(body.get("args"), dict) and kind not in ARGS_NATIVE_KINDS:  # deprecated spelling of `input`
        config["input"] = input_with_legacy(ctx, body, path, "a task")
        config.pop("args")
    if kind == "workbook" and "name" in body:  # `name` names the workbook entry it calls
        config["name"] = body["name"]
    if ctx.check_kinds and ctx.known_kind(kind):
        spec_keys = set(body.get("spec") or {}) if isinstance(body.get("spec"), dict) else set()
        for key in required_keys(kind):  # the kind's typed config model (dsl/kinds, docs/tools.md)
            if key not in config and key not in spec_keys:
                ctx.err(
                    (*path, "kind"),
                    "tool-config",
                    f"kind {kind!r} needs `{key}` (its config model requires it)",
                )
    spec: dict[str, Any] = {}
    for k, v in spec_raw.items():
        if k in TASK_SPEC_KNOBS:
            spec[k] = v
        elif k == "input" and isinstance(v, dict) and isinstance(config.get("input"), dict):
            config["input"] = {**v, **config["input"]}
        else:
            config.setdefault(k, v)
    policy = None
    if "policy" in spec:
        policy = parse_policy_rules(ctx, spec.pop("policy"), (*path, "spec", "policy"), labels)
    loop = parse_loop(ctx, body["loop"], (*path, "loop")) if "loop" in body else None
    return Task(
        label=label,
        kind=kind,
        config=config,
        spec=spec,
        policy=policy,
        set=split_set(ctx, body.get("set"), (*path, "set")),
        loop=loop,
        pure=_pure(ctx, kind, body, path),
    )


def _pure(ctx: ParseContext, kind: str, body: dict[str, Any], path: PathT) -> bool:
    """``pure:`` of a task: a boolean, ``true`` only where it can hold (dsl/kinds.is_pure)."""
    if "pure" not in body:
        return False
    value = body["pure"]
    if not isinstance(value, bool):
        ctx.err((*path, "pure"), "task-pure", f"`pure` must be true or false, not {value!r}")
        return False
    if value and kind not in PURE_WHEN_MARKED and kind not in PURE_KINDS:
        marked = ", ".join(sorted(PURE_WHEN_MARKED))
        ctx.err((*path, "pure"), "task-pure", f"`pure: true` is for {marked} tasks whose code has no effect "
                f"outside the execution; kind {kind!r} has effects (it runs after a durability barrier)")  # fmt: skip
        return False
    return value


def _parse_pipeline(ctx: ParseContext, raw: Any, path: PathT) -> list[Task]:
    items = _task_items(ctx, raw, path)
    labels: list[str] = []
    for i, (label, _, ip) in enumerate(items):
        lab = str(label) if label else f"task_{i}"
        if lab in labels:
            ctx.err(ip, "duplicate-task", f"task label {lab!r} is used twice in this pipeline")
        labels.append(lab)
    label_set = set(labels)
    tasks = []
    for lab, (_, body, ip) in zip(labels, items, strict=True):
        t = _parse_task(ctx, lab, body, ip, label_set)
        if t is not None:
            tasks.append(t)
    return tasks


def _parse_router(ctx: ParseContext, raw: Any, path: PathT) -> Router | None:
    if isinstance(raw, (list, str)):
        ctx.err(
            path,
            "legacy-construct",
            f"`next` as a list or a name is legacy; use `next: {{spec, arcs}}`; {MIGRATE_HINT}",
        )
        return None
    if not isinstance(raw, dict):
        ctx.err(path, "next-shape", "`next` must be a router `{spec: {mode}, arcs: [...]}`")
        return None
    spec = raw.get("spec") or {}
    if not isinstance(spec, dict):
        ctx.err((*path, "spec"), "next-shape", "`next.spec` must be a mapping")
        spec = {}
    mode = spec.get("mode", "exclusive")
    if mode not in ("exclusive", "inclusive"):
        ctx.err((*path, "spec", "mode"), "next-mode", f"router mode {mode!r} is not exclusive or inclusive")
        mode = "exclusive"
    on_no_match = spec.get("on_no_match", "quiet")
    if on_no_match not in ("quiet", "complete"):
        # both end the branch without an error when no arc matches (docs/dsl.md)
        ctx.err(
            (*path, "spec", "on_no_match"),
            "next-on-no-match",
            f"`on_no_match` {on_no_match!r} is not quiet or complete",
        )
    unknown = sorted(str(k) for k in spec if k not in ("mode", "on_no_match"))
    if unknown:
        ctx.err(
            (*path, "spec", unknown[0]),
            "next-spec-key",
            f"unknown `next.spec` key(s) {unknown}: only mode and on_no_match",
        )
    arcs_raw = raw.get("arcs", [])
    if not isinstance(arcs_raw, list):
        ctx.err((*path, "arcs"), "next-shape", "`next.arcs` must be a list")
        arcs_raw = []
    arcs = []
    for i, a in enumerate(arcs_raw):
        ap = (*path, "arcs", i)
        if not isinstance(a, dict) or not isinstance(a.get("step"), str):
            ctx.err(ap, "next-shape", "an arc must be a mapping with `step`")
            continue
        if "then" in a:
            ctx.err((*ap, "then"), "legacy-construct", f"`when/then` routing is legacy; {MIGRATE_HINT}")
        args = a.get("args")
        if args is not None and not isinstance(args, dict):
            ctx.err((*ap, "args"), "next-shape", "arc `args` must be a mapping")
            args = None
        when = a.get("when")
        if when is not None and not isinstance(when, (str, bool)):
            when = str(when)
        raw_set = a.get("set")
        if isinstance(raw_set, dict) and any(str(k).startswith("step.") for k in raw_set):
            # upstream's arc `set: {step.<k>}` (which replaced arc `args`): the entered step's token
            step_keys = {str(k)[5:]: v for k, v in raw_set.items() if str(k).startswith("step.")}
            clash = sorted(set(step_keys) & set(args or {}))
            if clash:
                ctx.err((*ap, "set", f"step.{clash[0]}"), "arc-args-and-set",
                        f"arc writes {clash[0]!r} both in `args` and as `set: {{step.{clash[0]}}}`; keep the `set`")  # fmt: skip
            args = {**(args or {}), **step_keys}
            raw_set = {k: v for k, v in raw_set.items() if not str(k).startswith("step.")}
        arcs.append(
            Arc(
                step=a["step"],
                when=when,
                args=args,
                set=split_set(ctx, raw_set, (*ap, "set")),
                spec=a.get("spec") or {},
            )
        )
    return Router(mode=mode, arcs=arcs, spec={k: v for k, v in spec.items() if k != "mode"})


def _parse_admit(ctx: ParseContext, raw: Any, path: PathT) -> list[AdmitRule] | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("rules"), list):
        ctx.err(path, "admit-shape", "`spec.policy.admit` must be an object with `rules` (a list)")
        return None
    out = []
    for i, r in enumerate(raw["rules"]):
        rp = (*path, "rules", i)
        if isinstance(r, dict) and "else" in r:
            body = r["else"]
            then = body.get("then", body) if isinstance(body, dict) else None
            when = None
        elif isinstance(r, dict) and "then" in r:
            when, then = r.get("when", True), r["then"]
        else:
            ctx.err(
                rp, "admit-shape", "an admit rule is `{when, then: {allow}}` or `{else: {then: {allow}}}`"
            )
            continue
        if not isinstance(then, dict) or not isinstance(then.get("allow", True), bool):
            ctx.err(rp, "admit-shape", "`then` must be `{allow: true|false}`")
            continue
        out.append(
            AdmitRule(
                when=when if when is None or isinstance(when, (str, bool)) else str(when),
                allow=then.get("allow", True),
            )
        )
    return out


def _parse_step(ctx: ParseContext, raw: Any, path: PathT) -> Step | None:
    if not isinstance(raw, dict):
        ctx.err(path, "step-shape", "a step must be a mapping")
        return None
    name = raw.get("step")
    if not isinstance(name, str) or not name:
        ctx.err(path, "step-name", "a step needs `step: <name>`")
        return None
    if "when" in raw:
        ctx.err(
            (*path, "when"),
            "step-when",
            "a step must not have top-level `when`; use `spec.policy.admit.rules`",
        )
    for key, what in LEGACY_STEP_KEYS.items():
        if key in raw:
            ctx.err((*path, key), "legacy-construct", f"{what} is a legacy construct; {MIGRATE_HINT}")
    if "tool" not in raw and "next" not in raw:
        ctx.err(path, "step-tool-or-next", f"step {name!r} has neither `tool` nor `next` (NoETL's validator refuses it "
                "too: every step needs a tool); give it `tool: {kind: noop}`")  # fmt: skip
    spec = raw.get("spec") or {}
    if not isinstance(spec, dict):
        ctx.err((*path, "spec"), "step-shape", "step `spec` must be a mapping")
        spec = {}
    admit = None
    pol = spec.get("policy")
    if pol is not None:
        if not isinstance(pol, dict):
            ctx.err((*path, "spec", "policy"), "admit-shape", "step `spec.policy` must be a mapping")
        elif "admit" in pol:
            admit = _parse_admit(ctx, pol["admit"], (*path, "spec", "policy", "admit"))
        elif "rules" in pol:
            ctx.err(
                (*path, "spec", "policy"),
                "admit-shape",
                "step policy rules belong under `spec.policy.admit.rules`",
            )
    loop = parse_loop(ctx, raw["loop"], (*path, "loop")) if "loop" in raw else None
    tool = _parse_pipeline(ctx, raw["tool"], (*path, "tool")) if raw.get("tool") is not None else []
    nxt = _parse_router(ctx, raw["next"], (*path, "next")) if raw.get("next") is not None else None
    step_input = input_with_legacy(ctx, raw, path, f"step {name!r}") or {}
    if not isinstance(step_input, dict):
        ctx.err((*path, "input"), "step-shape", "step `input` must be a mapping")
        step_input = {}
    return Step(
        name=name,
        desc=raw.get("desc") if isinstance(raw.get("desc"), str) else None,
        spec={k: v for k, v in spec.items() if k != "policy"}
        | (
            {"policy": {k: v for k, v in pol.items() if k != "admit"}}
            if isinstance(pol, dict) and len(pol) > 1
            else {}
        ),
        admit=admit,
        loop=loop,
        tool=tool,
        input=step_input,
        next=nxt,
        set=set_with_legacy(ctx, raw, path),
        outputs=parse_outputs(ctx, raw["outputs"], (*path, "outputs"), ctx.sm.line)
        if raw.get("outputs") is not None
        else [],
        line=ctx.sm.line(path),
    )


_RAW_TEXT_KEYS = {"code", "code_b64", "code_base64", "cmds", "script"}


def _kinds_in(value: Any, out: set[str]) -> set[str]:
    if isinstance(value, dict):
        k = value.get("kind")
        if isinstance(k, str):
            out.add(k)
        for v in value.values():
            _kinds_in(v, out)
    elif isinstance(value, list):
        for v in value:
            _kinds_in(v, out)
    return out


def _kind_raw_keys(raw: Any) -> set[str]:
    """Config keys the document's tool kinds take verbatim (never rendered), e.g. python `code`."""
    out: set[str] = set()
    # the document's own `kind: Playbook` is no tool kind (asking for it would scan the entry points)
    body = {k: v for k, v in raw.items() if k != "kind"} if isinstance(raw, dict) else raw
    for k in _kinds_in(body, set()):
        if is_known(k):
            out |= raw_keys(k)
    return out


def _check_templates(ctx: ParseContext, raw: dict[str, Any]) -> None:
    env = template_env()
    raw_keys = _RAW_TEXT_KEYS | _kind_raw_keys(raw) if ctx.check_kinds else _RAW_TEXT_KEYS
    for path, source in iter_template_strings(raw):
        if any(part in raw_keys for part in path if isinstance(part, str)):
            continue
        msg = env.check_syntax(source)
        if msg:
            ctx.err(path, "template-syntax", f"template does not parse ({msg})")


def parse_playbook(
    raw: Any, *, source_map: SourceMap | None = None, source_file: str | None = None, check_kinds: bool = True
) -> tuple[Playbook | None, list[ValidationIssue]]:
    sm = source_map or SourceMap(source_file or "<memory>", {(): 1})
    ctx = ParseContext(sm, check_kinds)
    if not isinstance(raw, dict):
        ctx.err((), "not-a-playbook", "the document is not a mapping")
        return None, ctx.issues
    api = raw.get("apiVersion")
    kind = raw.get("kind")
    if kind != "Playbook":
        ctx.err(("kind",), "not-a-playbook", f"`kind` must be Playbook, not {kind!r}")
        return None, ctx.issues
    if api != API_VERSION:
        hint = f"; {MIGRATE_HINT}" if api in ("noetl.io/v1", "noetl.io/v10") else ""
        rule = "legacy-construct" if hint else "api-version"
        ctx.err(("apiVersion",), rule, f"`apiVersion` must be {API_VERSION}, not {api!r}{hint}")
    if "vars" in raw:
        ctx.err(
            ("vars",),
            "root-vars",
            f"a playbook must not have root-level `vars` (use `workload`); {MIGRATE_HINT}",
        )
    meta = raw.get("metadata")
    if not isinstance(meta, dict) or not meta.get("name") or not meta.get("path"):
        ctx.err(("metadata",), "metadata", "`metadata` must include `name` and `path`")
        meta = None
    wf = raw.get("workflow")
    if not isinstance(wf, list) or not wf:
        ctx.err(("workflow",), "workflow-required", "`workflow` must be a non-empty list of steps")
        wf = []
    workload = raw.get("workload") or {}
    if not isinstance(workload, dict):
        ctx.err(("workload",), "workload-shape", "`workload` must be a mapping")
        workload = {}
    keychain = raw.get("keychain") or []
    if not isinstance(keychain, list) or not all(isinstance(k, dict) and k.get("name") for k in keychain):
        ctx.err(("keychain",), "keychain-shape", "`keychain` must be a list of mappings with `name`")
        keychain = []
    executor_raw = raw.get("executor") or {}
    if not isinstance(executor_raw, dict):
        ctx.err(("executor",), "executor-shape", "`executor` must be a mapping")
        executor_raw = {}
    check_dagster_spec(ctx, executor_raw.get("spec"), workload)
    workbook: list[WorkbookEntry] = []
    wb_raw = raw.get("workbook") or []
    if isinstance(wb_raw, dict):  # {name: {tool}} shorthand
        wb_raw = [{"name": k, **(v if isinstance(v, dict) else {})} for k, v in wb_raw.items()]
    if not isinstance(wb_raw, list):
        ctx.err(("workbook",), "workbook-shape", "`workbook` must be a list of `{name, tool}`")
        wb_raw = []
    for i, w in enumerate(wb_raw):
        wp = ("workbook", i)
        if not isinstance(w, dict) or not w.get("name"):
            ctx.err(wp, "workbook-shape", "a workbook entry needs `name` and `tool`")
            continue
        body = w.get("tool")
        if body is None and "kind" in w:  # v1 style: the entry itself is the tool
            body = {k: v for k, v in w.items() if k not in ("name", "desc")}
        if not isinstance(body, dict):
            ctx.err(wp, "workbook-shape", "a workbook entry needs a `tool` mapping")
            continue
        extra = {"assert": w["assert"]} if "assert" in w else {}
        t = _parse_task(ctx, str(w["name"]), body, (*wp, "tool"), set())
        if t is not None:
            if extra:
                t.spec.setdefault("assert", extra["assert"])
            workbook.append(WorkbookEntry(name=str(w["name"]), tool=t, desc=w.get("desc")))

    steps: list[Step] = []
    seen: dict[str, int] = {}
    for i, s in enumerate(wf):
        st = _parse_step(ctx, s, ("workflow", i))
        if st is None:
            continue
        if st.name in seen:
            ctx.err(
                ("workflow", i, "step"),
                "duplicate-step",
                f"step {st.name!r} is already defined at workflow[{seen[st.name]}]",
            )
            continue
        seen[st.name] = i
        steps.append(st)
    names = set(seen)
    for i, s in enumerate(wf):
        if not isinstance(s, dict) or not isinstance(s.get("next"), dict):
            continue
        for j, a in enumerate(s["next"].get("arcs") or []):
            if isinstance(a, dict) and isinstance(a.get("step"), str) and a["step"] not in names:
                ctx.err(
                    ("workflow", i, "next", "arcs", j, "step"),
                    "unknown-arc-target",
                    f"arc targets missing step {a['step']!r}",
                )
    for i, s in enumerate(wf):  # workbook references
        if isinstance(s, dict):
            for _label, body, ip in (
                _task_items(ParseContext(sm, False), s.get("tool"), ("workflow", i, "tool"))
                if s.get("tool")
                else []
            ):
                if isinstance(body, dict) and body.get("kind") == "workbook":
                    ref = body.get("name") or (body.get("spec") or {}).get("name")
                    if ref and not any(w.name == ref for w in workbook) and not is_template(ref):
                        ctx.err(
                            (*ip, "name"), "unknown-workbook-entry", f"workbook entry {ref!r} is not defined"
                        )
    entry = (
        executor_raw.get("spec", {}).get("entry_step") if isinstance(executor_raw.get("spec"), dict) else None
    )
    if entry and (not isinstance(entry, str) or entry not in names):
        ctx.err(
            ("executor", "spec", "entry_step"), "unknown-entry-step", f"entry step {entry!r} is not defined"
        )
    check_executor(ctx, executor_raw, [st.name for st in steps], wf)
    _check_templates(ctx, raw)
    _legacy_issues(ctx, raw)
    if ctx.issues or meta is None:
        return None, ctx.issues
    try:
        pb = Playbook(
            apiVersion=api,
            metadata=Metadata(**meta),
            keychain=keychain,
            executor=Executor(**executor_raw),
            workload=workload,
            workflow=steps,
            workbook=workbook,
            source_file=source_file,
        )
    except ValidationError as e:  # pragma: no cover - the walk above should have caught it
        for err in e.errors():
            ctx.err(tuple(err["loc"]), "schema", err["msg"])
        return None, ctx.issues
    return pb, []


def executor_warnings(raw: Any, sm: SourceMap) -> list[ValidationIssue]:
    """``executor-no-effect`` / ``no-effect`` warnings: NoETL keys accepted without effect (dsl.executor_spec)."""
    return [ValidationIssue(sm.file, sm.line(path), format_path(path), "executor-no-effect" if path[0] == "executor" else "no-effect",
                            f"accepted, has no effect: {why}") for path, why in no_effect_keys(raw)]  # fmt: skip


def _legacy_issues(ctx: ParseContext, raw: dict[str, Any]) -> None:
    """Retired-era constructs the inline checks above did not already name (dsl.legacy lists them all)."""
    reported = {i.path for i in ctx.issues}
    for path, construct, hint in find_legacy_constructs(raw):
        fp = format_path(path)
        if fp in reported or any(r.startswith(fp + ".") for r in reported):
            continue
        reported.add(fp)
        ctx.err(path, "legacy-construct", f"{construct} is a legacy construct; {hint}")


def load_playbook_dict(
    raw: Any, source_file: str | None = None, source_map: SourceMap | None = None
) -> Playbook:
    pb, issues = parse_playbook(raw, source_map=source_map, source_file=source_file)
    if issues:
        raise PlaybookInvalid(issues)
    assert pb is not None
    return pb


def check_playbook(pb: Playbook) -> Playbook:
    """Validate a playbook built in Python with the same rules as a file; raise PlaybookInvalid."""
    from_model, issues = parse_playbook(playbook_to_raw(pb), source_file=pb.source_file)
    if issues:
        raise PlaybookInvalid(issues)
    return pb
