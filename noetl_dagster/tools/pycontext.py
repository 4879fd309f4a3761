"""The ``context`` a python task's code sees: copy on read, never the engine's live state.

State changes only through recorded events (results, ``set:``), so replay equals the live run.
Handing code the live scope let ``context["ctx"]["xs"].append(1)`` change ctx unrecorded. A full
copy per call would cost the size of ctx each step, so values are copied when code reads them:
a section (``ctx``, ``workload``, a step result...) is a dict whose values are deep-copied on first
read, once per call. Untouched values cost nothing; writes to what code read stay in the task.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from copy import deepcopy
from typing import Any

from noetl_dagster.engine.scope import ResultView, Scope

_MISSING = object()


def _private(value: Any) -> Any:
    """What code gets for a value of the engine's: a lazy view of a mapping, a copy of the rest."""
    if isinstance(value, dict):
        return CopyOnReadDict(value)
    if isinstance(value, Mapping):
        return CodeContext(value)
    if type(value) in (str, int, float, bool) or value is None:
        return value
    return deepcopy(value)


class CopyOnReadDict(dict):
    """A dict over a live one: starts as a shallow copy (the keys, O(keys)); a value is replaced by
    its deep copy on first read. Every reader goes through ``_own`` - ``__iter__`` is overridden so
    ``dict(d)``/``{**d}`` use keys()+[] rather than C's direct copy of the live values."""

    __slots__ = ("_fresh", "_result")

    def __init__(self, live: dict[str, Any]) -> None:
        super().__init__(live)
        self._fresh = set(live)  # keys still holding the live value
        self._result = isinstance(live, ResultView)  # a step result: `.data` is the result itself

    def _own(self, key: Any) -> Any:
        if key in self._fresh:
            self._fresh.discard(key)
            value = _private(dict.__getitem__(self, key))
            dict.__setitem__(self, key, value)
            return value
        return dict.__getitem__(self, key)

    def _own_all(self) -> None:
        for key in list(self._fresh):
            self._own(key)

    def __getitem__(self, key: Any) -> Any:
        if dict.__contains__(self, key):
            return self._own(key)
        if self._result and key == "data":
            return self
        raise KeyError(key)

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __setitem__(self, key: Any, value: Any) -> None:
        self._fresh.discard(key)
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: Any) -> None:
        self._fresh.discard(key)
        dict.__delitem__(self, key)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(dict.keys(self)))

    def items(self) -> Any:
        self._own_all()
        return dict.items(self)

    def values(self) -> Any:
        self._own_all()
        return dict.values(self)

    def pop(self, key: Any, *default: Any) -> Any:
        if dict.__contains__(self, key):
            value = self._own(key)
            dict.__delitem__(self, key)
            return value
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple[Any, Any]:
        self._own_all()
        key, value = dict.popitem(self)
        return key, value

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if dict.__contains__(self, key):
            return self._own(key)
        self[key] = default
        return default

    def update(self, *args: Any, **kw: Any) -> None:
        for key, value in dict(*args, **kw).items():
            self[key] = value

    def copy(self) -> dict[str, Any]:
        self._own_all()
        return dict(dict.items(self))

    def __or__(self, other: Any) -> Any:
        return self.copy() | other if isinstance(other, Mapping) else NotImplemented

    def __ror__(self, other: Any) -> Any:
        return dict(other) | self.copy() if isinstance(other, Mapping) else NotImplemented

    def __reduce_ex__(self, protocol: Any) -> Any:  # copy/deepcopy/pickle: a plain dict of owned values
        return dict, (self.copy(),)


_UNREAD = object()  # the storage value of a name not read yet (CodeContext)
_UNLISTED = frozenset(
    {"keychain"}
)  # readable by name, never enumerated (json.dumps(context) resolves no secret)


class CodeContext(dict):
    """The top of ``context``: a dict of the scope's names (``keychain`` is readable by name but not
    listed), each value made by :func:`_private` on first read, once per call, so a second read sees
    the task's own edits. A dict, so ``json.dumps(context)``, ``dict(context)``, ``**context``,
    iteration, ``in``, ``len``, ``==`` and ``repr`` work as on one; writes and deletes are the
    task's own. Unread names hold a marker no reader sees: every reader goes through
    ``__getitem__`` (``__iter__`` is overridden so C's ``dict(d)``/``{**d}`` copy does too, and
    ``items``/``values``/``==``/``repr``/``copy`` read every name first).

    Set-up per call is the scope's explicit namespaces (``ctx``, ``workload``, ``steps``...: a
    C copy of a few keys); its bare names (ctx's, args', step names...) are listed when code first
    needs them (iteration, ``len``, a name not listed yet), so a call that reads ``context["x"]``
    costs nothing per ctx key (reading ``context["ctx"]`` copies its keys, at C speed)."""

    __slots__ = ("_live", "_unlisted", "_pending")

    def __init__(self, live: Mapping[str, Any]) -> None:
        self._live = live
        self._unlisted: dict[Any, Any] | None = None  # keychain's private view, once read
        self._pending: tuple[Mapping[str, Any], ...] | None = None  # the chain, until listed
        if isinstance(live, Scope):
            keys = dict.fromkeys(live.ns, _UNREAD)
            self._pending = live.chain
        else:
            keys = dict.fromkeys(live, _UNREAD)
        if not _UNLISTED.isdisjoint(keys) and isinstance(live, Scope):
            self._unlisted = {}
            for key in _UNLISTED:
                keys.pop(key, None)
        dict.__init__(self, keys)

    def _list(self) -> None:
        """Add the chain's names (Scope.__iter__'s order after the namespaces), keeping the task's writes."""
        chain, self._pending = self._pending, None
        if chain is None:
            return
        more: dict[Any, Any] = {}
        for m in chain:
            more.update(dict.fromkeys(m, _UNREAD))
        for key in _UNLISTED:
            if more.pop(key, None) is not None and self._unlisted is None:
                self._unlisted = {}
        for key, value in more.items():
            if not dict.__contains__(self, key):
                dict.__setitem__(self, key, value)

    def __getitem__(self, key: Any) -> Any:
        value = dict.get(self, key, _MISSING)
        if value is _UNREAD:
            value = _private(self._live[key])
            dict.__setitem__(self, key, value)
            return value
        if value is not _MISSING:
            return value
        if self._pending is not None:
            self._list()
            return self[key]
        if self._unlisted is not None and key in _UNLISTED:
            value = self._unlisted.get(key, _MISSING)
            if value is _MISSING:
                value = self._unlisted[key] = _private(self._live[key])
            return value
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        if dict.__contains__(self, key):
            return True
        if self._pending is not None:
            self._list()
            return self.__contains__(key)
        return self._unlisted is not None and key in _UNLISTED

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def _read_all(self) -> None:
        self._list()
        for key, value in list(dict.items(self)):
            if value is _UNREAD:
                self[key]

    def __iter__(self) -> Iterator[Any]:
        self._list()
        return iter(list(dict.keys(self)))

    def __len__(self) -> int:
        self._list()
        return dict.__len__(self)

    def __reversed__(self) -> Iterator[Any]:
        self._list()
        return iter(list(dict.keys(self))[::-1])

    def keys(self) -> Any:
        self._list()
        return dict.keys(self)

    def items(self) -> Any:
        self._read_all()
        return dict.items(self)

    def values(self) -> Any:
        self._read_all()
        return dict.values(self)

    def __delitem__(self, key: Any) -> None:
        self._list()
        dict.__delitem__(self, key)

    def pop(self, key: Any, *default: Any) -> Any:
        self._list()
        if dict.__contains__(self, key):
            value = self[key]
            dict.__delitem__(self, key)
            return value
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple[Any, Any]:
        self._read_all()
        return dict.popitem(self)

    def clear(self) -> None:
        self._pending = None
        dict.clear(self)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key in self:
            return self[key]
        dict.__setitem__(self, key, default)
        return default

    def copy(self) -> dict[str, Any]:
        self._read_all()
        return dict(dict.items(self))

    def __eq__(self, other: object) -> bool:
        self._read_all()
        if isinstance(other, CodeContext):
            other._read_all()
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # type: ignore[assignment]

    def __or__(self, other: Any) -> Any:
        return self.copy() | other if isinstance(other, Mapping) else NotImplemented

    def __ror__(self, other: Any) -> Any:
        return dict(other) | self.copy() if isinstance(other, Mapping) else NotImplemented

    def __repr__(self) -> str:
        self._read_all()
        return dict.__repr__(self)

    def __reduce_ex__(self, protocol: Any) -> Any:  # copy/deepcopy/pickle: a plain dict of owned values
        return dict, (self.copy(),)
