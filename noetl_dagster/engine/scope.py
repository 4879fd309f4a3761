"""The template namespace (SEMANTICS.md §2) as a cheap layered mapping.

Explicit namespaces (``workload``, ``ctx``, ``iter``, ``args``, ``steps``...)
come first; a bare name is then looked up in ``args``, ``ctx``, ``iter``, the
pipeline's task results, the step results and finally ``workload``. Nothing is
copied: Jinja reads through :class:`Scope` directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

_MISSING = object()


class ResultView(dict):
    """A step result: ``.data`` is an alias of the result itself when it has no ``data`` key."""

    __slots__ = ()

    def __missing__(self, key: Any) -> Any:
        if key == "data":
            return self
        raise KeyError(key)


def view(value: Any) -> Any:
    if isinstance(value, dict) and not isinstance(value, ResultView):
        return ResultView(value)
    return value


_TIERS = {"file": "disk"}


class StepResults(Mapping):
    """Read-only mapping of step name -> result view, resolving references lazily."""

    __slots__ = ("_names", "_get", "_cache")

    def __init__(self, names: Callable[[], Any], get: Callable[[str], Any]):
        self._names = names
        self._get = get
        self._cache: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key in self._cache:
            return self._cache[key]
        names = self._names()
        if key not in names:
            raise KeyError(key)
        v = self._get(key)
        raw = names.get(key) if isinstance(names, Mapping) else None
        if (
            isinstance(v, dict)
            and isinstance(raw, dict)
            and len(raw) == 1
            and isinstance(raw.get("$ref"), dict)
        ):
            # an offloaded result (NoETL): `step._ref` is its reference (kind: artifact reads it back),
            # `step._store` the tier it went to, in NoETL's names (a file payload store is the disk tier)
            store = raw["$ref"].get("store")
            v = {**v, "_ref": raw["$ref"], "_store": _TIERS.get(store, store)}
        v = view(v)
        self._cache[key] = v
        return v

    def __contains__(self, key: object) -> bool:
        return key in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._names()))

    def __len__(self) -> int:
        return len(self._names())


class Scope(Mapping):
    __slots__ = ("ns", "chain")

    def __init__(self, ns: dict[str, Any], chain: tuple[Mapping[str, Any], ...]):
        self.ns = ns
        self.chain = chain

    def __getitem__(self, key: str) -> Any:
        v = self.ns.get(key, _MISSING)
        if v is not _MISSING:
            return v
        for m in self.chain:
            if key in m:
                return m[key]
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        if key in self.ns:
            return True
        return any(key in m for m in self.chain)

    def __iter__(self) -> Iterator[str]:
        seen: dict[str, None] = dict.fromkeys(self.ns)
        for m in self.chain:
            for k in m:
                seen.setdefault(k, None)
        return iter(seen)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def child(self, **extra: Any) -> Scope:
        ns = dict(self.ns)
        ns.update(extra)
        return Scope(ns, self.chain)

    def plain(self) -> dict[str, Any]:
        """A JSON-able copy of the namespaces (for subprocess tools)."""
        out: dict[str, Any] = {}
        for k in ("workload", "ctx", "iter", "args", "execution_id"):
            if k in self.ns:
                out[k] = self.ns[k]
        steps = self.ns.get("steps")
        if isinstance(steps, Mapping):
            out["steps"] = {k: steps[k] for k in steps}
        return out
