"""Template references: the free names of a Jinja template and rewriting them byte for byte, single
``{{ expression }}`` conditions, conjunctions, and ``event.name`` comparisons."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2.parser import Parser
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from .constants import RAW_TEXT_KEYS
from .report import _Refuse
from .yamltree import _restyle

_JENV = jinja2.Environment()


KEYWORDS = frozenset(
    "and or not in is if else elif endif for endfor set endset true false none True False None recursive "
    "with without context import from as include macro endmacro call endcall filter endfilter block endblock "
    "extends raw endraw do continue break loop self caller varargs kwargs super ignore missing scoped".split()
)


@dataclass(frozen=True)
class NameRef:
    """A free name of a template and the literal attribute path after it (``.a`` / ``['a']``)."""

    name: str
    path: tuple[str, ...]
    start: int
    ends: tuple[int, ...]  # ends[k]: end offset of the name plus its first k path segments


Resolver = Callable[[NameRef], "tuple[str, int] | None"]


class TemplateRewriteError(ValueError):
    pass


def _lex(source: str) -> list[tuple[str, str, int]]:
    """(type, value, offset) of the significant tokens; offsets located in the original text."""
    try:
        raw = list(_JENV.lex(source))
    except jinja2.TemplateSyntaxError as e:
        raise TemplateRewriteError(f"template does not parse: {e.message}") from None
    out = []
    pos = 0
    for _, kind, value in raw:
        at = source.find(value, pos) if value else pos
        if at < 0:  # the lexer only ever drops whitespace
            raise TemplateRewriteError("cannot align template tokens")
        pos = at + len(value)
        if kind not in ("whitespace", "data", "comment", "comment_begin", "comment_end"):
            out.append((kind, value, at))
    return out


def _bound_names(toks: list[tuple[str, str, int]]) -> set[str]:
    """Names the template binds itself (for / set targets, macro names and parameters)."""
    bound: set[str] = set()
    for i, (kind, value, _) in enumerate(toks):
        if (
            kind != "name"
            or value not in ("for", "set", "macro")
            or i == 0
            or toks[i - 1][0] != "block_begin"
        ):
            continue
        j = i + 1
        if value == "macro":
            while j < len(toks) and toks[j][0] != "block_end":
                if toks[j][0] == "name" and j + 1 < len(toks) and toks[j + 1][1] in (",", ")", "=", "("):
                    bound.add(toks[j][1])
                j += 1
            continue
        stop = "in" if value == "for" else "="
        while j < len(toks) and toks[j][0] != "block_end" and toks[j][1] != stop:
            if toks[j][0] == "name":
                bound.add(toks[j][1])
            j += 1
    return bound


def free_names(source: str) -> list[NameRef]:
    """Every free name of a template: not an attribute, filter, test, keyword argument or bound name."""
    toks = _lex(source)
    bound = _bound_names(toks)
    refs: list[NameRef] = []
    in_code = False
    for i, (kind, value, at) in enumerate(toks):
        if kind in ("variable_begin", "block_begin"):
            in_code = True
            continue
        if kind in ("variable_end", "block_end"):
            in_code = False
            continue
        if not in_code or kind != "name" or value in KEYWORDS or value in bound:
            continue
        prev = toks[i - 1] if i > 0 else None
        if prev and (
            (prev[0] == "operator" and prev[1] in (".", "|")) or (prev[0] == "name" and prev[1] == "is")
        ):
            continue
        if prev and prev[1] == "not" and i > 1 and toks[i - 2][1] == "is":
            continue
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        if nxt and nxt[0] == "operator" and nxt[1] == "=":  # keyword argument
            continue
        path: list[str] = []
        ends = [at + len(value)]
        j = i + 1
        while j + 1 < len(toks):
            op = toks[j]
            if op[1] == "." and op[0] == "operator" and toks[j + 1][0] == "name":
                path.append(toks[j + 1][1])
                ends.append(toks[j + 1][2] + len(toks[j + 1][1]))
                j += 2
            elif op[1] == "[" and toks[j + 1][0] == "string" and j + 2 < len(toks) and toks[j + 2][1] == "]":
                path.append(toks[j + 1][1][1:-1])
                ends.append(toks[j + 2][2] + 1)
                j += 3
            else:
                break
        refs.append(NameRef(value, tuple(path), at, tuple(ends)))
    return refs


def rewrite_template(source: str, resolver: Resolver) -> str:
    """Apply ``resolver`` to each free name of ``source``; all other text is kept byte for byte."""
    if "{{" not in source and "{%" not in source:
        return source
    edits = []
    for ref in free_names(source):
        hit = resolver(ref)
        if hit is not None:
            text, consumed = hit
            edits.append((ref.start, ref.ends[consumed], text))
    if not edits:
        return source
    out, pos = [], 0
    for start, end, text in edits:
        out += [source[pos:start], text]
        pos = end
    out.append(source[pos:])
    return "".join(out)


_SINGLE = re.compile(r"^\s*\{\{(?P<expr>.*)\}\}\s*$", re.S)


def single_expression(source: Any) -> str | None:
    """The expression of a template that is exactly one ``{{ expression }}``, else None."""
    if not isinstance(source, str):
        return None
    m = _SINGLE.match(source)
    if not m or "{{" in m.group("expr") or "}}" in m.group("expr") or "{%" in source:
        return None
    if not _parses_as_expression(m.group("expr")):
        return None
    return m.group("expr").strip()


def _parses_as_expression(expr: str) -> bool:
    """Whether ``expr`` is one Jinja expression: parsed, never compiled. Compiling folds constant
    subexpressions in this plain (unsandboxed, unlimited) environment, so ``'x' * 10**8`` in a
    playbook being migrated was built at compile time; evaluating a template is the template
    gate's job (``dsl.templates``), never this module's."""
    try:
        parser = Parser(_JENV, expr, state="variable")
        parser.parse_expression()
        return parser.stream.current.type == "eof"
    except jinja2.TemplateSyntaxError:
        return False


def _needs_parens(expr: str) -> bool:
    depth = 0
    for kind, value, _ in _lex("{{ " + expr + " }}"):
        if kind == "operator" and value in "([{":
            depth += 1
        elif kind == "operator" and value in ")]}":
            depth -= 1
        elif depth == 0 and kind == "name" and value in ("or", "if", "else", "not", "and"):
            return True
    return False


def _group(expr: str) -> str:
    return f"({expr})" if _needs_parens(expr) else expr


def conjoin(*exprs: str | None) -> str:
    parts = [e for e in exprs if e]
    if len(parts) == 1:
        return parts[0]
    return " and ".join(_group(p) if " or " in p or " if " in p else p for p in parts)


def _tmpl(expr: str) -> DoubleQuotedScalarString:
    return DoubleQuotedScalarString("{{ " + expr + " }}")


_EVENT_CMP = re.compile(
    r"""event\.name\s*(?P<op>==|!=|\bnot\s+in\b|\bin\b)\s*(?P<rhs>'[^']*'|"[^"]*"|\[[^\]]*\]|\([^)]*\))"""
)


def _event_names(rhs: str) -> list[str]:
    return [a or b for a, b in re.findall(r"""'([^']*)'|"([^"]*)\"""", rhs)]


def rewrite_event_names(expr: str, mapping: Callable[[str], Any]) -> str:
    """Rewrite ``event.name == 'x'`` / ``in [...]`` comparisons with ``mapping(name)``.

    ``mapping`` returns a list of new event names, or the string ``"ok"`` /
    ``"error"`` to turn the comparison into an ``outcome.status`` test; it
    raises :class:`_Refuse` for a name with no counterpart.
    """

    def one(m: re.Match) -> str:
        names = _event_names(m.group("rhs"))
        negated = m.group("op") in ("!=",) or m.group("op").startswith("not")
        statuses: set[str] = set()
        new_names: list[str] = []
        for n in names:
            mapped = mapping(n)
            if mapped in ("ok", "error"):
                statuses.add(mapped)
            elif mapped:
                new_names += [x for x in mapped if x not in new_names]
        if statuses and new_names:
            raise _Refuse(f"event names {names} mix task outcomes and routing events")
        if statuses:
            if statuses == {"ok", "error"}:
                return "false" if negated else "true"
            (status,) = statuses
            return f"outcome.status {'!=' if negated else '=='} '{status}'"
        if not new_names:
            return "true" if negated else "false"
        if len(new_names) == 1:
            return f"event.name {'!=' if negated else '=='} '{new_names[0]}'"
        listed = ", ".join(f"'{n}'" for n in new_names)
        return f"event.name {'not in' if negated else 'in'} [{listed}]"

    out = _EVENT_CMP.sub(one, expr)
    if re.search(r"(?<![\w.])event\b", out) and re.search(r"(?<![\w.])event\.(?!name\b)", out):
        raise _Refuse("the condition reads event fields other than `event.name`")
    return out


def _group_always(expr: str) -> str:
    return f"({expr})" if _needs_parens(expr) or " " in expr.strip() else expr


def _rewrite_all(value: Any, resolver: Resolver) -> Any:
    if isinstance(value, str):
        return _restyle(value, rewrite_template(value, resolver))
    if isinstance(value, dict):
        for k in list(value.keys()):
            if k not in RAW_TEXT_KEYS:
                value[k] = _rewrite_all(value[k], resolver)
        return value
    if isinstance(value, list):
        for i in range(len(value)):
            value[i] = _rewrite_all(value[i], resolver)
        return value
    return value
