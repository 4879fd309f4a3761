"""Sandboxed Jinja2 templates (SEMANTICS.md §2).

* A string that is exactly one ``{{ expression }}`` yields the expression's
  native value (int, list, dict...); any other template yields a string.
* Undefined names are chainable and falsy, so ``default()`` applies.
* A syntax error or an exception while rendering raises :class:`TemplateError`
  naming the template; the engine turns it into an error outcome.
* Compiled templates are cached by source, so a step that runs 10,000 times
  compiles its templates once.
* The sandbox is immutable (``ctx.update(...)``, ``list.append(...)`` are
  security errors) and bounded (docs/limits.md): ``range`` is capped at
  :data:`MAX_RANGE` items, operators, padding/format/replace calls and the
  produced value are capped at :data:`MAX_STR` characters and
  :data:`MAX_ITEMS` items, :data:`MAX_VALUE_DEPTH` levels, and one render at
  :data:`RENDER_SECONDS` seconds. Each limit is a TemplateError naming the template.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
import types
from collections.abc import Iterator, Mapping
from typing import Any

import jinja2
from jinja2 import ChainableUndefined, nodes
from jinja2.exceptions import SecurityError
from jinja2.filters import do_center, do_format, do_indent, do_replace, do_wordwrap
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment, safe_range
from jinja2.utils import Namespace, generate_lorem_ipsum

# exactly one expression yields the native value (SEMANTICS §2); padding makes it a string
# (only the one trailing newline a YAML block scalar adds is tolerated)
_SINGLE_EXPR = re.compile(r"^\{\{(?P<expr>.*)\}\}\n?$", re.S)

MAX_STR = 16 * 1024 * 1024  # characters in one produced string
MAX_ITEMS = 1_000_000  # items in one produced list/dict (and in the whole rendered value)
MAX_VALUE_DEPTH = 100  # nesting of a rendered value
MAX_INT_BITS = 100_000  # size of an integer an operator may produce
RENDER_SECONDS = 5.0  # wall time of one render
__all__ = ["MAX_RANGE", "TemplateError", "TemplateEnv", "template_env", "iter_template_strings"]


class _LimitExceeded(Exception):
    """A template produced (or was about to produce) something beyond a limit."""


_deadline = threading.local()


def _tick() -> None:
    end = getattr(_deadline, "at", None)
    if end is not None and time.monotonic() > end:
        raise _LimitExceeded(f"render took longer than {RENDER_SECONDS:g} s")


def _sized(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict)) else 0


def _check_len(n: int, what: str = "value") -> None:
    if n > MAX_STR:
        raise _LimitExceeded(f"{what} would have {n} items/characters; the limit is {MAX_STR}")


def _big_int_arg(args: Any, kwargs: Mapping[str, Any] | None = None) -> None:
    for v in (*args, *(kwargs or {}).values()):
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_STR:
            raise _LimitExceeded(f"argument {v} is beyond the size limit {MAX_STR}")


def _bounded(f: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _big_int_arg(args[1:], kwargs)
        out = f(*args, **kwargs)
        _check_len(_sized(out))
        return out

    wrapper.__name__ = getattr(f, "__name__", "filter")
    wrapper.jinja_pass_arg = getattr(f, "jinja_pass_arg", None)  # type: ignore[attr-defined]
    return wrapper


def _replace_filter(*args: Any, **kwargs: Any) -> Any:
    # do_replace(eval_ctx, s, old, new, count=None)
    s, new = (args[1] if len(args) > 1 else ""), (args[3] if len(args) > 3 else kwargs.get("new", ""))
    _check_len(
        len(str(s)) * max(1, len(str(new)))
        if str(args[2] if len(args) > 2 else "") == "" or len(str(new)) > 1
        else len(str(s))
    )
    return do_replace(*args, **kwargs)


_replace_filter.jinja_pass_arg = do_replace.jinja_pass_arg  # type: ignore[attr-defined]


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002 - Jinja's signature
    """Jinja's ``lipsum`` with bounded counts (``lipsum(10**6)`` used to render for minutes)."""
    if not (0 <= n <= 1_000 and 0 <= min <= max <= 1_000):
        raise _LimitExceeded("lipsum() takes at most 1000 paragraphs of at most 1000 words")
    return generate_lorem_ipsum(n=n, html=html, min=min, max=max)


class _BoundedNamespace(Namespace):
    """``namespace()`` whose attributes cannot grow past the size limits (``ns.s = ns.s ~ ns.s``)."""

    def __setitem__(self, name: str, value: Any) -> None:  # type: ignore[override]
        _tick()
        _check_len(_sized(value), f"namespace attribute {name!r}")
        super().__setitem__(name, value)


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
        _tick()  # every name lookup (incl. once per outer loop iteration) checks the render deadline
        if key in self.scope:
            return self.scope[key]
        return self.globals[key]

    def __contains__(self, key: object) -> bool:
        return key in self.scope or key in self.globals

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(self.globals), **dict.fromkeys(self.scope)})

    def __len__(self) -> int:
        return sum(1 for _ in self)


_PADDING = frozenset(
    {"center", "ljust", "rjust", "zfill", "expandtabs", "format", "format_map", "join", "replace"}
)


class _Env(ImmutableSandboxedEnvironment):
    """``x.key`` on a mapping reads the key first, so ``workload.items`` is the value, not ``dict.items``.

    Immutable (no ``append``/``update``/...), with size-checked operators and calls."""

    intercepted_binops = frozenset({"*", "**", "+", "%", "//", "<<"})

    def getattr(self, obj: Any, attribute: str) -> Any:
        _tick()
        if isinstance(obj, Mapping):
            try:
                return obj[attribute]
            except (KeyError, TypeError):
                pass
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _tick()
        return super().getitem(obj, argument)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _tick()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(n, int) and _sized(seq):
                    _check_len(len(seq) * max(n, 0), "repetition")
            if isinstance(left, int) and isinstance(right, int):
                if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                    raise _LimitExceeded(f"integer product beyond {MAX_INT_BITS} bits")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0:
                if max(left.bit_length(), 1) * right > MAX_INT_BITS and abs(left) > 1:
                    raise _LimitExceeded(f"integer power beyond {MAX_INT_BITS} bits")
        elif operator == "<<":
            if isinstance(right, int) and right > MAX_INT_BITS:
                raise _LimitExceeded(f"shift beyond {MAX_INT_BITS} bits")
        elif operator == "+":
            if _sized(left) and _sized(right):
                _check_len(len(left) + len(right), "concatenation")
        elif operator == "%" and isinstance(left, str):
            _big_int_arg(right if isinstance(right, tuple) else (right,))
            if re.search(r"\d{8,}", left):
                raise _LimitExceeded("format width beyond the size limit")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _tick()
        owner = getattr(__obj, "__self__", None)
        if owner is None:  # the sandbox wraps str.format in a plain function
            owner = getattr(getattr(__obj, "__wrapped__", None), "__self__", None)
        if isinstance(owner, str) and getattr(__obj, "__name__", "") in _PADDING:
            _big_int_arg(args, kwargs)
            if __obj.__name__ in ("format", "format_map") and re.search(r"\d{8,}", owner):
                raise _LimitExceeded("format width beyond the size limit")
            if __obj.__name__ == "replace" and len(args) >= 2:
                _check_len(
                    len(owner) * max(1, len(str(args[1])))
                    if len(str(args[1])) > len(str(args[0]))
                    else len(owner)
                )
        out = super().call(__context, __obj, *args, **kwargs)
        _check_len(_sized(out))
        return out


class TemplateEnv:
    def __init__(self) -> None:
        env = _Env(undefined=_Undefined, autoescape=False, keep_trailing_newline=True)
        env.filters.update(
            center=_bounded(do_center),
            indent=_bounded(do_indent),
            wordwrap=_bounded(do_wordwrap),
            format=_bounded(do_format),
            replace=_replace_filter,
            tojson=_tojson,
            to_json=_tojson,
            fromjson=_fromjson,
            from_json=_fromjson,
            b64encode=_b64encode,
            b64decode=_b64decode,
        )
        env.globals.update(
            range=safe_range, namespace=_BoundedNamespace, lipsum=_lipsum, len=len, str=str, int=int, float=float, bool=bool, dict=dict, list=list,
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
    def _context(self, tmpl: jinja2.Template, scope: Mapping[str, Any]) -> jinja2.runtime.Context:
        """A shared context over the scope (no copy of it), as ``tmpl.new_context(vars, shared=True)``
        builds it minus the set of the template's global names it collects for module exports,
        which rendering never reads (an iteration over every global at every render)."""
        return self.env.context_class(self.env, _WithGlobals(scope, self.env.globals), tmpl.name, tmpl.blocks)

    def render_str(self, source: str, scope: Mapping[str, Any]) -> Any:
        if "{{" not in source and "{%" not in source:
            return source
        m = _SINGLE_EXPR.match(source)
        if m and "{{" not in m.group("expr") and "}}" not in m.group("expr") and "{%" not in source:
            te = self._expression(source, m.group("expr"))
            tmpl = te._template
            outer = getattr(_deadline, "at", None)
            if outer is None:
                _deadline.at = time.monotonic() + RENDER_SECONDS
            try:
                ctx = self._context(tmpl, scope)
                for _ in tmpl.root_render_func(ctx):
                    pass
                return _plain(ctx.vars["result"])
            except TemplateError:
                raise
            except _LimitExceeded as e:
                raise TemplateError(source, f"limit: {e}") from None
            except RecursionError:
                raise TemplateError(source, "limit: recursion too deep (a self-referencing value?)") from None
            except Exception as e:  # noqa: BLE001 - any render failure is an error outcome
                raise TemplateError(source, f"{type(e).__name__}: {e}") from None
            finally:
                if outer is None:
                    _deadline.at = None
        tmpl = self._template(source)
        outer = getattr(_deadline, "at", None)
        if outer is None:
            _deadline.at = time.monotonic() + RENDER_SECONDS
        try:
            ctx = self._context(tmpl, scope)
            parts: list[str] = []
            size = 0
            for chunk in tmpl.root_render_func(ctx):
                size += len(chunk)
                _check_len(size, "output")
                _tick()
                parts.append(chunk)
            return "".join(parts)
        except _LimitExceeded as e:
            raise TemplateError(source, f"limit: {e}") from None
        except RecursionError:
            raise TemplateError(source, "limit: recursion too deep (a self-referencing value?)") from None
        except Exception as e:  # noqa: BLE001
            raise TemplateError(source, f"{type(e).__name__}: {e}") from None
        finally:
            if outer is None:
                _deadline.at = None

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


def _plain(value: Any) -> Any:
    """A single expression's native value as plain data, within the limits.

    Undefined -> None; generators/iterators -> lists; other mappings -> dicts;
    an unsafe attribute (``map(attribute='__class__')``) -> security error;
    self-references and oversize values -> limit errors."""
    budget = [MAX_ITEMS]

    def walk(v: Any, depth: int) -> Any:
        if v is None or isinstance(v, (bool, int, float)):
            return v
        if isinstance(v, str):
            _check_len(len(v), "string")
            return v
        if isinstance(v, jinja2.Undefined):
            if getattr(v, "_undefined_exception", None) is SecurityError:
                raise SecurityError(f"access to {v._undefined_name!r} is not allowed")  # type: ignore[attr-defined]
            return None
        if depth > MAX_VALUE_DEPTH:
            raise _LimitExceeded(f"value nested deeper than {MAX_VALUE_DEPTH} levels (a self-reference?)")
        if isinstance(v, (list, tuple, types.GeneratorType, map, filter, zip, enumerate, reversed)) or (
            isinstance(v, Iterator) and not isinstance(v, (bytes, Mapping))
        ):
            out = []
            for item in v:
                budget[0] -= 1
                if budget[0] < 0:
                    raise _LimitExceeded(f"value has more than {MAX_ITEMS} items")
                _tick()
                out.append(walk(item, depth + 1))
            return tuple(out) if isinstance(v, tuple) else out
        if isinstance(v, Mapping):
            budget[0] -= len(v)
            if budget[0] < 0:
                raise _LimitExceeded(f"value has more than {MAX_ITEMS} items")
            _tick()
            return {k: walk(x, depth + 1) for k, x in v.items()}
        if isinstance(v, (range, set, frozenset)):
            return walk(list(v), depth)
        return v  # dates, decimals, bytes...: the JSON encoder handles or refuses them

    return walk(value, 0)


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
