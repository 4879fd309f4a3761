"""The trust boundary of generated (inline) playbooks.

A playbook handed to ``kind: playbook`` as an inline ``definition`` (typically
produced by an earlier step, e.g. an agent) runs as a child execution that does
**not** inherit its parent's credentials or tool kinds. It gets only:

* the tool kinds its parent's ``executor.spec.generated.allow_kinds`` lists, and
* the keychain names the calling task passes in ``credentials:`` that its
  parent's ``executor.spec.generated.allow_credentials`` also lists.

No ``executor.spec.generated`` means nothing is allowed. A restricted execution
passes its restriction on: its own children (inline or from the catalog) are
checked against it and can only narrow it. Credentials of a restricted child
resolve through the parent's keychain under the delegated names only
(:class:`DelegatedKeychain`); every secret so resolved is redacted from the
child's events as well as the parent's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from noetl_dagster.dsl.model import Playbook, Task
from noetl_dagster.engine.ports import ToolError

_KEYCHAIN_REF = re.compile(r"keychain\s*(?:\.\s*([A-Za-z_]\w*)|\[\s*['\"]([^'\"]+)['\"]\s*\])")
_CREDENTIAL_KEYS = ("auth", "credential", "credentials")
_RESOURCE_URI = re.compile(r"noetl://([A-Za-z0-9_.-]+)/")


@dataclass(frozen=True)
class Grant:
    """What an execution may use. ``None`` = unrestricted (a catalog or CLI execution)."""

    kinds: frozenset[str] | None = None
    credentials: frozenset[str] | None = None

    @property
    def restricted(self) -> bool:
        return self.kinds is not None or self.credentials is not None

    def narrow(self, other: Grant) -> Grant:
        def meet(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
            return b if a is None else a if b is None else a & b

        return Grant(meet(self.kinds, other.kinds), meet(self.credentials, other.credentials))


UNRESTRICTED = Grant()


def generated_policy(pb: Playbook) -> Grant:
    """``executor.spec.generated: {allow_kinds: [...], allow_credentials: [...]}``; absent = nothing."""
    spec = pb.executor.spec.get("generated") if pb.executor else None
    spec = spec if isinstance(spec, Mapping) else {}

    def names(key: str) -> frozenset[str]:
        v = spec.get(key) or []
        return frozenset(str(x) for x in v) if isinstance(v, (list, tuple)) else frozenset()

    return Grant(names("allow_kinds"), names("allow_credentials"))


def grant_for_generated(parent: Grant, parent_pb: Playbook, passed: Iterable[str] | None) -> Grant:
    """The grant of an inline child: kinds allowed by the parent's policy (within the parent's own
    grant), credentials passed explicitly by the call and allowed by that policy."""
    policy = parent.narrow(generated_policy(parent_pb))
    passed_set = frozenset(str(c) for c in (passed or []))
    allowed = policy.credentials if policy.credentials is not None else frozenset()
    refused = sorted(passed_set - allowed)
    if refused:
        raise ToolError(
            f"generated playbook refused: credentials {refused} are passed but not allowed by the parent's "
            f"executor.spec.generated.allow_credentials ({sorted(allowed)})",
            kind="generated_playbook_refused",
            result={"violations": [f"credential {c!r} is not in allow_credentials" for c in refused]},
        )
    return Grant(policy.kinds, passed_set)


def _tasks(pb: Playbook) -> Iterator[tuple[str, Task]]:
    for step in pb.workflow:
        for t in step.tool:
            yield f"workflow step {step.name!r} task {t.label!r}", t
    for w in pb.workbook:
        yield f"workbook entry {w.name!r}", w.tool


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def _credential_refs(value: Any, out: set[str]) -> set[str]:
    """Literal credential names under ``auth`` / ``credential`` keys (nested mappings too)."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if k in _CREDENTIAL_KEYS:
                if isinstance(v, str) and "{{" not in v:
                    out.add(v)
                elif isinstance(v, (list, tuple)):
                    out.update(x for x in v if isinstance(x, str) and "{{" not in x)
                elif isinstance(v, Mapping):
                    for kk in ("name", "credential", "key"):
                        if isinstance(v.get(kk), str) and "{{" not in v[kk]:
                            out.add(v[kk])
            _credential_refs(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _credential_refs(v, out)
    return out


def violations(pb: Playbook, grant: Grant, tenant: str | None = None) -> list[str]:
    """Everything in ``pb`` the grant does not allow (empty when it may run). With ``tenant`` (the
    execution's), a literal ``noetl://<other tenant>/…`` resource anywhere in the playbook is refused too:
    a restricted child works in its parent's tenant only (run-time URIs meet the registry's own checks)."""
    out: list[str] = []
    if tenant is not None:
        seen: set[str] = set()
        for text in _strings(pb.model_dump(mode="json", exclude={"source_file"})):
            for m in _RESOURCE_URI.finditer(text):
                if m.group(1) != tenant and m.group(1) not in seen:
                    seen.add(m.group(1))
                    out.append(f"resource noetl://{m.group(1)}/… belongs to tenant {m.group(1)!r}, not this "
                               f"execution's tenant {tenant!r} (cross-tenant resources are refused)")  # fmt: skip
    if grant.kinds is not None:
        for where, t in _tasks(pb):
            if t.kind not in grant.kinds:
                out.append(
                    f"{where}: tool kind {t.kind!r} is not allowed (allow_kinds: {sorted(grant.kinds)})"
                )
    if grant.credentials is not None:
        asked: dict[str, str] = {}
        for decl in pb.keychain:
            asked.setdefault(str(decl.get("name")), "keychain declaration")
        for where, t in _tasks(pb):
            for name in _credential_refs(t.config, set()):
                asked.setdefault(name, f"{where} (auth)")
        for text in _strings(pb.model_dump(mode="json", exclude={"source_file"})):
            for m in _KEYCHAIN_REF.finditer(text):
                asked.setdefault(m.group(1) or m.group(2), "template reference")
        for name, where in asked.items():
            if name not in grant.credentials:
                out.append(f"credential {name!r} ({where}) is not passed to this playbook "
                           f"(delegated: {sorted(grant.credentials)})")  # fmt: skip
    return out


class DelegatedKeychain:
    """The keychain of a restricted child: only the delegated names, resolved by the parent."""

    def __init__(self, resolve: Callable[[str], dict[str, Any]], secrets: Callable[[], Iterable[str]],
                 names: frozenset[str]):  # fmt: skip
        self._resolve = resolve
        self._secrets = secrets
        self.names = names
        self._on_secret: list[Callable[[Iterable[str]], None]] = []

    def bind(
        self, *, on_secret: Callable[[Iterable[str]], None] | None = None, **_: Any
    ) -> DelegatedKeychain:
        if on_secret is not None:
            self._on_secret.append(on_secret)
            on_secret(set(self._secrets()))
        return self

    def credential(self, name: str) -> dict[str, Any]:
        if name not in self.names:
            raise ToolError(
                f"credential {name!r} is not delegated to this generated playbook (delegated: {sorted(self.names)})",
                kind="credential_not_delegated",
            )
        fields = self._resolve(name)
        known = set(self._secrets())
        for cb in self._on_secret:
            cb(known)
        return fields

    def secret_values(self) -> set[str]:
        return set(self._secrets())

    def namespace(self) -> Mapping[str, Any]:
        return _DelegatedNamespace(self)


class _DelegatedNamespace(Mapping[str, Any]):
    def __init__(self, kc: DelegatedKeychain):
        self._kc = kc

    def __getitem__(self, name: str) -> dict[str, Any]:
        if name not in self._kc.names:
            raise KeyError(name)
        return self._kc.credential(name)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._kc.names))

    def __len__(self) -> int:
        return len(self._kc.names)

    def __repr__(self) -> str:  # never show resolved values
        return f"<delegated keychain {sorted(self._kc.names)}>"
