"""The template gate's front, without Jinja2 (issue 35: a run whose playbook renders no template
does not import Jinja2, ~25 ms of start-up).

:class:`TemplateWalk` renders values: strings inside dicts and lists, ``when`` conditions; a string
without ``{{`` or ``{%`` is itself. Only a template string reaches ``_render_template``: the gate's
:class:`~noetl_dagster.dsl.templates.TemplateEnv` (sandbox, limits, caches) implements it, and the
engine's renderer (dsl/template_lazy.py) hands it to that gate, imported at the first template.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping
from typing import Any

# a single expression that is a dotted name, optionally compared with or combined with an integer
# literal (`{{ workload.n * 2 }}`, `{{ ctx.i < 10 }}`): evaluated here without Jinja when every
# step of the name is a mapping's key (what the gate's lookups return then) and the value is a
# small number (no limit can apply); anything else, or a miss, renders through the gate
_QUICK_EXPR = re.compile(
    r"^\{\{\s*([A-Za-z_][A-Za-z0-9_]*(?:\s*\.\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*"
    r"(?:(\+|-|\*|<=|>=|==|!=|<|>)\s*([0-9]{1,9})\s*)?\}\}\n?\Z"
)
_QUICK_OPS = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "<": operator.lt, "<=": operator.le,
    ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
}  # fmt: skip
# Jinja's literals, keywords and special names: never a scope's name here
_NOT_A_NAME = frozenset(
    "true false none True False None and or not in is if else self loop super caller varargs kwargs".split()
)
_NOT_QUICK: tuple = ()
QUICK_MISS = object()


def _quick_form(source: str) -> tuple:
    """``(path, op, literal)`` of a quick expression, else ``_NOT_QUICK``."""
    m = _QUICK_EXPR.match(source)
    if m is None:
        return _NOT_QUICK
    path = tuple(part.strip() for part in m.group(1).split("."))
    if path[0] in _NOT_A_NAME:
        return _NOT_QUICK
    return (path, _QUICK_OPS[m.group(2)] if m.group(2) else None, int(m.group(3) or 0))


_QUICK_FORMS: dict[str, tuple] = {}


def render_quick(source: str, scope: Mapping[str, Any]) -> Any:
    """A quick expression's value as the gate renders it, or ``QUICK_MISS`` (the gate decides)."""
    form = _QUICK_FORMS.get(source)
    if form is None:
        if len(_QUICK_FORMS) > 4096:
            _QUICK_FORMS.clear()
        form = _QUICK_FORMS[source] = _quick_form(source)
    if not form:
        return QUICK_MISS
    path, op, literal = form
    try:
        value = scope[path[0]]
        for name in path[1:]:
            if not isinstance(value, Mapping):
                return QUICK_MISS
            value = value[name]
    except (KeyError, TypeError):
        return QUICK_MISS
    t = type(value)
    if t is float or (t is int and -(2**62) < value < 2**62):
        return value if op is None else op(value, literal)
    if op is None and (value is None or t is bool or (t is str and len(value) <= 65536)):
        return value
    return QUICK_MISS


class TemplateError(Exception):
    def __init__(self, template: str, message: str):
        short = template if len(template) <= 160 else template[:157] + "..."
        super().__init__(f"template {short!r}: {message}")
        self.template = template
        self.message = message


class TemplateWalk:
    """Rendering of values and conditions; templates themselves by ``_render_template``."""

    @staticmethod
    def is_template(value: Any) -> bool:
        return isinstance(value, str) and ("{{" in value or "{%" in value)

    def _render_template(self, source: str, scope: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    def render_str(self, source: str, scope: Mapping[str, Any]) -> Any:
        if "{{" not in source and "{%" not in source:
            return source
        return self._render_template(source, scope)

    def render(self, value: Any, scope: Mapping[str, Any]) -> Any:
        """Render every string inside ``value`` (dicts and lists recursively)."""
        if isinstance(value, str):
            return self.render_str(value, scope)
        if isinstance(value, dict):
            return {k: self.render(v, scope) for k, v in value.items()}
        if isinstance(value, list):
            return [self.render(v, scope) for v in value]
        return value

    def truthy(self, value: Any, scope: Mapping[str, Any]) -> bool:
        """Evaluate a condition (``when``); strings like 'false', '0', 'none', '' are false."""
        if value is None:
            return True
        v = self.render(value, scope) if isinstance(value, str) else value
        if isinstance(v, str):
            return v.strip().lower() not in ("", "false", "0", "no", "none", "null")
        return bool(v)
