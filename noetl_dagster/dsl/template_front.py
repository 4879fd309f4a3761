"""The template gate's front, without Jinja2 (issue 35: a run whose playbook renders no template
does not import Jinja2, ~25 ms of start-up).

:class:`TemplateWalk` renders values: strings inside dicts and lists, ``when`` conditions; a string
without ``{{`` or ``{%`` is itself. Only a template string reaches ``_render_template``: the gate's
:class:`~noetl_dagster.dsl.templates.TemplateEnv` (sandbox, limits, caches) implements it, and the
engine's renderer (dsl/template_lazy.py) hands it to that gate, imported at the first template.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
