"""Sandboxed Jinja2 templates (SEMANTICS.md §2).

* A string that is exactly one ``{{ expression }}`` yields the expression's
  native value (int, list, dict...); any other template yields a string.
* Undefined names are chainable and falsy, so ``default()`` applies.
* A syntax error or an exception while rendering raises :class:`TemplateError`
  naming the template; the engine turns it into an error outcome.
* Compiled templates are cached by source, so a step that runs 10,000 times
  compiles its templates once.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import jinja2
from jinja2 import ChainableUndefined, nodes
from jinja2.sandbox import SandboxedEnvironment

_SINGLE_EXPR = re.compile(r"^\s*\{\{(?P<expr>.*)\}\}\s*$", re.S)


class TemplateError(Exception):
    def __init__(self, template: str, message: str):
        short = template if len(template) <= 160 else template[:157] + "..."
        super().__init__(f"template {short!r}: {message}")
        self.template = template
        self.message = message


class _Undefined(ChainableUndefined):
    """Chainable, falsy, renders as ''; ``==`` against anything but another undefined is False."""

    __slots__ = ()

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, jinja2.Undefined) or other is None

    def __ne__(self, other: Any) -> bool:
        return not self.__eq__(other)

    __hash__ = ChainableUndefined.__hash__


def _tojson(value: Any, indent: int | None = None) -> str:
    from noetl_dagster.util.jsonutil import to_jsonable

    return json.dumps(value, default=to_jsonable, indent=indent)


def _fromjson(value: Any) -> Any:
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def _b64encode(value: Any) -> str:
    data = value.encode() if isinstance(value, str) else bytes(value)
    return base64.b64encode(data).decode()


def _b64decode(value: Any) -> str:
    return base64.b64decode(value).decode()


def _is_defined(value: Any) -> bool:
    return not isinstance(value, jinja2.Undefined)


class _WithGlobals(Mapping):
    """The render scope, then the environment globals (range, len...): a shared
    context skips Jinja's own globals merge, so they are layered in here."""

    __slots__ = ("scope", "globals")

    def __init__(self, scope: Mapping[str, Any], globals_: Mapping[str, Any]):
        self.scope = scope
        self.globals = globals_

    def __getitem__(self, key: str) -> Any:
        if key in self.scope:
            return self.scope[key]
        return self.globals[key]

    def __contains__(self, key: object) -> bool:
        return key in self.scope or key in self.globals

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(self.globals), **dict.fromkeys(self.scope)})

    def __len__(self) -> int:
        return sum(1 for _ in self)


class _Env(SandboxedEnvironment):
    """``x.key`` on a mapping reads the key first, so ``workload.items`` is the value, not ``dict.items``."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, Mapping):
            try:
                return obj[attribute]
            except (KeyError, TypeError):
                pass
        return super().getattr(obj, attribute)


class TemplateEnv:
    def __init__(self) -> None:
        env = _Env(undefined=_Undefined, autoescape=False, keep_trailing_newline=True)
        env.filters.update(
            tojson=_tojson,
            to_json=_tojson,
            fromjson=_fromjson,
            from_json=_fromjson,
            b64encode=_b64encode,
            b64decode=_b64decode,
        )
        env.globals.update(
            range=range, len=len, str=str, int=int, float=float, bool=bool, dict=dict, list=list,
            min=min, max=max, sum=sum, sorted=sorted, abs=abs, round=round, enumerate=enumerate, zip=zip,
            is_defined=_is_defined,
        )  # fmt: skip
        self.env = env
        self._expr_cache: dict[str, Any] = {}
        self._tmpl_cache: dict[str, jinja2.Template] = {}

    # -- compilation -------------------------------------------------------
    @staticmethod
    def is_template(value: Any) -> bool:
        return isinstance(value, str) and ("{{" in value or "{%" in value)

    def check_syntax(self, source: str) -> str | None:
        """Return an error message when ``source`` does not parse, else None."""
        try:
            self.env.parse(source)
        except jinja2.TemplateSyntaxError as e:
            return f"line {e.lineno}: {e.message}"
        return None

    def _expression(self, source: str, expr: str) -> Any:
        compiled = self._expr_cache.get(source)
        if compiled is None:
            try:
                compiled = self.env.compile_expression(expr, undefined_to_none=False)
            except jinja2.TemplateSyntaxError as e:
                raise TemplateError(source, f"syntax error: {e.message}") from None
            self._expr_cache[source] = compiled
        return compiled

    def _template(self, source: str) -> jinja2.Template:
        t = self._tmpl_cache.get(source)
        if t is None:
            try:
                t = self.env.from_string(source)
            except jinja2.TemplateSyntaxError as e:
                raise TemplateError(source, f"syntax error: {e.message}") from None
            self._tmpl_cache[source] = t
        return t

    # -- rendering ---------------------------------------------------------
    def render_str(self, source: str, scope: Mapping[str, Any]) -> Any:
        if "{{" not in source and "{%" not in source:
            return source
        m = _SINGLE_EXPR.match(source)
        if m and "{{" not in m.group("expr") and "}}" not in m.group("expr") and "{%" not in source:
            te = self._expression(source, m.group("expr"))
            tmpl = te._template
            try:
                ctx = tmpl.new_context(_WithGlobals(scope, self.env.globals), shared=True)  # no copy of the scope
                for _ in tmpl.root_render_func(ctx):
                    pass
                value = ctx.vars["result"]
            except TemplateError:
                raise
            except Exception as e:  # noqa: BLE001 - any render failure is an error outcome
                raise TemplateError(source, f"{type(e).__name__}: {e}") from None
            if isinstance(value, jinja2.Undefined):
                return None
            return value
        tmpl = self._template(source)
        try:
            ctx = tmpl.new_context(_WithGlobals(scope, self.env.globals), shared=True)
            return tmpl.environment.concat(tmpl.root_render_func(ctx))  # type: ignore[attr-defined]
        except Exception as e:  # noqa: BLE001
            raise TemplateError(source, f"{type(e).__name__}: {e}") from None

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

    def referenced_names(self, source: str) -> set[str]:
        """Top-level names a template reads (used by the translator for data dependencies)."""
        try:
            ast = self.env.parse(source)
        except jinja2.TemplateSyntaxError:
            return set()
        return {n.name for n in ast.find_all(nodes.Name) if n.ctx == "load"}


_ENV: TemplateEnv | None = None


def template_env() -> TemplateEnv:
    global _ENV
    if _ENV is None:
        _ENV = TemplateEnv()
    return _ENV


def iter_template_strings(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, str]]:
    if isinstance(value, str):
        if "{{" in value or "{%" in value:
            yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from iter_template_strings(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from iter_template_strings(v, (*path, i))
