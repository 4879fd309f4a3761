"""The Grafana dashboard JSON against Grafana's own dashboard schema (issue 18.4), through the
official ``grafana-foundation-sdk`` package (PyPI, Grafana Labs, Apache-2.0): its models are
generated (by cog) from Grafana's schema — the dashboard kind and each panel plugin's options
and field config — so they name every field Grafana knows and its type.

The SDK's ``from_json`` silently drops what it does not know, so the check is strict on top of it:

- field names: the dashboard decoded and encoded again must keep every key we wrote (a key
  the schema does not name is dropped, and reported with its path);
- types: every decoded field's value matches the model's annotation (int/float/str/bool,
  literals and enums, lists, nested models, unions), recursing into plugin options
  (``stat``/``timeseries``/``barchart`` option models) and field config.

The export envelope (``__inputs`` / ``__requires``, which Grafana's import strips) is checked by
tests/analytics/test_grafana_schema.py; the ClickHouse query targets have no model in the SDK
(they stay an opaque data query), so their keys are checked there too."""

from __future__ import annotations

import copy
import enum
import json
import types
import typing

import pytest
from grafana_foundation_sdk.cog import encoder, plugins  # dev extra: grafana-foundation-sdk
from grafana_foundation_sdk.models import dashboard as gdash

from noetl_analytics.dashboard_access import Viewer
from noetl_analytics.grafana import GRAFANA_JSON, build_dashboard

plugins.register_default_plugins()
# the SDK steers new code to dashboard schema v2; our JSON is the classic (v1) model Grafana imports
pytestmark = pytest.mark.filterwarnings("ignore:Prefer using dashboardv2:DeprecationWarning")


_MODELS = "grafana_foundation_sdk.models."


def _missing(ours: typing.Any, kept: typing.Any, path: str) -> list[str]:
    """Paths of keys in ``ours`` that the round trip through the models dropped."""
    out: list[str] = []
    if isinstance(ours, dict):
        if not isinstance(kept, dict):
            return [f"{path}: not an object in the schema"]
        for k, v in ours.items():
            if k not in kept:
                out.append(f"{path}.{k}: unknown field (the schema has no {k!r} here)")
            else:
                out += _missing(v, kept[k], f"{path}.{k}")
    elif isinstance(ours, list) and isinstance(kept, list):
        for i, (a, b) in enumerate(zip(ours, kept, strict=False)):
            out += _missing(a, b, f"{path}[{i}]")
    return out


def _type_errors(value: typing.Any, hint: typing.Any, path: str) -> list[str]:
    if hint in (typing.Any, object):  # plugin options / field config: the plugin's model, if it has one
        return _model_errors(value, path) if type(value).__module__.startswith(_MODELS) else []
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return []
        options = [a for a in args if a is not type(None)]
        shaped = [a for a in options if _same_shape(value, a)]
        if len(options) == 1 or len(shaped) == 1:  # one candidate: its errors, with their paths
            return _type_errors(value, (shaped or options)[0], path)
        tried = [_type_errors(value, a, path) for a in options]
        return [] if any(not e for e in tried) else [f"{path}: {value!r} is none of {hint}"]
    if origin is typing.Literal:
        return [] if value in args else [f"{path}: {value!r} not one of {args}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        return [
            e
            for i, v in enumerate(value)
            for e in _type_errors(v, args[0] if args else typing.Any, f"{path}[{i}]")
        ]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {type(value).__name__}"]
        return [
            e
            for k, v in value.items()
            for e in _type_errors(v, args[1] if args else typing.Any, f"{path}.{k}")
        ]
    if not isinstance(hint, type):
        return []
    if issubclass(hint, enum.Enum):
        ok = isinstance(value, hint) or value in {m.value for m in hint}
        return [] if ok else [f"{path}: {value!r} not one of {[m.value for m in hint]}"]
    if hint is bool:
        return [] if isinstance(value, bool) else [f"{path}: expected a boolean, got {value!r}"]
    if hint is int:
        return (
            []
            if isinstance(value, int) and not isinstance(value, bool)
            else [f"{path}: expected an integer, got {value!r}"]
        )
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return [] if ok else [f"{path}: expected a number, got {value!r}"]
    if hint is str:
        return [] if isinstance(value, str) else [f"{path}: expected a string, got {value!r}"]
    if hasattr(hint, "from_json"):  # a schema model
        if isinstance(value, dict):  # kept raw by the parent's decoder: decode and check it too
            model = hint.from_json(value)
            return _missing(value, _encoded(model), path) + _model_errors(model, path)
        if isinstance(value, hint):
            return _model_errors(value, path)
        return [f"{path}: expected {hint.__name__}, got {type(value).__name__}"]
    return (
        [] if isinstance(value, hint) else [f"{path}: expected {hint.__name__}, got {type(value).__name__}"]
    )


def _same_shape(value: typing.Any, hint: typing.Any) -> bool:
    """Whether ``value`` is of the union member ``hint``'s outer kind (list, model class…)."""
    origin = typing.get_origin(hint) or hint
    return isinstance(origin, type) and isinstance(value, origin)


def _model_errors(model: typing.Any, path: str) -> list[str]:
    hints = typing.get_type_hints(type(model))
    return [
        e
        for attr, hint in hints.items()
        for e in _type_errors(getattr(model, attr, None), hint, f"{path}.{attr}")
    ]


def _encoded(model: typing.Any) -> typing.Any:
    return json.loads(json.dumps(model, cls=encoder.JSONEncoder))


def schema_errors(dashboard: dict[str, typing.Any]) -> list[str]:
    """What Grafana's dashboard schema (the SDK's models) finds wrong in ``dashboard``."""
    body = {k: v for k, v in dashboard.items() if not k.startswith("__")}  # the import envelope
    model = gdash.Dashboard.from_json(body)
    return _missing(body, _encoded(model), "$") + _model_errors(model, "$")


def test_our_dashboard_passes_grafanas_schema():
    assert schema_errors(build_dashboard(viewer=Viewer.everyone())) == []
    assert schema_errors(json.loads(GRAFANA_JSON.read_text())) == []


def test_panel_options_are_checked_against_the_plugins_models():
    model = gdash.Dashboard.from_json(
        {k: v for k, v in build_dashboard(viewer=Viewer.everyone()).items() if not k.startswith("__")}
    )
    kinds = {p.type_val: type(p.options).__module__.rsplit(".", 1)[-1] for p in model.panels}
    assert kinds == {"stat": "stat", "timeseries": "timeseries", "barchart": "barchart"}


@pytest.mark.parametrize(
    ("where", "edit", "expected"),
    [
        (
            "panel key",
            lambda d: d["panels"][1].__setitem__("gridpos", d["panels"][1].pop("gridPos")),
            "$.panels[1].gridpos: unknown field",
        ),
        (
            "dashboard key",
            lambda d: d.__setitem__("schema_version", d.pop("schemaVersion")),
            "$.schema_version: unknown field",
        ),
        (
            "grid key",
            lambda d: d["panels"][0]["gridPos"].__setitem__("width", d["panels"][0]["gridPos"].pop("w")),
            "$.panels[0].gridPos.width: unknown field",
        ),
        (
            "plugin option",
            lambda d: d["panels"][0]["options"].__setitem__("colourMode", "none"),
            "$.panels[0].options.colourMode: unknown field",
        ),
        (
            "field config",
            lambda d: d["panels"][0]["fieldConfig"]["defaults"].__setitem__("units", "ms"),
            "$.panels[0].fieldConfig.defaults.units: unknown field",
        ),
    ],
)
def test_a_misnamed_field_fails_with_its_path(where, edit, expected):
    broken = copy.deepcopy(build_dashboard(viewer=Viewer.everyone()))
    edit(broken)
    errors = schema_errors(broken)
    assert any(e.startswith(expected) for e in errors), (where, errors)


def test_a_wrongly_typed_field_fails():
    broken = copy.deepcopy(build_dashboard(viewer=Viewer.everyone()))
    broken["panels"][0]["gridPos"]["w"] = "24"
    broken["editable"] = "yes"
    broken["panels"][0]["options"]["textMode"] = "loud"
    errors = schema_errors(broken)
    assert any(e.startswith("$.panels[0].grid_pos.w: expected an integer") for e in errors), errors
    assert any(e.startswith("$.editable: expected a boolean") for e in errors), errors
    assert any(e.startswith("$.panels[0].options.text_mode:") for e in errors), errors
