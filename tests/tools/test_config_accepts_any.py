"""A kind whose config model no string-keyed mapping can fail (noop: every field Any, extra keys
allowed, no validator) is not validated, so its validator is never built (issue 35: building it cost
a one-step run ~30 ms, half of it pydantic's plugin scan of every installed distribution). Every
other model is validated as before: a typed field, a constraint, a required field, a validator of
any kind, forbidden extra keys or a non-string key still fail with ``invalid config``."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ConfigDict, Field, field_validator, model_validator

from noetl_dagster.dsl import kinds
from noetl_dagster.dsl.kinds import ToolConfigError, ToolKind
from noetl_dagster.tools.configs import NoopConfig, PythonConfig, ToolConfig


def _kind(model: type) -> ToolKind:
    return ToolKind(name="probe", fn=lambda inputs, ctx: inputs, config=model)


def test_noop_config_is_not_validated(monkeypatch):
    calls = []
    real = NoopConfig.model_validate.__func__
    monkeypatch.setattr(
        NoopConfig, "model_validate", classmethod(lambda cls, *a, **k: calls.append(a) or real(cls, *a, **k))
    )
    kinds._VALID.clear()
    kind = kinds.get_tool("noop")
    kind.check_config({"result": {"a": [1, 2]}, "input": {"x": object()}, "any_other_key": None})
    kind.check_config({})
    assert calls == []
    assert kinds._accepts_any(NoopConfig) and not kinds._accepts_any(PythonConfig)


class _Typed(ToolConfig):
    result: int | None = None


class _Constrained(ToolConfig):
    result: Any = Field(None, min_length=1)


class _Required(ToolConfig):
    result: Any


class _FieldValidator(ToolConfig):
    result: Any = None

    @field_validator("result")
    @classmethod
    def _no_x(cls, v: Any) -> Any:
        if v == "x":
            raise ValueError("no x")
        return v


class _ModelValidator(ToolConfig):
    result: Any = None

    @model_validator(mode="after")
    def _no_x(self) -> _ModelValidator:
        if self.result == "x":
            raise ValueError("no x")
        return self


class _Forbid(ToolConfig):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    result: Any = None


class _PostInit(ToolConfig):
    result: Any = None

    def model_post_init(self, context: Any) -> None:
        if self.result == "x":
            raise ValueError("no x")


class _OwnSchema(ToolConfig):
    result: Any = None

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        def no_x(v: Any) -> Any:
            if isinstance(v, dict) and v.get("result") == "x":
                raise ValueError("no x")
            return v

        return core_schema.no_info_before_validator_function(no_x, handler(source))


@pytest.mark.parametrize(
    ("model", "config"),
    [
        (_Typed, {"result": "x"}),
        (_Constrained, {"result": []}),
        (_Required, {}),
        (_FieldValidator, {"result": "x"}),
        (_ModelValidator, {"result": "x"}),
        (_Forbid, {"result": 1, "other": 2}),
        (_OwnSchema, {"result": "x"}),
        (NoopConfig, {1: "a non-string key"}),
    ],
    ids=[
        "typed",
        "constrained",
        "required",
        "field-validator",
        "model-validator",
        "extra-forbid",
        "own-schema",
        "int-key",
    ],
)
def test_a_model_that_can_fail_is_still_validated(model, config):
    kinds._VALID.clear()
    assert not kinds._accepts_any(model) or model is NoopConfig
    with pytest.raises(ToolConfigError, match="kind 'probe': invalid config"):
        _kind(model).check_config(config)


def test_model_post_init_is_still_run():
    kinds._VALID.clear()
    assert not kinds._accepts_any(_PostInit)
    with pytest.raises((ToolConfigError, ValueError)):
        _kind(_PostInit).check_config({"result": "x"})


def test_each_declared_plain_config_is_what_its_model_is():
    """Built-in kinds name their config by reference and declare it plain (``plain_config``: a call
    validates nothing and imports no model, issue 35); the declaration must be the model's own."""
    declared = {}
    for name in sorted(kinds.builtin_kinds()):
        tk = kinds.get_tool(name)
        if tk is not None and tk.plain_config is not None:
            declared[name] = tk.plain_config
            assert kinds._plain_fields(tk.config) == tk.plain_config, name
    assert {"noop", "python", "workbook"} <= set(declared)


@pytest.mark.parametrize(
    ("kind", "config"),
    [
        ("python", {"code": 5}),
        ("python", {"code_b64": ["not", "text"]}),
        ("workbook", {"name": {"a": 1}}),
        ("noop", {1: "a non-string key"}),
    ],
)
def test_a_config_outside_the_declaration_is_validated_by_the_model(kind, config):
    kinds._VALID.clear()
    with pytest.raises(ToolConfigError, match=f"kind '{kind}': invalid config"):
        kinds.get_tool(kind).check_config(config)


def test_a_plain_declaration_passes_what_the_model_passes():
    tk = kinds.get_tool("python")
    for config in ({"code": "result = 1"}, {"code": None, "code_b64": "eA==", "libs": {"m": "math"}}, {}):
        tk.check_config(config)
        tk.config.model_validate(config)


def test_plain_fields_refuses_what_could_fail():
    assert kinds._plain_fields(_Typed) is None and kinds._plain_fields(_Constrained) is None

    class _Limited(ToolConfig):
        model_config = ConfigDict(extra="allow", str_max_length=3, defer_build=True)
        code: str | None = None

    class _Aliased(ToolConfig):
        code: str | None = Field(None, alias="source")

    assert kinds._plain_fields(_Limited) is None and kinds._plain_fields(_Aliased) is None
    assert kinds._plain_fields(PythonConfig) == {"code", "code_b64", "code_base64"}
