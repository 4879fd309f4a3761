"""The ready-to-run form of a cached playbook: the ``dsl.model`` classes' state without pydantic.

:func:`load_ready` unpickles a parse-cache entry (a pickled, validated ``dsl.model.Playbook``) into
the twins below instead of the models: classes of the same names, the same behaviour (both inherit
``dsl/shapes.py``'s bases) and the same state (``__dict__``, extra fields, fields set, private
attributes, exactly as pydantic pickles them), which import no pydantic. ``noetl-dagster run`` of an
unchanged playbook hands that to the local runner (issue 35: pydantic was most of what such a run
imported).

A twin behaves as its model: fields are plain attributes, assignment follows pydantic's rules
(fields, private attributes, extras where allowed), ``==``, iteration, copy, ``model_copy`` and
pickling match ``BaseModel``'s. Anything else a model offers (``model_dump``, ``model_fields``,
``repr``, ``Loop.frame_policy``, ``Playbook.dagster`` ...) is answered by the model itself:
:meth:`ReadyModel.as_model` builds it from the twin's state (pydantic imported then) and the
attribute is read from it. The engine and runner accept either form; tests/dsl/test_ready_form.py
runs the examples and the conformance core fixtures through both and compares the traces, and
keeps the field lists below equal to the models'.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from noetl_dagster.dsl.shapes import (
    OutputCheckBase,
    PlaybookBase,
    PolicyRuleBase,
    SetBlockBase,
    StepBase,
)

_MODEL_MODULE = "noetl_dagster.dsl.model"


# -- the twins -------------------------------------------------------------------------------------
_get = object.__getattribute__
_set = object.__setattr__


class ReadyModel:
    """A model's state without pydantic (see the module doc). ``_fields``: the model's field names;
    ``_private``: its private attribute names; ``_extra``: whether extra fields are allowed."""

    __slots__ = ("__dict__", "__pydantic_extra__", "__pydantic_fields_set__", "__pydantic_private__")
    _fields: frozenset[str] = frozenset()
    _private: frozenset[str] = frozenset()
    _extra = False

    def __setstate__(self, state: dict[str, Any]) -> None:  # BaseModel.__setstate__'s
        _set(self, "__pydantic_fields_set__", state.get("__pydantic_fields_set__", {}))
        _set(self, "__pydantic_extra__", state.get("__pydantic_extra__", {}))
        _set(self, "__pydantic_private__", state.get("__pydantic_private__", {}))
        _set(self, "__dict__", state.get("__dict__", {}))

    def __getstate__(self) -> dict[str, Any]:  # BaseModel.__getstate__'s
        return {
            "__dict__": self.__dict__,
            "__pydantic_extra__": self.__pydantic_extra__,
            "__pydantic_fields_set__": self.__pydantic_fields_set__,
            "__pydantic_private__": self.__pydantic_private__,
        }

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # protocols (copy, pickle, numpy ...): not the model's
            raise AttributeError(name)
        private = _get(self, "__pydantic_private__")
        if private and name in private:
            return private[name]
        extra = _get(self, "__pydantic_extra__")
        if extra and name in extra:
            return extra[name]
        if name in type(self)._private:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self.as_model(), name)  # model_dump, model_copy, model_fields ...

    def __setattr__(self, name: str, value: Any) -> None:  # BaseModel.__setattr__'s rules, no validation
        cls = type(self)
        if name in cls._private:
            private = _get(self, "__pydantic_private__")
            if private is None:
                private = {}
                _set(self, "__pydantic_private__", private)
            private[name] = value
        elif name in cls._fields:
            self.__dict__[name] = value
            self.__pydantic_fields_set__.add(name)
        elif cls._extra and not hasattr(cls, name):
            if self.__pydantic_extra__ is None:
                _set(self, "__pydantic_extra__", {})
            self.__pydantic_extra__[name] = value
        else:
            raise ValueError(f'"{cls.__name__}" object has no field "{name}"')

    def __eq__(self, other: object) -> bool:  # BaseModel.__eq__'s: same class, same state
        if isinstance(other, ReadyModel):
            return (
                type(self) is type(other)
                and self.__dict__ == other.__dict__
                and self.__pydantic_private__ == other.__pydantic_private__
                and self.__pydantic_extra__ == other.__pydantic_extra__
            )
        return self.as_model() == other

    __hash__ = None  # type: ignore[assignment] - as BaseModel (not frozen)

    def __iter__(self) -> Any:  # BaseModel.__iter__'s
        yield from [(k, v) for k, v in self.__dict__.items() if not k.startswith("_")]
        extra = self.__pydantic_extra__
        if extra:
            yield from extra.items()

    def __repr__(self) -> str:
        return repr(self.as_model())

    def __str__(self) -> str:
        return str(self.as_model())

    def __copy__(self) -> ReadyModel:  # BaseModel.__copy__'s: the containers shared, the dicts copied
        cls = type(self)
        m = cls.__new__(cls)
        private = self.__pydantic_private__
        m.__setstate__({
            "__dict__": dict(self.__dict__),
            "__pydantic_extra__": dict(self.__pydantic_extra__) if self.__pydantic_extra__ is not None else None,
            "__pydantic_fields_set__": set(self.__pydantic_fields_set__),
            "__pydantic_private__": dict(private) if private is not None else None,
        })  # fmt: skip
        return m

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> ReadyModel:
        from copy import deepcopy  # noqa: PLC0415

        cls = type(self)
        m = cls.__new__(cls)
        memo = {} if memo is None else memo
        memo[id(self)] = m
        m.__setstate__(deepcopy(self.__getstate__(), memo))
        return m

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> ReadyModel:
        """``BaseModel.model_copy``'s: a copy in the same form, ``update`` set without validation."""
        copied = self.__deepcopy__() if deep else self.__copy__()
        if update:
            cls = type(self)
            for k, v in update.items():
                if cls._extra and k not in cls._fields:
                    if copied.__pydantic_extra__ is None:
                        _set(copied, "__pydantic_extra__", {})
                    copied.__pydantic_extra__[k] = v
                else:
                    copied.__dict__[k] = v
            copied.__pydantic_fields_set__.update(update)
        return copied

    def as_model(self) -> Any:
        """The pydantic model of this state (``dsl.model`` imported): what unpickling the entry makes."""
        return _as_models(self, {})


def _as_models(value: Any, memo: dict[int, Any]) -> Any:
    """``value`` with every twin in it replaced by its model; containers without one are shared."""
    found = memo.get(id(value))
    if found is not None:
        return found
    if isinstance(value, ReadyModel):
        from noetl_dagster.dsl import model  # noqa: PLC0415 - pydantic, on demand

        cls = getattr(model, type(value).__name__)
        m = cls.__new__(cls)
        memo[id(value)] = m
        state = value.__getstate__()
        m.__setstate__({**state, "__dict__": {k: _as_models(v, memo) for k, v in state["__dict__"].items()}})
        return m
    if type(value) is list:
        items = [_as_models(v, memo) for v in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    if type(value) is dict:
        pairs = {k: _as_models(v, memo) for k, v in value.items()}
        return pairs if any(pairs[k] is not v for k, v in value.items()) else value
    return value


def _names(*names: str) -> frozenset[str]:
    return frozenset(names)


class SetBlock(SetBlockBase, ReadyModel):
    __slots__ = ()
    _fields = _names("ctx", "iter")


class RuleThen(ReadyModel):
    __slots__ = ()
    _fields = _names("do", "attempts", "backoff", "delay", "to", "set")


class PolicyRule(PolicyRuleBase, ReadyModel):
    __slots__ = ()
    _fields = _names("when", "then")


class AdmitRule(ReadyModel):
    __slots__ = ()
    _fields = _names("when", "allow")


class Cursor(ReadyModel):
    __slots__ = ()
    _fields = _names("kind", "auth", "claim", "options")


class Loop(ReadyModel):
    __slots__ = ()
    _fields = _names("in_", "iterator", "mode", "max_in_flight", "exec", "spec", "cursor", "frame")


class Task(ReadyModel):
    __slots__ = ()
    _fields = _names("label", "kind", "config", "spec", "policy", "set", "loop", "pure")


class Arc(ReadyModel):
    __slots__ = ()
    _fields = _names("step", "when", "args", "set", "spec")


class Router(ReadyModel):
    __slots__ = ()
    _fields = _names("mode", "arcs", "spec")


class OutputCheck(OutputCheckBase, ReadyModel):
    __slots__ = ()
    _fields = _names(
        "name", "row_count", "schema_", "freshness", "assert_", "severity", "blocking", "description"
    )


class Output(ReadyModel):
    __slots__ = ()
    _fields = _names(
        "uri", "description", "owners", "kinds", "tags", "group", "automation", "freshness", "checks", "line"
    )


class Step(StepBase, ReadyModel):
    __slots__ = ()
    _fields = _names(
        "name", "desc", "spec", "admit", "loop", "tool", "input", "next", "set", "outputs", "line"
    )


class WorkbookEntry(ReadyModel):
    __slots__ = ()
    _fields = _names("name", "tool", "desc")


class Metadata(ReadyModel):
    __slots__ = ()
    _fields = _names("name", "path", "description", "version")
    _extra = True


class Executor(ReadyModel):
    __slots__ = ()
    _fields = _names("profile", "spec")
    _extra = True


class Playbook(PlaybookBase, ReadyModel):
    __slots__ = ()
    _fields = _names(
        "api_version", "kind", "metadata", "keychain", "executor", "workload", "workflow", "workbook",
        "source_file",
    )  # fmt: skip
    _private = frozenset({"_steps"})


# the models a cache entry can hold, by name; the models without a twin (FramePolicy, Partitions,
# DagsterSpec) are built on demand and never stored in a playbook
TWINS: dict[str, type[ReadyModel]] = {
    cls.__name__: cls
    for cls in (SetBlock, RuleThen, PolicyRule, AdmitRule, Cursor, Loop, Task, Arc, Router, OutputCheck,
                Output, Step, WorkbookEntry, Metadata, Executor, Playbook)
}  # fmt: skip


class _ReadyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == _MODEL_MODULE:
            twin = TWINS.get(name)
            if twin is None:  # a model this form does not know: the caller unpickles the model instead
                raise pickle.UnpicklingError(f"no ready-to-run form of {module}.{name}")
            return twin
        return super().find_class(module, name)


def load_ready(data: bytes) -> Any:
    """A pickled ``dsl.model`` object (a parse-cache entry) as its twins: no pydantic imported."""
    return _ReadyUnpickler(io.BytesIO(data)).load()
