"""Find constructs of the retired DSL eras in a loaded playbook document.

``find_legacy_constructs(data)`` walks plain YAML data (dicts and lists, as the
loader builds them) and returns ``[(yaml_path, construct, hint)]`` for every
construct ``noetl-dagster migrate`` rewrites: v1 (``apiVersion: noetl.io/v1``,
step ``type:`` / ``task:`` / ``with:``, ``workbooks:``, ``end_loop``, ``save:``),
early v2 (``case:``, ``next:`` lists and names, ``sink:``, ``retry:``,
``vars:``, ``args:``, ``loop.mode``) and the short-lived ``eval:`` / ``expr:``
task policies. Paths are tuples of keys and list indexes, the same shape the
loader's source map uses, so a caller can turn each into a line number.

It is pure and cheap (one walk, no YAML library): the validator calls it on
every file. Constructs that are invalid in every era (an unknown kind, a
duplicate step) are the validator's business, not listed here.
"""

from __future__ import annotations

import re
from typing import Any

PathT = tuple[str | int, ...]
Finding = tuple[PathT, str, str]

MIGRATE = "run `noetl-dagster migrate FILE`"
# the tool kinds whose own `args` key is not an input mapping
ARGS_NATIVE_KINDS = frozenset(
    {"container", "shell", "script", "job", "k8s", "rhai"}
)  # rhai: its script variables
_VARS_REF = re.compile(r"(?:\{\{|\{%)[^}]*?(?<![\w.])vars\s*(?:\.|\[)")

_STEP_KEYS: dict[str, tuple[str, str]] = {
    "type": ("step `type:`", "becomes a `tool: {kind: ...}` task"),
    "task": ("`task:` workbook call", "becomes `tool: {kind: workbook, name: ...}`"),
    "with": ("step `with:`", "becomes the task `input`"),
    "case": ("`case:` rules", "become `next.arcs`, storage tasks and task `spec.policy.rules`"),
    "sink": ("step `sink:`", "becomes a storage task in the pipeline"),
    "save": ("`save:` block", "becomes a storage task in the pipeline"),
    "retry": ("step `retry:` block", "becomes a `do: retry` rule in the task's `spec.policy.rules`"),
    "vars": ("step `vars:`", "becomes step `set: {ctx.<name>: ...}`"),
    "end_loop": ("`end_loop` step", "the loop body folds into the loop step's pipeline"),
    "eval": ("`eval:` rules", "become `spec.policy.rules`"),
    "expr": ("`expr:`", "becomes a policy rule `when`"),
    "set_vars": ("`set_vars`", "becomes `set: {ctx.<name>}`"),
    "when": ("step `when`", "becomes `spec.policy.admit.rules`"),
}


def find_legacy_constructs(data: dict) -> list[Finding]:
    """Every legacy construct in a playbook document, in document order."""
    out: list[Finding] = []
    if not isinstance(data, dict):
        return out
    if data.get("apiVersion") in ("noetl.io/v1", "noetl/v1", "v1"):
        out.append(
            (
                ("apiVersion",),
                "apiVersion noetl.io/v1",
                f"{MIGRATE}: the v1 playbook is rewritten to noetl.io/v2",
            )
        )
    if not isinstance(data.get("metadata"), dict) and ("name" in data or "path" in data):
        key = "name" if "name" in data else "path"
        out.append(((key,), "root `name`/`path`", f"{MIGRATE}: they move under `metadata`"))
    if "vars" in data:
        out.append(
            (
                ("vars",),
                "root `vars:`",
                f"{MIGRATE}: initial values move to `workload`, reads to `ctx`/`workload`",
            )
        )
    if "workbooks" in data:
        out.append(
            (
                ("workbooks",),
                "root `workbooks:`",
                f"{MIGRATE}: renamed `workbook:` with `{{name, tool: {{kind}}}}` entries",
            )
        )
    for key in ("workbook", "workbooks"):
        entries = data.get(key)
        if isinstance(entries, list):
            for i, entry in enumerate(entries):
                if isinstance(entry, dict):
                    _workbook_entry(entry, (key, i), out)
    workflow = data.get("workflow")
    if isinstance(workflow, list):
        for i, step in enumerate(workflow):
            if isinstance(step, dict):
                _step(step, ("workflow", i), out)
    for key in ("workload", "workbook", "workflow", "executor", "keychain"):
        if key in data:
            _vars_refs(data[key], (key,), out)
    return out


def _workbook_entry(entry: dict, path: PathT, out: list[Finding]) -> None:
    if "tool" not in entry and "type" in entry:
        out.append(
            (
                (*path, "type"),
                "workbook entry `type:`",
                f"{MIGRATE}: the entry becomes `{{name, tool: {{kind: ...}}}}`",
            )
        )
        if "with" in entry:
            out.append(((*path, "with"), "workbook entry `with:`", f"{MIGRATE}: becomes the tool `input`"))
    tool = entry.get("tool")
    if isinstance(tool, dict):
        _task(tool, (*path, "tool"), out)


def _step(step: dict, path: PathT, out: list[Finding]) -> None:
    for key, (what, becomes) in _STEP_KEYS.items():
        if key in step:
            out.append(((*path, key), what, f"{MIGRATE}: {becomes}"))
    if "result" in step and "end_loop" in step:
        out.append(((*path, "result"), "`end_loop` result", f"{MIGRATE}: becomes the end step's result"))
    loop = step.get("loop")
    if isinstance(loop, dict):
        for key in ("mode", "max_in_flight"):
            if key in loop:
                out.append(((*path, "loop", key), f"`loop.{key}`", f"{MIGRATE}: moves to `loop.spec.{key}`"))
    nxt = step.get("next")
    if isinstance(nxt, str):
        out.append(((*path, "next"), "`next:` step name", f"{MIGRATE}: becomes `next: {{spec, arcs}}`"))
    elif isinstance(nxt, list):
        out.append(((*path, "next"), "`next:` list", f"{MIGRATE}: becomes `next: {{spec, arcs}}`"))
    elif isinstance(nxt, dict):
        for j, arc in enumerate(nxt.get("arcs") or []):
            if isinstance(arc, dict):
                for key in ("then", "with"):
                    if key in arc:
                        out.append(((*path, "next", "arcs", j, key), f"arc `{key}:`", f"{MIGRATE}"))
    tool = step.get("tool")
    if isinstance(tool, str):
        out.append(
            (
                (*path, "tool"),
                "`tool: <kind>` name",
                f"{MIGRATE}: becomes `tool: {{kind: ...}}` with the step's tool keys",
            )
        )
    if isinstance(tool, dict):
        if "kind" in tool:
            _task(tool, (*path, "tool"), out)
        elif len(tool) == 1 and isinstance(next(iter(tool.values())), dict):
            ((label, body),) = tool.items()
            _task(body, (*path, "tool", label), out)
    elif isinstance(tool, list):
        for j, item in enumerate(tool):
            if not isinstance(item, dict):
                continue
            if "kind" in item:
                _task(item, (*path, "tool", j), out)
            elif len(item) == 1 and isinstance(next(iter(item.values())), dict):
                ((label, body),) = item.items()
                _task(body, (*path, "tool", j, label), out)


def _task(task: dict, path: PathT, out: list[Finding]) -> None:
    if "kind" not in task and "type" in task:
        out.append(((*path, "type"), "task `type:`", f"{MIGRATE}: becomes `kind:`"))
    if isinstance(task.get("with"), dict):
        out.append(((*path, "with"), "task `with:`", f"{MIGRATE}: becomes `input`"))
    if isinstance(task.get("retry"), dict):
        out.append(((*path, "retry"), "task `retry:` block", f"{MIGRATE}: becomes a `do: retry` policy rule"))
    for key in ("sink", "save"):
        if isinstance(task.get(key), dict):
            out.append(((*path, key), f"task `{key}:`", f"{MIGRATE}: becomes a storage task"))
    if "eval" in task:
        out.append(((*path, "eval"), "`eval:` rules", f"{MIGRATE}: become `spec.policy.rules`"))
    spec = task.get("spec")
    policy = spec.get("policy") if isinstance(spec, dict) else None
    rules = policy.get("rules") if isinstance(policy, dict) else None
    if isinstance(rules, list):
        for j, rule in enumerate(rules):
            if not isinstance(rule, dict):
                continue
            body = rule.get("else") if isinstance(rule.get("else"), dict) else rule
            then = body.get("then", body) if isinstance(body, dict) else None
            if isinstance(then, dict) and "set_vars" in then:
                out.append(
                    (
                        (*path, "spec", "policy", "rules", j),
                        "`set_vars`",
                        f"{MIGRATE}: becomes `set: {{ctx.*}}`",
                    )
                )
            if "expr" in rule:
                out.append(
                    ((*path, "spec", "policy", "rules", j, "expr"), "`expr:`", f"{MIGRATE}: becomes `when`")
                )


def _vars_refs(value: Any, path: PathT, out: list[Finding]) -> None:
    """Templates reading ``vars.<name>`` (the retired variable store)."""
    if isinstance(value, str):
        if ("{{" in value or "{%" in value) and _VARS_REF.search(value):
            out.append(
                (path, "`vars.` reference", f"{MIGRATE}: reads become `ctx.<name>` / `workload.<name>`")
            )
    elif isinstance(value, dict):
        for k, v in value.items():
            if k in ("code", "code_b64", "code_base64"):  # code is never rendered
                continue
            _vars_refs(v, (*path, k), out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _vars_refs(v, (*path, i), out)


# -- deprecated spellings (NoETL's renames): valid, reported as warnings ------------------------

OBJECT_TIER = "output store kind `object`"
_OUTCOME_REF = re.compile(r"(?<![\w.'\"])outcome(?=\s*[.\[])")
_TEMPLATE = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.S)


def uses_outcome(source: Any) -> bool:
    """A template reading ``outcome.<...>`` (renamed ``output`` in policies, arcs and step ``set``)."""
    return isinstance(source, str) and any(
        _OUTCOME_REF.search(m.group(0)) for m in _TEMPLATE.finditer(source)
    )


ARC_ARGS = "arc `args`"


def find_deprecated_spellings(data: Any) -> list[Finding]:
    """Old spellings of keys NoETL renamed, which this engine still runs: step/task ``args`` ->
    ``input``, arc ``args`` -> ``set: {step.*}`` (the entered step's token), ``set_ctx`` / ``set_iter`` -> ``set: {ctx.*, iter.*}``, ``outcome`` -> ``output`` in
    policy rules, arcs and step ``set``. ``(path, old, new)``; ``migrate`` rewrites each."""
    out: list[Finding] = []
    if not isinstance(data, dict):
        return out
    for key in ("workbook", "workbooks"):
        for i, entry in enumerate(data.get(key) or [] if isinstance(data.get(key), list) else []):
            if isinstance(entry, dict) and isinstance(entry.get("tool"), dict):
                _dep_task(entry["tool"], (key, i, "tool"), out)
    for i, step in enumerate(data.get("workflow") or [] if isinstance(data.get("workflow"), list) else []):
        if not isinstance(step, dict):
            continue
        path: PathT = ("workflow", i)
        if isinstance(step.get("args"), dict):
            out.append(((*path, "args"), "step `args`", "`input`"))
        _dep_set(step, path, out)
        nxt = step.get("next")
        for j, arc in enumerate(nxt.get("arcs") or [] if isinstance(nxt, dict) else []):
            if isinstance(arc, dict):
                if isinstance(arc.get("args"), dict):  # NoETL's schema rejects it: "arcs must use set"
                    out.append(((*path, "next", "arcs", j, "args"), ARC_ARGS, "`set: {step.<key>: ...}`"))
                _dep_outcome(arc.get("when"), (*path, "next", "arcs", j, "when"), out)
                _dep_outcome(arc.get("set"), (*path, "next", "arcs", j, "set"), out)
        tool = step.get("tool")
        items = [tool] if isinstance(tool, dict) else tool if isinstance(tool, list) else []
        for j, item in enumerate(items):
            if not isinstance(item, dict):
                continue
            ip: PathT = (*path, "tool") if isinstance(tool, dict) else (*path, "tool", j)
            if "kind" not in item and len(item) == 1 and isinstance(next(iter(item.values())), dict):
                ((label, item),) = item.items()
                ip = (*ip, label)
            _dep_task(item, ip, out)
    return out


def _dep_set(holder: dict, path: PathT, out: list[Finding]) -> None:
    for key, ns in (("set_ctx", "ctx"), ("set_iter", "iter")):
        if key in holder:
            out.append(((*path, key), f"`{key}`", f"`set: {{{ns}.<key>: ...}}`"))
    for key in ("set", "set_ctx", "set_iter"):
        _dep_outcome(holder.get(key), (*path, key), out)


def _dep_outcome(value: Any, path: PathT, out: list[Finding]) -> None:
    if isinstance(value, str):
        if uses_outcome(value):
            out.append((path, "template variable `outcome`", "`output`"))
    elif isinstance(value, dict):
        for k, v in value.items():
            _dep_outcome(v, (*path, k), out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _dep_outcome(v, (*path, i), out)


def _dep_task(task: dict, path: PathT, out: list[Finding]) -> None:
    if isinstance(task.get("args"), dict) and task.get("kind") not in ARGS_NATIVE_KINDS:
        out.append(((*path, "args"), "task `args`", "`input`"))
    output = task.get("output")
    store = output.get("store") if isinstance(output, dict) else None
    if isinstance(store, dict) and store.get("kind") == "object":  # NoETL's OutputStore: `object` -> `disk`
        out.append(((*path, "output", "store", "kind"), OBJECT_TIER, "`disk`"))
    spec = task.get("spec")
    policy = spec.get("policy") if isinstance(spec, dict) else None
    rules = policy.get("rules") if isinstance(policy, dict) else None
    for j, rule in enumerate(rules if isinstance(rules, list) else []):
        if not isinstance(rule, dict):
            continue
        rp: PathT = (*path, "spec", "policy", "rules", j)
        _dep_outcome(rule.get("when"), (*rp, "when"), out)
        if isinstance(rule.get("else"), dict):
            body, bp = rule["else"], (*rp, "else")
        else:
            body, bp = rule, rp
        then = body.get("then") if isinstance(body, dict) else None
        if isinstance(then, dict):
            _dep_set(then, (*bp, "then"), out)
