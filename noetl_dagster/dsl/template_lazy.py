"""The engine's renderer (issue 35): :class:`~noetl_dagster.dsl.template_front.TemplateWalk` over
values and conditions, each template rendered by the one gate (``dsl.templates.template_env()``),
which, with Jinja2, is imported when the first template renders: a run whose playbook renders none
does not import Jinja2 (~25 ms of start-up)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from noetl_dagster.dsl.template_front import QUICK_MISS, TemplateWalk, render_quick


class _GateOnFirstTemplate(TemplateWalk):
    """The engine's renderer: the walk here, every template through the one gate
    (``dsl.templates.template_env()``), imported when the first template renders."""

    _gate_render = None

    def _render_template(self, source: str, scope: Mapping[str, Any]) -> Any:
        value = render_quick(source, scope)  # `{{ workload.n * 2 }}` needs no Jinja (~25 ms to import)
        if value is not QUICK_MISS:
            return value
        if self._gate_render is None:
            from noetl_dagster.dsl.templates import template_env  # noqa: PLC0415 - Jinja2 at the first template

            self._gate_render = template_env()._render_template
        return self._gate_render(source, scope)

    def __getattr__(self, name: str) -> Any:  # the gate's other methods (check_syntax, ...)
        from noetl_dagster.dsl.templates import template_env  # noqa: PLC0415 - Jinja2 at first use

        return getattr(template_env(), name)


_FRONT = _GateOnFirstTemplate()


def engine_template_env() -> TemplateWalk:
    """The renderer the engine holds: ``template_env()``'s rendering, Jinja2 imported at the first template."""
    return _FRONT
