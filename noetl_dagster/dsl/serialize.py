"""Canonical :class:`Playbook` -> a standard-form document (YAML-ready)."""

from __future__ import annotations

from typing import Any

from noetl_dagster.dsl.model import Loop, Playbook, PolicyRule, SetBlock, Task


def _set_raw(sb: SetBlock) -> dict[str, Any]:
    return {**{f"ctx.{k}": v for k, v in sb.ctx.items()}, **{f"iter.{k}": v for k, v in sb.iter.items()}}


def _rules_raw(rules: list[PolicyRule]) -> list[dict[str, Any]]:
    out = []
    for r in rules:
        then: dict[str, Any] = {"do": r.then.do}
        for k in ("attempts", "backoff", "delay", "to"):
            v = getattr(r.then, k)
            if v is not None:
                then[k] = v
        if r.then.set.ctx:
            then["set_ctx"] = dict(r.then.set.ctx)
        if r.then.set.iter:
            then["set_iter"] = dict(r.then.set.iter)
        out.append({"else": {"then": then}} if r.is_else else {"when": r.when, "then": then})
    return out


def _loop_raw(lp: Loop) -> dict[str, Any]:
    spec: dict[str, Any] = {"mode": lp.mode, **lp.spec}
    if lp.max_in_flight is not None:
        spec["max_in_flight"] = lp.max_in_flight
    if lp.exec:
        spec["policy"] = {**(spec.get("policy") or {}), "exec": lp.exec}  # a copy: never write into the model
    if lp.cursor is not None:
        if lp.frame is not None:
            spec["frame"] = dict(lp.frame)
        return {"cursor": lp.cursor.model_dump(), "iterator": lp.iterator, "spec": spec}
    return {"in": lp.in_, "iterator": lp.iterator, "spec": spec}


def _task_raw(t: Task) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": t.kind, **t.config}
    spec = dict(t.spec)
    if t.policy is not None:
        spec["policy"] = {"rules": _rules_raw(t.policy)}
    if spec:
        body["spec"] = spec
    if t.set:
        body["set"] = _set_raw(t.set)
    if t.loop:
        body["loop"] = _loop_raw(t.loop)
    if t.pure:
        body["pure"] = True
    return body


def playbook_to_raw(pb: Playbook) -> dict[str, Any]:
    """Standard form: tasks as `- <label>: {kind: ...}`, rule writes as set_ctx / set_iter."""
    doc: dict[str, Any] = {
        "apiVersion": pb.api_version,
        "kind": "Playbook",
        "metadata": pb.metadata.model_dump(exclude_none=True),
    }
    if pb.keychain:
        doc["keychain"] = pb.keychain
    if pb.executor.spec or pb.executor.profile:
        doc["executor"] = pb.executor.model_dump(exclude_none=True)
    if pb.workload:
        doc["workload"] = pb.workload
    if pb.workbook:
        doc["workbook"] = [
            {"name": w.name, **({"desc": w.desc} if w.desc is not None else {}), "tool": _task_raw(w.tool)}
            for w in pb.workbook
        ]
    steps = []
    for s in pb.workflow:
        d: dict[str, Any] = {"step": s.name}
        if s.desc is not None:
            d["desc"] = s.desc
        spec = dict(s.spec)
        if s.admit is not None:
            rules = [
                {"else": {"then": {"allow": r.allow}}}
                if r.when is None
                else {"when": r.when, "then": {"allow": r.allow}}
                for r in s.admit
            ]
            spec["policy"] = {
                **(spec.get("policy") or {}),
                "admit": {"rules": rules},
            }  # a copy: never write into the model
        if spec:
            d["spec"] = spec
        if s.loop:
            d["loop"] = _loop_raw(s.loop)
        if s.input:
            d["input"] = s.input
        if s.tool:
            d["tool"] = [{t.label: _task_raw(t)} for t in s.tool]
        if s.set:
            d["set"] = _set_raw(s.set)
        if s.outputs:
            d["outputs"] = [
                o.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True, exclude={"line"})
                for o in s.outputs
            ]
        if s.next is not None:
            arcs = []
            for a in s.next.arcs:
                ad: dict[str, Any] = {"step": a.step}
                if a.when is not None:
                    ad["when"] = a.when
                if a.args == {}:
                    ad["args"] = {}  # an explicit empty payload (rare); other payloads are set: {step.*}
                if a.set or a.args:
                    ad["set"] = {
                        **(_set_raw(a.set) if a.set else {}),
                        **{f"step.{k}": v for k, v in (a.args or {}).items()},
                    }
                if a.spec:
                    ad["spec"] = a.spec
                arcs.append(ad)
            d["next"] = {"spec": {"mode": s.next.mode, **s.next.spec}, "arcs": arcs}
        steps.append(d)
    doc["workflow"] = steps
    return doc
