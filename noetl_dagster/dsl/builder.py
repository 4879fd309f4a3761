"""Build playbooks in Python: a typed builder that yields the same validated model as YAML.

The builder reads like the DSL::

    from noetl_dagster.dsl.builder import arc, http, loop, playbook, python, when

    pb = (
        playbook("fetch_all", path="examples/fetch_all")
        .workload(base="https://api.example.com", ids=[1, 2, 3])
        .step("start", next=["fetch"])
        .step(
            "fetch",
            loop=loop("{{ workload.ids }}", "id", mode="parallel"),
            tool=http("GET", "{{ workload.base }}/items/{{ id }}",
                      policy=[when("{{ outcome.status == 'error' }}", "retry", attempts=3, delay=0.5)]),
            next=[arc("end", when="{{ event.name == 'loop.done' }}")],
        )
        .step("end", tool=python("result = {'n': len(fetch['results'])}"))
    )
    model = pb.build()        # the canonical noetl_dagster.dsl.model.Playbook, validated
    text = pb.to_yaml()       # the standard form; parsing it gives back exactly ``model``

Every element records the file and line of the builder call that added it;
:meth:`PlaybookBuilder.build` runs the same validation as a YAML file
(:func:`~noetl_dagster.dsl.parse.parse_playbook`, through the standard-form
document the builder writes) and reports each issue at the call that caused it
(:class:`BuilderInvalid`, a :class:`~noetl_dagster.dsl.parse.PlaybookInvalid`).

:func:`canonical_yaml` and :func:`playbook_id` give a playbook's identity: the
sha256 of its canonical YAML (keys sorted), the same however it was written.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import yaml

from noetl_dagster.dsl.model import Backoff, Directive, Playbook
from noetl_dagster.dsl.parse import PlaybookInvalid, ValidationIssue, parse_playbook
from noetl_dagster.dsl.serialize import playbook_to_raw
from noetl_dagster.dsl.source import PathT, format_path

Where = tuple[str, int]  # (file, line) of a builder call
LoopMode = Literal["sequential", "parallel"]
RouteMode = Literal["exclusive", "inclusive"]
_MISSING: Any = object()


def _caller() -> Where:
    """The first frame outside this module: the user's builder call."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename == __file__:
        f = f.f_back  # type: ignore[assignment]
    if f is None:  # pragma: no cover - always called from somewhere
        return ("<unknown>", 0)
    return (f.f_code.co_filename, f.f_lineno)


def _where_text(w: Where) -> str:
    return f"{w[0]}:{w[1]}"


# -- task policy -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One ``spec.policy.rules`` entry; ``when=None`` is the ``else`` rule."""

    when: str | bool | None
    do: Directive = "continue"
    attempts: int | str | None = None
    backoff: Backoff | None = None
    delay: float | str | None = None
    to: str | None = None
    set_ctx: Mapping[str, Any] | None = None
    set_iter: Mapping[str, Any] | None = None
    where: Where = ("<unknown>", 0)

    def raw(self) -> dict[str, Any]:
        then: dict[str, Any] = {"do": self.do}
        for k in ("attempts", "backoff", "delay", "to"):
            v = getattr(self, k)
            if v is not None:
                then[k] = v
        if self.set_ctx:
            then["set_ctx"] = dict(self.set_ctx)
        if self.set_iter:
            then["set_iter"] = dict(self.set_iter)
        return {"else": {"then": then}} if self.when is None else {"when": self.when, "then": then}


def when(
    condition: str | bool,
    do: Directive = "continue",
    *,
    attempts: int | str | None = None,
    backoff: Backoff | None = None,
    delay: float | str | None = None,
    to: str | None = None,
    set_ctx: Mapping[str, Any] | None = None,
    set_iter: Mapping[str, Any] | None = None,
) -> Rule:
    """``- when: <condition>  then: {do: ..., ...}``"""
    return Rule(condition, do, attempts, backoff, delay, to, set_ctx, set_iter, _caller())


def otherwise(
    do: Directive = "continue",
    *,
    attempts: int | str | None = None,
    backoff: Backoff | None = None,
    delay: float | str | None = None,
    to: str | None = None,
    set_ctx: Mapping[str, Any] | None = None,
    set_iter: Mapping[str, Any] | None = None,
) -> Rule:
    """``- else: {then: {do: ..., ...}}``"""
    return Rule(None, do, attempts, backoff, delay, to, set_ctx, set_iter, _caller())


def retry(
    attempts: int | str = 3,
    *,
    delay: float | str | None = 1,
    backoff: Backoff | None = "fixed",
    condition: str = "{{ outcome.status == 'error' }}",
) -> Rule:
    """Shorthand: retry the task while its outcome is an error."""
    return Rule(condition, "retry", attempts, backoff, delay, None, None, None, _caller())


# -- loops, admission, routing -----------------------------------------------------------------


@dataclass(frozen=True)
class LoopSpec:
    over: Any
    iterator: str
    mode: LoopMode = "sequential"
    max_in_flight: int | str | None = None
    exec: Literal["distributed", "local"] | None = None
    where: Where = ("<unknown>", 0)

    def raw(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"mode": self.mode}
        if self.max_in_flight is not None:
            spec["max_in_flight"] = self.max_in_flight
        if self.exec is not None:
            spec["policy"] = {"exec": self.exec}
        return {"in": self.over, "iterator": self.iterator, "spec": spec}


def loop(
    over: Any,
    iterator: str,
    *,
    mode: LoopMode = "sequential",
    max_in_flight: int | str | None = None,
    exec: Literal["distributed", "local"] | None = None,  # noqa: A002 - the DSL's name
) -> LoopSpec:
    """``loop: {in: <over>, iterator: <name>, spec: {mode, max_in_flight, policy: {exec}}}``"""
    return LoopSpec(over, iterator, mode, max_in_flight, exec, _caller())


@dataclass(frozen=True)
class Admit:
    when: str | bool | None  # None: the else rule
    allow: bool
    where: Where = ("<unknown>", 0)

    def raw(self) -> dict[str, Any]:
        then = {"allow": self.allow}
        return {"else": {"then": then}} if self.when is None else {"when": self.when, "then": then}


def admit(condition: str | bool, allow: bool = True) -> Admit:
    """An admission rule: ``spec.policy.admit.rules: [{when, then: {allow}}]``."""
    return Admit(condition, allow, _caller())


def admit_else(allow: bool) -> Admit:
    return Admit(None, allow, _caller())


@dataclass(frozen=True)
class ArcSpec:
    step: str
    when: str | bool | None = None
    args: Mapping[str, Any] | None = None
    set: Mapping[str, Any] | None = None
    where: Where = ("<unknown>", 0)

    def raw(self) -> dict[str, Any]:
        d: dict[str, Any] = {"step": self.step}
        if self.when is not None:
            d["when"] = self.when
        if self.args is not None:
            d["args"] = dict(self.args)
        if self.set:
            d["set"] = dict(self.set)
        return d


def arc(
    step: str,
    *,
    when: str | bool | None = None,
    args: Mapping[str, Any] | None = None,
    set: Mapping[str, Any] | None = None,
) -> ArcSpec:  # noqa: A002 - the DSL's name
    """One ``next.arcs`` entry. ``set`` keys are ``ctx.<k>`` (or bare) as in YAML."""
    return ArcSpec(step, when, args, set, _caller())


@dataclass(frozen=True)
class Route:
    arcs: tuple[ArcSpec, ...]
    mode: RouteMode = "exclusive"
    where: Where = ("<unknown>", 0)


def route(*arcs: ArcSpec | str, mode: RouteMode = "exclusive") -> Route:
    """``next: {spec: {mode}, arcs: [...]}``; a bare name is an unconditional arc."""
    w = _caller()
    return Route(tuple(a if isinstance(a, ArcSpec) else ArcSpec(str(a), where=w) for a in arcs), mode, w)


# -- tasks -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One task of a step's pipeline: ``- <label>: {kind, ...config, spec, set, loop}``."""

    kind: str
    label: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    spec: Mapping[str, Any] = field(default_factory=dict)
    policy: tuple[Rule, ...] | None = None
    set: Mapping[str, Any] | None = None
    loop: LoopSpec | None = None
    where: Where = ("<unknown>", 0)

    def named(self, label: str) -> Call:
        return replace(self, label=label)

    def body(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, **self.config}
        spec = dict(self.spec)
        if self.policy is not None:
            spec["policy"] = {"rules": [r.raw() for r in self.policy]}
        if spec:
            d["spec"] = spec
        if self.set:
            d["set"] = dict(self.set)
        if self.loop is not None:
            d["loop"] = self.loop.raw()
        return d


def tool(
    kind: str,
    *,
    label: str | None = None,
    spec: Mapping[str, Any] | None = None,
    policy: Sequence[Rule] | None = None,
    set: Mapping[str, Any] | None = None,  # noqa: A002 - the DSL's name
    loop: LoopSpec | None = None,
    **config: Any,
) -> Call:
    """Any tool kind: ``tool("postgres", auth="pg", command="select 1")``."""
    if not isinstance(kind, str) or not kind:
        raise TypeError("tool kind must be a non-empty string")
    return Call(kind, label, dict(config), dict(spec or {}), tuple(policy) if policy is not None else None,
                set, loop, _caller())  # fmt: skip


def _call(kind: str, label: str | None, policy: Sequence[Rule] | None, spec: Mapping[str, Any] | None,
          set_: Mapping[str, Any] | None, loop_: LoopSpec | None, config: dict[str, Any]) -> Call:  # fmt: skip
    config = {k: v for k, v in config.items() if v is not None and v is not _MISSING}
    return Call(kind, label, config, dict(spec or {}), tuple(policy) if policy is not None else None,
                set_, loop_, _caller())  # fmt: skip


def python(
    code: str,
    *,
    label: str | None = None,
    input: Mapping[str, Any] | None = None,  # noqa: A002 - the DSL's name
    libs: Any = None,
    policy: Sequence[Rule] | None = None,
    spec: Mapping[str, Any] | None = None,
    set: Mapping[str, Any] | None = None,  # noqa: A002
    loop: LoopSpec | None = None,
) -> Call:
    """``kind: python`` with ``code`` (never rendered) and ``input`` (rendered)."""
    return _call("python", label, policy, spec, set, loop, {"code": code, "input": input, "libs": libs})


def http(
    method: str,
    url: str,
    *,
    label: str | None = None,
    headers: Mapping[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
    body: Any = None,
    auth: str | None = None,
    policy: Sequence[Rule] | None = None,
    spec: Mapping[str, Any] | None = None,
    set: Mapping[str, Any] | None = None,  # noqa: A002
    loop: LoopSpec | None = None,
) -> Call:
    cfg = {"method": method, "url": url, "headers": headers, "params": params, "body": body, "auth": auth}
    return _call("http", label, policy, spec, set, loop, cfg)


def postgres(
    command: str,
    *,
    auth: str | None = None,
    label: str | None = None,
    policy: Sequence[Rule] | None = None,
    spec: Mapping[str, Any] | None = None,
    set: Mapping[str, Any] | None = None,  # noqa: A002
    loop: LoopSpec | None = None,
) -> Call:
    return _call("postgres", label, policy, spec, set, loop, {"command": command, "auth": auth})


def duckdb(
    command: str,
    *,
    label: str | None = None,
    policy: Sequence[Rule] | None = None,
    spec: Mapping[str, Any] | None = None,
    set: Mapping[str, Any] | None = None,  # noqa: A002
    loop: LoopSpec | None = None,
) -> Call:
    return _call("duckdb", label, policy, spec, set, loop, {"command": command})


def noop(result: Any = _MISSING, *, label: str | None = None, policy: Sequence[Rule] | None = None,
         set: Mapping[str, Any] | None = None) -> Call:  # noqa: A002  # fmt: skip
    return _call("noop", label, policy, None, set, None, {"result": result})


def workbook(name: str, *, input: Mapping[str, Any] | None = None, label: str | None = None,  # noqa: A002
             policy: Sequence[Rule] | None = None) -> Call:  # fmt: skip
    """Call the workbook entry ``name``."""
    return _call("workbook", label, policy, None, None, None, {"name": name, "input": input})


def subplaybook(
    path: str | None = None,
    *,
    definition: Any = None,
    input: Mapping[str, Any] | str | None = None,  # noqa: A002
    return_step: str | None = None,
    credentials: Sequence[str] | None = None,
    label: str | None = None,
    policy: Sequence[Rule] | None = None,
) -> Call:
    """``kind: playbook``: a catalog ``path``, or an inline ``definition`` (a mapping, YAML text,
    a template yielding one, or a :class:`PlaybookBuilder`); ``credentials`` are the keychain
    names passed to a generated (inline) child (see docs/builder.md, trust boundary)."""
    if (path is None) == (definition is None):
        raise TypeError("subplaybook() takes exactly one of `path` or `definition`")
    if isinstance(definition, PlaybookBuilder):
        definition = definition.to_raw()
    cfg = {"path": path, "definition": definition, "input": input, "return_step": return_step,
           "credentials": list(credentials) if credentials is not None else None}  # fmt: skip
    return _call("playbook", label, policy, None, None, None, cfg)


# -- the playbook --------------------------------------------------------------------------------


class BuilderInvalid(PlaybookInvalid):
    """Validation issues of a built playbook, each at the builder call that caused it."""


@dataclass
class _StepDef:
    name: str
    tool: list[Call]
    next: Route | None
    loop: LoopSpec | None
    admit: list[Admit] | None
    input: Mapping[str, Any] | None
    set: Mapping[str, Any] | None
    desc: str | None
    spec: Mapping[str, Any] | None
    where: Where


def _as_route(value: Any, where: Where) -> Route | None:
    if value is None:
        return None
    if isinstance(value, Route):
        return value
    if isinstance(value, (str, ArcSpec)):
        value = [value]
    if not isinstance(value, Sequence):
        raise TypeError("next= takes a step name, arc(...), a list of them, or route(...)")
    return Route(
        tuple(a if isinstance(a, ArcSpec) else ArcSpec(str(a), where=where) for a in value),
        "exclusive",
        where,
    )


def _as_calls(value: Any) -> list[Call]:
    if value is None:
        return []
    if isinstance(value, Call):
        return [value]
    if isinstance(value, Sequence) and all(isinstance(c, Call) for c in value):
        return list(value)
    raise TypeError("tool= takes a task (python(...), http(...), tool(kind, ...)) or a list of them")


class PlaybookBuilder:
    """A playbook under construction; every method returns the builder (chainable)."""

    def __init__(self, name: str, *, path: str | None = None, description: str | None = None,
                 version: str | int | None = None, **metadata: Any):  # fmt: skip
        self._where: dict[PathT, Where] = {(): _caller(), ("metadata",): _caller()}
        meta: dict[str, Any] = {"name": name, "path": path if path is not None else name, **metadata}
        if description is not None:
            meta["description"] = description
        if version is not None:
            meta["version"] = version
        self._metadata = meta
        self._keychain: list[tuple[dict[str, Any], Where]] = []
        self._executor: dict[str, Any] = {}
        self._workload: dict[str, Any] = {}
        self._workbook: list[tuple[str, Call, str | None, Where]] = []
        self._steps: list[_StepDef] = []

    # -- document sections -----------------------------------------------------------------
    def workload(self, values: Mapping[str, Any] | None = None, /, **kw: Any) -> PlaybookBuilder:
        """Workload defaults (merged with earlier calls)."""
        self._workload.update(dict(values or {}), **kw)
        self._where[("workload",)] = _caller()
        return self

    def keychain(self, name: str, *, kind: str | None = None, **fields: Any) -> PlaybookBuilder:
        """One ``keychain:`` declaration: ``.keychain("pg", kind="static", map={...})``."""
        decl: dict[str, Any] = {"name": name}
        if kind is not None:
            decl["kind"] = kind
        decl.update(fields)
        self._keychain.append((decl, _caller()))
        return self

    def executor(self, *, profile: str | None = None, entry_step: str | None = None,
                 max_step_runs: int | None = None, generated: Mapping[str, Any] | None = None,
                 **spec: Any) -> PlaybookBuilder:  # fmt: skip
        """``executor: {profile, spec: {entry_step, max_step_runs, generated: {allow_kinds, allow_credentials, allow_hosts}}}``."""
        if profile is not None:
            self._executor["profile"] = profile
        s = self._executor.setdefault("spec", {})
        for k, v in (("entry_step", entry_step), ("max_step_runs", max_step_runs), ("generated", generated)):
            if v is not None:
                s[k] = dict(v) if isinstance(v, Mapping) else v
        s.update(spec)
        self._where[("executor",)] = _caller()
        return self

    def workbook(self, name: str, task: Call, *, desc: str | None = None) -> PlaybookBuilder:
        if not isinstance(task, Call):
            raise TypeError("workbook() takes a task: python(...), http(...), tool(kind, ...)")
        self._workbook.append((name, task, desc, _caller()))
        return self

    def step(
        self,
        name: str,
        *,
        tool: Call | Sequence[Call] | None = None,
        next: str | ArcSpec | Sequence[str | ArcSpec] | Route | None = None,  # noqa: A002 - the DSL's name
        loop: LoopSpec | None = None,
        admit: Sequence[Admit] | None = None,
        input: Mapping[str, Any] | None = None,  # noqa: A002
        set: Mapping[str, Any] | None = None,  # noqa: A002
        desc: str | None = None,
        spec: Mapping[str, Any] | None = None,
    ) -> PlaybookBuilder:
        """One workflow step. ``next=["b"]`` is an unconditional arc to ``b``."""
        w = _caller()
        self._steps.append(_StepDef(name, _as_calls(tool), _as_route(next, w), loop,
                                    list(admit) if admit is not None else None, input, set, desc, spec, w))  # fmt: skip
        return self

    # -- output ---------------------------------------------------------------------------
    def to_raw(self) -> dict[str, Any]:
        """The standard-form document (the YAML a person would write), before validation."""
        where = {k: v for k, v in self._where.items() if len(k) <= 1}
        doc: dict[str, Any] = {
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": dict(self._metadata),
        }
        if self._keychain:
            doc["keychain"] = []
            for i, (decl, w) in enumerate(self._keychain):
                doc["keychain"].append(dict(decl))
                where[("keychain", i)] = w
            where.setdefault(("keychain",), self._keychain[0][1])
        if self._executor:
            doc["executor"] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self._executor.items()}
        if self._workload:
            doc["workload"] = dict(self._workload)
        if self._workbook:
            doc["workbook"] = []
            for i, (name, task, desc, w) in enumerate(self._workbook):
                entry: dict[str, Any] = {"name": name, "tool": task.body()}
                if desc is not None:
                    entry["desc"] = desc
                doc["workbook"].append(entry)
                where[("workbook", i)] = w
                self._task_where(where, ("workbook", i, "tool"), task)
        doc["workflow"] = [self._step_raw(i, s, where) for i, s in enumerate(self._steps)]
        if self._steps:
            where.setdefault(("workflow",), self._steps[0].where)
        self._last_where = where
        return doc

    @staticmethod
    def _task_where(where: dict[PathT, Where], path: PathT, task: Call) -> None:
        where[path] = task.where
        for r, rule in enumerate(task.policy or ()):
            where[(*path, "spec", "policy", "rules", r)] = rule.where
        if task.loop is not None:
            where[(*path, "loop")] = task.loop.where

    def _step_raw(self, i: int, s: _StepDef, where: dict[PathT, Where]) -> dict[str, Any]:
        path: PathT = ("workflow", i)
        where[path] = s.where
        d: dict[str, Any] = {"step": s.name}
        if s.desc is not None:
            d["desc"] = s.desc
        spec = dict(s.spec or {})
        if s.admit is not None:
            spec["policy"] = {**(spec.get("policy") or {}), "admit": {"rules": [a.raw() for a in s.admit]}}
            for r, a in enumerate(s.admit):
                where[(*path, "spec", "policy", "admit", "rules", r)] = a.where
        if spec:
            d["spec"] = spec
        if s.loop is not None:
            d["loop"] = s.loop.raw()
            where[(*path, "loop")] = s.loop.where
        if s.input is not None:
            d["input"] = dict(s.input)
        if s.tool:
            d["tool"] = []
            used: set[str] = {c.label for c in s.tool if c.label}
            for j, c in enumerate(s.tool):
                label = c.label or _auto_label(c.kind, used)
                d["tool"].append({label: c.body()})
                where[(*path, "tool", j)] = c.where
                self._task_where(where, (*path, "tool", j, label), c)
        if s.set:
            d["set"] = dict(s.set)
        if s.next is not None:
            d["next"] = {"spec": {"mode": s.next.mode}, "arcs": [a.raw() for a in s.next.arcs]}
            where[(*path, "next")] = s.next.where
            for k, a in enumerate(s.next.arcs):
                where[(*path, "next", "arcs", k)] = a.where
        return d

    def build(self) -> Playbook:
        """The validated canonical model; raises :class:`BuilderInvalid` naming the builder calls."""
        raw = self.to_raw()
        pb, issues = parse_playbook(raw)
        if issues:
            raise BuilderInvalid([_locate(i, self._last_where) for i in issues])
        assert pb is not None
        return pb

    def to_yaml(self) -> str:
        """The standard-form YAML of the validated model (``parse(to_yaml()) == build()``)."""
        return to_yaml(self.build())


def playbook(name: str, *, path: str | None = None, description: str | None = None,
             version: str | int | None = None, **metadata: Any) -> PlaybookBuilder:  # fmt: skip
    """Start a playbook: ``playbook("name").workload(...).step(...)``."""
    return PlaybookBuilder(name, path=path, description=description, version=version, **metadata)


def _auto_label(kind: str, used: set[str]) -> str:
    label, n = kind, 1
    while label in used:
        n += 1
        label = f"{kind}_{n}"
    used.add(label)
    return label


def _locate(issue: ValidationIssue, where: dict[PathT, Where]) -> ValidationIssue:
    """Point an issue at the builder call owning the longest prefix of its YAML path."""
    best: tuple[int, Where] | None = None
    for path, w in where.items():
        key = format_path(path)
        if (
            issue.path == key
            or issue.path.startswith(key + ".")
            or issue.path.startswith(key + "[")
            or key == "<root>"
        ):
            if best is None or len(path) > best[0]:
                best = (len(path), w)
    if best is None:
        return issue
    file, line = best[1]
    return ValidationIssue(file, line, issue.path, issue.rule, issue.message)


# -- YAML and identity ---------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (code) as ``|`` blocks when YAML allows it, else quoted."""


_YAML_BREAKS = (
    "\x85",
    "\u2028",
    "\u2029",
    "\ufeff",
)  # line breaks to YAML: only a double-quoted escape keeps them


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = '"' if any(c in value for c in _YAML_BREAKS) else "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(pb: Playbook) -> str:
    """The standard-form YAML of a model, in document order."""
    return yaml.dump(playbook_to_raw(pb), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)


def canonical_yaml(pb: Playbook) -> str:
    """The canonical text of a playbook: its standard form with every mapping's keys sorted."""
    return yaml.dump(playbook_to_raw(pb), Dumper=_Dumper, sort_keys=True, allow_unicode=True, width=120)


def playbook_id(pb: Playbook) -> str:
    """A stable id from content alone: ``sha256:<hex of the canonical YAML>``."""
    return "sha256:" + hashlib.sha256(canonical_yaml(pb).encode("utf-8")).hexdigest()


__all__ = [
    "Admit", "ArcSpec", "BuilderInvalid", "Call", "LoopSpec", "PlaybookBuilder", "Route", "Rule", "admit",
    "admit_else", "arc", "canonical_yaml", "duckdb", "http", "loop", "noop", "otherwise", "playbook",
    "playbook_id", "postgres", "python", "retry", "route", "subplaybook", "to_yaml", "tool", "when", "workbook",
]  # fmt: skip
