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
import math
import re
import types
from collections.abc import Iterator, Mapping
from typing import Any

import jinja2
from jinja2 import ChainableUndefined, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.filters import make_attrgetter
from jinja2.runtime import Macro
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment, safe_range
from jinja2.utils import Namespace, generate_lorem_ipsum, pass_environment, pass_eval_context

from noetl_dagster.dsl import template_limits as lim
from noetl_dagster.dsl import template_sizes as sizes
from noetl_dagster.dsl.template_front import TemplateError, TemplateWalk
from noetl_dagster.dsl.template_limits import (
    MAX_INT_BITS,
    MAX_ITEMS,
    MAX_STR,
    MAX_VALUE_CHARS,
    MAX_VALUE_DEPTH,
    RENDER_SECONDS,
    check_result,
    produce,
    text_len,
    tick,
    width_of,
)
from noetl_dagster.dsl.template_limits import LimitExceeded as _LimitExceeded

# exactly one expression yields the native value (SEMANTICS §2); padding makes it a string
# (only the one trailing newline a YAML block scalar adds is tolerated)
_SINGLE_EXPR = re.compile(r"^\{\{(?P<expr>.*)\}\}\n?$", re.S)
# a single expression that is a dotted name (`ctx.i`, `tick.result.rows`): read without Jinja when
# every step is a mapping's key (what Jinja's lookups return then: the scope's name, the sandbox's
# getattr reading a mapping's key first); anything else, or a miss, renders through Jinja
_PATH_EXPR = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*(?:\s*\.\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*\Z")
_NOT_A_PATH_HEAD = frozenset(
    "true false none True False None and or not in is if else self loop super caller varargs kwargs".split()
)
_MISS = object()

__all__ = ["MAX_RANGE", "MAX_STR", "MAX_ITEMS", "RENDER_SECONDS", "TemplateError", "TemplateEnv", "template_env",
           "iter_template_strings"]  # fmt: skip


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002 - Jinja's signature
    """Jinja's ``lipsum`` with bounded counts (``lipsum(10**6)`` used to render for minutes)."""
    if not (0 <= n <= 1_000 and 0 <= min <= max <= 1_000):
        raise _LimitExceeded("lipsum() takes at most 1000 paragraphs of at most 1000 words")
    tick(n * (min + max) * 3)  # Python code: ~0.7 us, five operations, per word
    out = generate_lorem_ipsum(n=n, html=html, min=min, max=max)
    produce(len(out), "lipsum")
    return out


def _sum(iterable: Any, start: Any = 0) -> Any:
    """``sum`` in linear time: lists/tuples are concatenated once, after checking the total size
    (``sum([[0]*1000]*10000, [])`` copied quadratically, out of reach of the deadline)."""
    items = lim.materialize(iterable, "sum")
    if isinstance(start, (list, tuple)):
        total = len(start)
        for x in items:
            if type(x) is not type(start):
                raise TypeError(
                    f'can only concatenate {type(start).__name__} (not "{type(x).__name__}") to {type(start).__name__}'
                )
            total += len(x)
        produce(total, "sum", items=True)
        out = list(start)
        for x in items:
            out.extend(x)
        return out if isinstance(start, list) else tuple(out)
    tick(1 + len(items) // 4)
    return check_result(sum(items, start), "sum")


@pass_environment
def _sum_filter(environment: Any, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
    if attribute is not None:
        iterable = map(make_attrgetter(environment, attribute), iterable)
    return _sum(iterable, start)


@pass_eval_context
def _join_filter(eval_ctx: Any, value: Any, d: Any = "", attribute: Any = None) -> str:
    """Jinja's ``join`` (no autoescape here), sized before joining: the items are str()'d first."""
    if attribute is not None:
        value = map(make_attrgetter(eval_ctx.environment, attribute), value)
    items = lim.materialize(value, "join")
    sep = sizes.as_str(d, "join")
    produce(lim.join_len(sep, items, True), "join", width=width_of(sep, *items[:64]))
    return sep.join([x if type(x) is str else str(x) for x in items])


def _guard_filter(name: str, f: Any) -> Any:
    """A filter that checks, before it runs, the size it would produce (``template_limits.FILTER_SIZES``;
    a filter missing there is treated as one that str()s its input)."""
    est = sizes.FILTER_SIZES.get(name, sizes.f_text)
    pass_arg = getattr(f, "jinja_pass_arg", None)
    lead = 0 if pass_arg is None else 1

    if est is None:  # output no larger than the input, or lazy

        def cheap(*args: Any, **kwargs: Any) -> Any:
            tick(4)  # a filter call costs a few operations' worth (~0.7 us)
            out = f(*args, **kwargs)
            return lim.counted(out) if type(out) is types.GeneratorType else out

        cheap.__name__ = getattr(f, "__name__", name)
        cheap.jinja_pass_arg = pass_arg  # type: ignore[attr-defined]
        return cheap

    def guarded(*args: Any, **kwargs: Any) -> Any:
        tick(4)
        if len(args) > lead:
            try:
                new = est(*args[lead:], **kwargs)
            except TypeError:
                new = None  # a wrong signature: the filter itself raises the right error
            if new is not None:
                args = (*args[:lead], *new)
        out = f(*args, **kwargs)
        if type(out) is types.GeneratorType:  # map, select, batch...: lazy, counted per item
            return lim.counted(out)
        return check_result(out, name)

    guarded.__name__ = getattr(f, "__name__", name)
    guarded.jinja_pass_arg = pass_arg  # type: ignore[attr-defined]
    return guarded


class _BoundedNamespace(Namespace):
    """``namespace()`` whose attributes cannot grow past the size limits (``ns.s = ns.s ~ ns.s``)."""

    def __setitem__(self, name: str, value: Any) -> None:  # type: ignore[override]
        tick()
        check_result(value, f"namespace attribute {name!r}")
        super().__setitem__(name, value)


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
        tick()
        if key in self.scope:
            return self.scope[key]
        return self.globals[key]

    def __contains__(self, key: object) -> bool:
        return key in self.scope or key in self.globals

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(self.globals), **dict.fromkeys(self.scope)})

    def __len__(self) -> int:
        return sum(1 for _ in self)


class _CodeGenerator(CodeGenerator):
    """Jinja's code generator with three more hooks into the sandbox (which has none for them):
    every ``for`` iteration ticks the render budget (nested loops over a ``{% set %}`` list
    do no lookup, call or output), ``~`` is sized before it joins, and so is a slice."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loop_iters: set[int] = set()

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        self._loop_iters.add(id(node.iter))  # Jinja allows no custom node types: mark it instead
        super().visit_For(node, frame)

    def visit(self, node: nodes.Node, *args: Any, **kwargs: Any) -> Any:
        if id(node) in self._loop_iters:
            self.write("environment.guard_iter(")
            super().visit(node, *args, **kwargs)
            self.write(")")
            return None
        return super().visit(node, *args, **kwargs)

    def visit_Getitem(self, node: nodes.Getitem, frame: Frame) -> None:
        if not isinstance(node.arg, nodes.Slice):
            super().visit_Getitem(node, frame)
            return
        # Jinja writes obj[a:b] directly, past the sandbox: a slice copies, so it is sized too
        self.write("environment.getitem(")
        self.visit(node.node, frame)
        self.write(", slice(")
        for i, part in enumerate((node.arg.start, node.arg.stop, node.arg.step)):
            self.write(", " if i else "")
            if part is None:
                self.write("None")
            else:
                self.visit(part, frame)
        self.write("))")

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        if frame.eval_ctx.volatile or frame.eval_ctx.autoescape:
            super().visit_Concat(node, frame)
            return
        self.write("environment.tilde((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


def _finalize(value: Any) -> Any:
    """``{{ x }}`` in a string template: the size of ``str(x)`` is checked before it is made."""
    tick()  # one more reference in an output buffer
    t = type(value)
    if t is str:
        return value
    if t is int or t is float or t is bool or value is None:
        return str(value)  # short (an int beyond the digit limit raises ValueError: a clean error)
    produce(text_len(value, "output"), "output")
    return str(value)


def _g_str(obj: Any = "", *rest: Any, **kw: Any) -> None:
    if rest or kw:
        produce(lim.size(obj) * 2, "str")
    elif not isinstance(obj, str):
        produce(text_len(obj, "str()"), "str()", width=width_of(obj))


def _g_list(iterable: Any = ()) -> None:
    sizes.f_list(iterable)


def _g_dict(*args: Any, **kw: Any) -> None:
    produce((lim.size(args[0]) if args else 0) + len(kw), "dict", items=True, width=100)


def _g_sorted(iterable: Any, *rest: Any, **kw: Any) -> tuple:
    items = lim.materialize(iterable, "sorted")
    n = len(items)
    tick(n * n.bit_length() // 4)
    produce(n, "sorted", items=True)
    return (items, *rest)


def _g_minmax(*args: Any, **kw: Any) -> None:
    if len(args) == 1:
        tick(lim.size(args[0]) >> 2)


_GLOBAL_SIZES: dict[Any, Any] = {
    str: _g_str,
    list: _g_list,
    dict: _g_dict,
    sorted: _g_sorted,
    min: _g_minmax,
    max: _g_minmax,
}


_FRESH_ITEMS = (zip, enumerate)


def _wrappable(a: Any) -> bool:
    return callable(a) and not isinstance(a, jinja2.Undefined)


class _Env(ImmutableSandboxedEnvironment):
    """``x.key`` on a mapping reads the key first, so ``workload.items`` is the value, not ``dict.items``.

    Immutable (no ``append``/``update``/...). Every operation that can grow a value checks the
    size it would produce before producing it (``template_limits``), and every hook counts work."""

    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "-", "%", "//"})

    def getattr(self, obj: Any, attribute: str) -> Any:
        tick()
        if isinstance(obj, Mapping):
            try:
                return obj[attribute]
            except (KeyError, TypeError):
                pass
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        tick()
        if type(argument) is slice and isinstance(obj, (str, bytes, list, tuple)):
            try:
                n = len(range(*argument.indices(len(obj))))
            except (TypeError, ValueError):
                n = 0
            produce(n, "slice", items=not isinstance(obj, (str, bytes)), width=width_of(obj))
        return super().getitem(obj, argument)

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, jinja2.Undefined):  # missing._x stays a chainable undefined
            return obj
        # refused at once: an undefined would render '' or be `not defined` (``|attr('__class__')``)
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    @staticmethod
    def guard_iter(iterable: Any) -> Iterator[Any]:
        n = 0
        for x in iterable:
            n += 1
            if n == 64:  # counted in batches: this runs once per iteration
                tick(64)
                n = 0
            yield x
        tick(n)

    @staticmethod
    def tilde(values: tuple) -> str:
        n = 0
        for v in values:
            n += len(v) if type(v) is str else text_len(v, "~")
        produce(n, "concatenation (~)", width=width_of(*values) if n > 4096 else 1)
        return "".join([v if type(v) is str else str(v) for v in values])

    def concat(self, parts: Any) -> str:  # type: ignore[override] # the buffers of macros and {% set %} blocks
        parts = parts if isinstance(parts, list) else list(parts)
        produce(sum(map(len, parts)), "output", width=width_of(*parts[:64]))
        return "".join(parts)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        tick()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(n, int) and isinstance(seq, (str, bytes, list, tuple)):
                    produce(
                        len(seq) * max(n, 0),
                        "repetition",
                        items=isinstance(seq, (list, tuple)),
                        width=width_of(seq),
                    )
            if isinstance(left, int) and isinstance(right, int):
                if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                    raise _LimitExceeded(f"integer product beyond {MAX_INT_BITS} bits")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
                if right * math.log2(abs(left)) > MAX_INT_BITS:
                    raise _LimitExceeded(f"integer power beyond {MAX_INT_BITS} bits")
        elif operator in ("+", "-"):
            if isinstance(left, int) and isinstance(right, int):
                if max(left.bit_length(), right.bit_length()) >= MAX_INT_BITS:
                    raise _LimitExceeded(f"integer sum beyond {MAX_INT_BITS} bits")
            elif (
                operator == "+"
                and isinstance(left, (str, bytes, list, tuple))
                and isinstance(right, (str, bytes, list, tuple))
            ):
                produce(
                    len(left) + len(right),
                    "concatenation",
                    items=isinstance(left, (list, tuple)),
                    width=width_of(left, right),
                )
        elif operator == "%" and isinstance(left, str):
            produce(lim.percent_len(left, right), "% formatting", width=width_of(left, right))
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        tick(3)
        # a callable handed to a builtin (max(..., key=lipsum)) is called back through the sandbox, counted
        if any(_wrappable(a) for a in args):
            args = tuple(__self._through(__context, a) if _wrappable(a) else a for a in args)
        if kwargs and any(_wrappable(v) for v in kwargs.values()):
            kwargs = {k: (__self._through(__context, v) if _wrappable(v) else v) for k, v in kwargs.items()}
        try:
            est = _GLOBAL_SIZES.get(__obj)
        except TypeError:  # unhashable: not one of ours
            est = None
        if est is not None:
            new = est(*args, **kwargs)
        else:
            owner = getattr(__obj, "__self__", None)
            if owner is None:  # the sandbox wraps str.format in a plain function
                owner = getattr(getattr(__obj, "__wrapped__", None), "__self__", None)
            new = None
            if owner is not None and not isinstance(owner, types.ModuleType):
                new = sizes.method_estimate(owner, getattr(__obj, "__name__", ""), args, kwargs)
        if new is not None:
            args = new
        if type(__obj) is Macro:
            tick(24)  # a macro call sets up a frame, a buffer and its output: ~4 us
        out = super().call(__context, __obj, *args, **kwargs)
        if type(out) in _FRESH_ITEMS:  # a fresh tuple per item
            return lim.counted(out, 64)
        return check_result(out)

    def _through(self, context: Any, fn: Any) -> Any:
        def through_sandbox(*args: Any, **kwargs: Any) -> Any:
            return self.call(context, fn, *args, **kwargs)

        return through_sandbox


class TemplateEnv(TemplateWalk):
    """The gate: values, conditions and the fast path for plain strings are ``TemplateWalk``'s
    (dsl/template_front.py, which the engine holds without importing Jinja2); templates render here."""

    def __init__(self) -> None:
        env = _Env(undefined=_Undefined, autoescape=False, keep_trailing_newline=True, finalize=_finalize)
        env.filters.update(
            join=_join_filter,
            sum=_sum_filter,
            tojson=_tojson,
            to_json=_tojson,
            fromjson=_fromjson,
            from_json=_fromjson,
            b64encode=_b64encode,
            b64decode=_b64decode,
        )
        env.filters = {name: _guard_filter(name, f) for name, f in env.filters.items()}
        env.globals.update(
            range=safe_range, namespace=_BoundedNamespace, lipsum=_lipsum, len=len, str=str, int=int, float=float, bool=bool, dict=dict, list=list,
            min=min, max=max, sum=_sum, sorted=sorted, abs=abs, round=round, enumerate=enumerate, zip=zip,
            is_defined=_is_defined,
        )  # fmt: skip
        self.env = env
        self._expr_cache: dict[str, Any] = {}
        self._tmpl_cache: dict[str, jinja2.Template] = {}
        self._paths: dict[str, tuple[str, ...]] = {}  # source -> its dotted name, () if not one

    # -- compilation -------------------------------------------------------
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

    def _path(self, source: str) -> tuple[str, ...]:
        m = _SINGLE_EXPR.match(source)
        expr = m.group("expr") if m else "{{"
        p = _PATH_EXPR.match(expr) if "{{" not in expr and "}}" not in expr and "{%" not in source else None
        path = tuple(part.strip() for part in p.group(1).split(".")) if p else ()
        if path and path[0] in _NOT_A_PATH_HEAD:
            path = ()
        if len(self._paths) > 16384:
            self._paths.clear()
        self._paths[source] = path
        return path

    def _render_template(self, source: str, scope: Mapping[str, Any]) -> Any:
        """One template (``render_str`` passes only strings with ``{{`` or ``{%``)."""
        path = self._paths.get(source)
        if path is None:
            path = self._path(source)
        fresh = lim.begin()  # one budget per render; a nested render shares its caller's
        try:
            if path:
                value = _lookup(scope, path)
                if value is not _MISS:
                    tick(len(path))  # as Jinja's: one per name and one per attribute
                    return _plain(value)
            m = _SINGLE_EXPR.match(source)
            single = m and "{{" not in m.group("expr") and "}}" not in m.group("expr") and "{%" not in source
            if single:
                tmpl = self._expression(source, m.group("expr"))._template
            else:
                tmpl = self._template(source)
            ctx = self._context(tmpl, scope)
            if single:
                for _ in tmpl.root_render_func(ctx):
                    pass
                return _plain(ctx.vars["result"])
            blocks: list[str] = []
            parts: list[str] = []
            size = 0
            for chunk in tmpl.root_render_func(ctx):
                size += len(chunk)
                if size > MAX_STR:
                    raise _LimitExceeded(f"output would have more than {MAX_STR:,} characters")
                parts.append(chunk)
                if len(parts) == 1024:  # hold characters, not a str object per chunk (8M chunks were 400 MB)
                    blocks.append("".join(parts))
                    parts.clear()
            produce(size, "output")
            return "".join(blocks + parts)
        except TemplateError:
            raise
        except _LimitExceeded as e:
            raise TemplateError(source, f"limit: {e}") from None
        except RecursionError:
            raise TemplateError(source, "limit: recursion too deep (a self-referencing value?)") from None
        except MemoryError:  # a limit estimate fell short: still one clean error
            raise TemplateError(source, "limit: out of memory") from None
        except Exception as e:  # noqa: BLE001 - any render failure is an error outcome
            raise TemplateError(source, f"{type(e).__name__}: {e}") from None
        finally:
            if fresh:
                lim.end()

    def referenced_names(self, source: str) -> set[str]:
        """Top-level names a template reads (used by the translator for data dependencies)."""
        try:
            ast = self.env.parse(source)
        except jinja2.TemplateSyntaxError:
            return set()
        return {n.name for n in ast.find_all(nodes.Name) if n.ctx == "load"}


def _lookup(scope: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    """``scope[a][b]...`` while every step is a mapping holding the key, else _MISS (Jinja decides)."""
    try:
        value = scope[path[0]]
        for name in path[1:]:
            if not isinstance(value, Mapping):
                return _MISS
            value = value[name]
    except (KeyError, TypeError):
        return _MISS
    return value


def _plain(value: Any) -> Any:
    """A single expression's native value as plain data, within the limits.

    Undefined -> None; generators/iterators -> lists; other mappings -> dicts;
    an unsafe attribute (``map(attribute='__class__')``) -> security error;
    self-references, oversize values and integers too long to print -> limit errors."""
    t = type(value)  # a scalar within the limits (most results: a count, a flag, a name) as walk returns it
    if value is None or t is bool or t is float or (t is int and value.bit_length() <= MAX_INT_BITS):
        return value
    if t is str and len(value) <= MAX_STR:
        return value
    # items, and characters: a list of one shared string 10**5 times is 10**5 strings to encode
    budget = [MAX_ITEMS, MAX_VALUE_CHARS]

    def walk(v: Any, depth: int) -> Any:
        if v is None or isinstance(v, (bool, float)):
            return v
        if isinstance(v, int):
            if v.bit_length() > MAX_INT_BITS:
                raise _LimitExceeded(f"integer beyond {MAX_INT_BITS:,} bits (too long to print)")
            return v
        if isinstance(v, str):
            budget[1] -= len(v)
            if len(v) > MAX_STR or budget[1] < 0:
                raise _LimitExceeded(
                    f"value has more than {MAX_STR if len(v) > MAX_STR else MAX_VALUE_CHARS:,} characters"
                )
            return v
        if isinstance(v, jinja2.Undefined):
            if getattr(v, "_undefined_exception", None) is SecurityError:
                raise SecurityError(f"access to {v._undefined_name!r} is not allowed")  # type: ignore[attr-defined]
            return None
        if depth > MAX_VALUE_DEPTH:
            raise _LimitExceeded(f"value nested deeper than {MAX_VALUE_DEPTH} levels (a self-reference?)")
        t = type(v)
        if (t is list or t is dict) and len(v) > 8:
            flat = _flat_copy(v, t, budget)  # a big flat value (ctx.trail + [x]): checked at C speed
            if flat is not None:
                return flat
        if isinstance(v, (list, tuple, types.GeneratorType, map, filter, zip, enumerate, reversed)) or (
            isinstance(v, Iterator) and not isinstance(v, (bytes, Mapping))
        ):
            out = []
            for item in v:
                budget[0] -= 1
                if budget[0] < 0:
                    raise _LimitExceeded(f"value has more than {MAX_ITEMS} items")
                tick()
                out.append(walk(item, depth + 1))
            return tuple(out) if isinstance(v, tuple) else out
        if isinstance(v, Mapping):
            budget[0] -= len(v)
            if budget[0] < 0:
                raise _LimitExceeded(f"value has more than {MAX_ITEMS} items")
            tick()
            return {k: walk(x, depth + 1) for k, x in v.items()}
        if isinstance(v, (range, set, frozenset)):
            return walk(list(v), depth)
        if isinstance(v, (bytes, bytearray)):
            budget[1] -= 2 * len(v)
            if budget[1] < 0:
                raise _LimitExceeded(f"value has more than {MAX_VALUE_CHARS:,} characters")
        return v  # dates, decimals, bytes...: the JSON encoder handles or refuses them

    return walk(value, 0)


_NUMS = frozenset({int, float, bool, type(None)})


def _flat_copy(v: list | dict, t: type, budget: list[int]) -> list | dict | None:
    """A copy of a list (dict) of plain scalars after the per-item walk's checks, done by C loops
    (``set(map(type, ...))``, ``max``, ``sum(map(len, ...))``) instead of one Python call per item;
    None when the items are not all plain scalars or a check would fail (the walk then raises the
    same error at the same item as before). The render budget is ticked as the walk would."""
    items = v if t is list else v.values()
    n = len(v)
    if n > budget[0]:
        return None
    types = set(map(type, items))
    if types <= _NUMS:
        if int in types:
            ints = items if len(types) == 1 else [x for x in items if type(x) is int]
            if max(ints).bit_length() > MAX_INT_BITS or min(ints).bit_length() > MAX_INT_BITS:
                return None
    elif len(types) == 1 and str in types:
        chars = sum(map(len, items))
        if chars > budget[1] or max(map(len, items)) > MAX_STR:
            return None
        budget[1] -= chars
    else:
        return None
    budget[0] -= n
    if t is list:
        tick(n)  # the walk ticks once per list item, once per dict
        return list(v)
    tick()
    return dict(v)


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
