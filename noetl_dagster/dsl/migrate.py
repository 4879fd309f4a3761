"""Rewrite legacy NoETL playbooks to the standard form (``noetl.io/v2``).

The document is edited in place on a ruamel.yaml round-trip tree, so comments,
key order and scalar styles survive wherever the construct itself survives.
Every rule is listed in ``docs/migrate.md``; in short:

* v1: ``apiVersion`` / root ``name``, ``path`` -> ``metadata``; ``workbooks``
  -> ``workbook`` entries ``{name, tool: {kind}}``; step ``type`` / ``task`` /
  ``with`` and inline tool keys -> ``tool``; ``next`` lists of ``{when, then}``
  / ``{else}`` / ``{step, with}`` -> ``next: {spec, arcs}`` with ``args``; a
  loop step whose ``next`` chain ends at an ``end_loop`` step -> one loop step
  whose pipeline holds the chain (routing inside it becomes policy rules); the
  ``end_loop`` step's ``result`` -> a task computing it; ``save`` -> storage
  tasks.
* early v2: ``case`` -> arcs + storage tasks + task policy rules; ``next``
  lists and names -> routers; ``sink`` -> a storage task; ``retry`` ->
  ``do: retry`` rules; step ``vars`` -> step ``set: {ctx.*}``; root ``vars``
  -> ``workload`` defaults; ``args`` / ``with`` -> ``input``; ``loop.mode`` ->
  ``loop.spec.mode``; ``eval`` / ``expr`` / ``set_vars`` -> ``spec.policy.rules``
  / ``when`` / ``set_ctx``; step ``when`` -> ``spec.policy.admit.rules``.
* template references are rewritten where the eras differ (``vars.x``,
  ``response`` / ``result`` in conditions and sinks, v1 task-name results,
  ``<loop>_results``).

A construct that cannot be translated faithfully is left exactly as written
and reported (file, line, reason) as ``refused``; nothing is dropped. A file
with no legacy construct comes back byte for byte, so migrating twice changes
nothing.
"""

from __future__ import annotations

import copy
import io
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError
from ruamel.yaml.scalarstring import (
    DoubleQuotedScalarString,
    FoldedScalarString,
    LiteralScalarString,
    SingleQuotedScalarString,
)

from noetl_dagster.util.sql import split_sql

try:
    from yaml import CSafeLoader as _FastLoader
except ImportError:  # pragma: no cover - libyaml missing
    from yaml import SafeLoader as _FastLoader  # type: ignore[assignment]

STANDARD_API = "noetl.io/v2"
OLD_APIS = frozenset({"noetl.io/v1", "noetl.io/v10", "noetl/v1", "v1"})
KIND_ALIASES = {"playbooks": "playbook", "secret": "secrets"}
ROUTING_ONLY_TYPES = frozenset({"end", "start", "router", "route", "pass_through"})
# keys of a v1 step that are step-level; every other key is the inline tool's config
V1_STEP_KEYS = frozenset({
    "step", "desc", "description", "type", "task", "with", "args", "input", "loop", "end_loop", "case", "next",
    "sink", "save", "retry", "result", "vars", "when", "spec", "set", "tool", "pass", "call", "output",
})  # fmt: skip
ARGS_NATIVE_KINDS = frozenset({"container", "shell", "script", "job", "k8s"})
RAW_TEXT_KEYS = frozenset({"code", "code_b64", "code_base64"})
BACKOFFS = frozenset({"none", "fixed", "linear", "exponential"})
SINK_KIND_KEYS = ("backend", "storage", "kind", "type")
EVENT_LOG_KINDS = frozenset({"event_log", "event", "events", "log_event"})
STORAGE_KINDS = frozenset({"parquet", "arrow", "iceberg"})
STORAGE_KIND_KEYS = frozenset({"uri", "resource", "namespace", "partition_by", "compression", "store", "catalog",
                               "catalog_name", "registry"})  # fmt: skip
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")


# ---------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class MigrationNote:
    file: str
    line: int
    path: str
    level: str  # refused | warning | info
    rule: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{self.file}:{self.line}: {self.level}: {self.rule}: {where}{self.message}"


@dataclass
class MigrationResult:
    file: str
    original: str
    text: str
    notes: list[MigrationNote] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.text != self.original

    @property
    def refused(self) -> list[MigrationNote]:
        return [n for n in self.notes if n.level == "refused"]


class MigrationInputError(ValueError):
    """The input is not a playbook the migration can read (bad YAML, not a mapping, not a Playbook)."""


class _Refuse(Exception):
    """A construct cannot be translated faithfully; the caller leaves it untouched."""

    def __init__(self, message: str, node: Any = None, key: Any = None):
        super().__init__(message)
        self.message = message
        self.node = node
        self.key = key


# ---------------------------------------------------------------------------
# template references

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
    try:
        _JENV.compile_expression(m.group("expr"))
    except jinja2.TemplateSyntaxError:
        return None
    return m.group("expr").strip()


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


# ---------------------------------------------------------------------------
# ruamel helpers


def _layout(doc: Any) -> tuple[int, int, int]:
    """(mapping indent, sequence indent, dash offset) as the document itself is written."""
    mapping = sequence = offset = None
    todo = [doc]
    while todo and (mapping is None or sequence is None):
        node = todo.pop(0)
        if not isinstance(node, CommentedMap) or node.fa.flow_style():
            continue
        for k, v in node.items():
            try:
                kline, kcol = node.lc.key(k)
            except (KeyError, TypeError, AttributeError):
                continue
            if isinstance(v, CommentedMap) and not v.fa.flow_style() and len(v) and mapping is None:
                vline, vcol = v.lc.key(next(iter(v)))
                if vline > kline:
                    mapping = vcol - kcol
            elif isinstance(v, CommentedSeq) and not v.fa.flow_style() and len(v) and sequence is None:
                iline, icol = v.lc.item(0)
                if iline > kline and v.lc.col is not None:
                    offset, sequence = v.lc.col - kcol, icol - kcol
            if isinstance(v, CommentedMap):
                todo.append(v)
            elif isinstance(v, CommentedSeq):
                todo.extend(x for x in v if isinstance(x, CommentedMap))
    mapping = mapping if mapping and mapping > 0 else 2
    offset = offset if offset is not None and offset >= 0 else 0
    sequence = sequence if sequence and sequence >= offset + 2 else offset + 2
    return mapping, sequence, offset


def _yaml_for(text: str) -> YAML:
    y = YAML()
    y.preserve_quotes = True
    # files dumped by PyYAML fold long quoted strings at 80 columns; hand-written ones do not
    y.width = 80 if re.search(r"\\\n\s+\\?", text) else 4096
    # `key: null` reads better than `key:` (ruamel's default for None)
    y.representer.add_representer(
        type(None), lambda rep, _: rep.represent_scalar("tag:yaml.org,2002:null", "null")
    )
    return y


def _restyle(old: Any, new: str) -> Any:
    for cls in (DoubleQuotedScalarString, SingleQuotedScalarString, LiteralScalarString):
        if isinstance(old, cls):
            return cls(new)
    if isinstance(old, FoldedScalarString):
        return LiteralScalarString(new) if "\n" in new else DoubleQuotedScalarString(new)
    return new


def _dq(value: Any) -> Any:
    if isinstance(value, str) and not isinstance(value, (DoubleQuotedScalarString, SingleQuotedScalarString,
                                                          LiteralScalarString, FoldedScalarString)):  # fmt: skip
        if "\n" in value:
            return LiteralScalarString(value)
        if "{{" in value or "{%" in value:
            return DoubleQuotedScalarString(value)
    return value


def _cm(*pairs: tuple[str, Any], **kw: Any) -> CommentedMap:
    m = CommentedMap()
    for k, v in pairs:
        m[k] = v
    for k, v in kw.items():
        m[k] = v
    return m


def _flow(m: CommentedMap) -> CommentedMap:
    m.fa.set_flow_style()
    return m


def _index(m: CommentedMap, key: Any) -> int:
    return list(m.keys()).index(key)


def _rename_key(m: CommentedMap, old: Any, new: Any) -> None:
    pos = _index(m, old)
    comment = m.ca.items.pop(old, None)
    value = m.pop(old)
    m.insert(pos, new, value)
    if comment is not None:
        m.ca.items[new] = comment


def _pop(m: CommentedMap, key: Any, dst: CommentedMap | None = None, dst_key: Any = None) -> Any:
    """Remove ``key`` (and its comment); when ``dst`` is given, append the pair there, comment included."""
    comment = m.ca.items.pop(key, None)
    value = m.pop(key)
    if dst is not None:
        k = key if dst_key is None else dst_key
        dst[k] = value
        if comment is not None:
            dst.ca.items[k] = comment
    return value


def _put(
    m: CommentedMap, key: Any, value: Any, *, after: Any = None, before: Any = None, at: int | None = None
) -> None:
    """Insert or replace ``key``, placed after/before another key when given."""
    if key in m:
        m[key] = value
        return
    if at is not None:
        m.insert(min(at, len(m)), key, value)
    elif after is not None and after in m:
        m.insert(_index(m, after) + 1, key, value)
    elif before is not None and before in m:
        m.insert(_index(m, before), key, value)
    else:
        m[key] = value


def _line(node: Any, key: Any = None, default: int = 1) -> int:
    try:
        if key is not None and isinstance(node, CommentedMap) and key in node.lc.data:
            return node.lc.key(key)[0] + 1
        if (
            key is not None
            and isinstance(node, CommentedSeq)
            and isinstance(key, int)
            and key in node.lc.data
        ):
            return node.lc.item(key)[0] + 1
        if getattr(node, "lc", None) is not None and node.lc.line is not None:
            return node.lc.line + 1
    except (AttributeError, KeyError, TypeError, IndexError):
        pass
    return default


def _last_slot(node: Any) -> tuple[Any, Any] | None:
    """(container, key) of a node's deepest last entry: where the comment after it is stored."""
    while True:
        if isinstance(node, CommentedMap) and len(node):
            k = list(node.keys())[-1]
            if isinstance(node[k], (CommentedMap, CommentedSeq)) and len(node[k]):
                node = node[k]
                continue
            return node, k
        if isinstance(node, CommentedSeq) and len(node):
            i = len(node) - 1
            if isinstance(node[i], (CommentedMap, CommentedSeq)) and len(node[i]):
                node = node[i]
                continue
            return node, i
        return None


def _take_trailing(node: Any) -> Any:
    """Detach the comment / blank lines that follow ``node`` (they belong after it, wherever it ends)."""
    slot = _last_slot(node)
    if slot is None:
        return None
    container, key = slot
    entry = container.ca.items.get(key)
    idx = 2 if isinstance(container, CommentedMap) else 0
    if entry and len(entry) > idx and entry[idx] is not None:
        tok = entry[idx]
        entry[idx] = None
        return tok
    return None


def _give_trailing(node: Any, tok: Any) -> None:
    if tok is None:
        return
    slot = _last_slot(node)
    if slot is None:
        return
    container, key = slot
    idx = 2 if isinstance(container, CommentedMap) else 0
    entry = container.ca.items.setdefault(key, [None, None, None, None] if idx == 2 else [None, None])
    if entry[idx] is None:
        entry[idx] = tok


def _walk_strings(node: Any, fn: Callable[[str, tuple], Any], path: tuple = ()) -> None:
    """Call ``fn(text, path)`` on every string (code bodies excepted); a returned value replaces it."""
    if isinstance(node, dict):
        for k in list(node.keys()):
            v = node[k]
            if k in RAW_TEXT_KEYS:
                continue
            if isinstance(v, str):
                new = fn(v, (*path, k))
                if new is not None and new != v:
                    node[k] = _restyle(v, new)
            else:
                _walk_strings(v, fn, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            if isinstance(v, str):
                new = fn(v, (*path, i))
                if new is not None and new != v:
                    node[i] = _restyle(v, new)
            else:
                _walk_strings(v, fn, (*path, i))


def _format_path(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + str(p)
    return out


def _plain(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    if isinstance(node, str):
        return str(node)
    return node


# ---------------------------------------------------------------------------
# the pieces of a step: routing groups and pipelines


@dataclass
class _Target:
    step: str
    args: Any = None  # CommentedMap of the legacy `with` / `args`
    node: Any = None


@dataclass
class _Group:
    kind: str  # cond | default | always
    targets: list[_Target]
    when: Any = None
    set: Any = None
    line: int = 1


@dataclass
class _TaskRef:
    label: str
    body: CommentedMap
    style: str  # name | labelmap | single


def _task_items(tool: Any) -> list[_TaskRef] | None:
    if isinstance(tool, dict):
        if "kind" in tool or "type" in tool:
            return [_TaskRef(str(tool.get("name") or ""), tool, "single")]
        if len(tool) == 1 and isinstance(next(iter(tool.values())), dict):
            ((label, body),) = tool.items()
            return [_TaskRef(str(label), body, "labelmap")]
        return None
    if isinstance(tool, list):
        out = []
        for i, item in enumerate(tool):
            if not isinstance(item, dict):
                return None
            if "kind" in item or "type" in item:
                out.append(_TaskRef(str(item.get("name") or f"task_{i}"), item, "name"))
            elif len(item) == 1 and isinstance(next(iter(item.values())), dict):
                ((label, body),) = item.items()
                out.append(_TaskRef(str(label), body, "labelmap"))
            else:
                return None
        return out
    return None


# ---------------------------------------------------------------------------
# the migrator


class _Migrator:
    def __init__(self, doc: CommentedMap, file: str):
        self.doc = doc
        self.file = file
        self.notes: list[MigrationNote] = []
        self.frozen: set[int] = set()  # ids of steps left exactly as written (a refused construct spans them)

    # -- notes -----------------------------------------------------------------
    def note(self, level: str, rule: str, message: str, node: Any = None, key: Any = None, path: tuple = (),
             line: int | None = None) -> None:  # fmt: skip
        ln = line if line is not None else _line(node, key, default=_line(self.doc))
        self.notes.append(MigrationNote(self.file, ln, _format_path(path), level, rule, message))

    def refuse(self, e: _Refuse, rule: str, node: Any, key: Any, path: tuple) -> None:
        self.note("refused", rule, f"{e.message}; left as written", e.node if e.node is not None else node,
                  e.key if e.node is not None else key, path)  # fmt: skip

    # -- entry -----------------------------------------------------------------
    def run(self) -> None:
        self._root()
        steps = self.doc.get("workflow")
        if not isinstance(steps, list):
            return
        self._index_steps()
        self._scan()
        self._global_templates()
        self._v1_loops()
        for s in list(steps):
            if isinstance(s, dict):
                self._step(s, ("workflow", steps.index(s)))
        self._root_vars()
        self._legacy_pg_results()
        self._v1_workbook_inputs()

    def _region(self, L: CommentedMap, E: CommentedMap) -> list[CommentedMap]:
        """L, E and every step reachable from L's `next` without passing E."""
        out = [L, E]
        todo = [t.step for g in self._legacy_groups(L, quiet=True) or [] for t in g.targets]
        while todo:
            n = todo.pop()
            st = self.steps.get(n)
            if st is None or any(st is o for o in out):
                continue
            out.append(st)
            todo.extend(t.step for g in self._legacy_groups(st, quiet=True) or [] for t in g.targets)
        return out

    def _index_steps(self) -> None:
        self.steps: dict[str, CommentedMap] = {}
        for s in self.doc.get("workflow") or []:
            if isinstance(s, dict) and isinstance(s.get("step"), str):
                self.steps.setdefault(s["step"], s)

    # -- root ------------------------------------------------------------------
    def _root(self) -> None:
        d = self.doc
        api = d.get("apiVersion")
        self.v1 = api in OLD_APIS or (api is None and "name" in d and "metadata" not in d)
        if api in OLD_APIS:
            d["apiVersion"] = _restyle(api, STANDARD_API)
        elif api is None:
            d.insert(0, "apiVersion", STANDARD_API)
        if not isinstance(d.get("metadata"), dict) and any(k in d for k in ("name", "path")):
            meta = CommentedMap()
            keys = [k for k in ("name", "path", "description", "version") if k in d]
            pos = min(_index(d, k) for k in keys)
            for k in keys:
                _pop(d, k, meta)
            d.insert(pos, "metadata", meta)
        if "workbooks" in d:
            if "workbook" in d:
                self.note("refused", "workbooks", "both `workbook` and `workbooks` exist; merge them by hand", d,
                          "workbooks", ("workbooks",))  # fmt: skip
            else:
                _rename_key(d, "workbooks", "workbook")
        wb = d.get("workbook")
        if isinstance(wb, list):
            for i, entry in enumerate(wb):
                if isinstance(entry, dict):
                    self._workbook_entry(entry, ("workbook", i))

    def _workbook_entry(self, e: CommentedMap, path: tuple) -> None:
        if "tool" not in e and ("type" in e or "kind" in e):
            self.v1_entries = getattr(self, "v1_entries", []) + [e]
            tool = CommentedMap()
            kind = e.get("kind", e.get("type"))
            tool["kind"] = KIND_ALIASES.get(str(kind), kind)
            pos = _index(e, "kind" if "kind" in e else "type")
            for k in list(e.keys()):
                if k in ("name", "desc", "assert", "type", "kind"):
                    continue
                _pop(e, k, tool)
            e.pop("type", None)
            e.pop("kind", None)
            e.insert(min(pos, len(e)), "tool", tool)
            if "assert" in e:  # keep `assert` after the tool it checks
                _pop(e, "assert", e)
        if isinstance(e.get("tool"), dict):
            self._task_body(e["tool"], (*path, "tool"), None)

    # -- scan ------------------------------------------------------------------
    def _scan(self) -> None:
        """Facts the template rewrites need: vars, v1 task callers, incoming arc keys, loop names."""
        d = self.doc
        self.root_vars = list(d["vars"].keys()) if isinstance(d.get("vars"), dict) else []
        self.workload_keys = set(d["workload"].keys()) if isinstance(d.get("workload"), dict) else set()
        self.written_vars: set[str] = set()
        self.task_callers: dict[str, list[str]] = {}
        self.incoming: dict[str, set[str]] = {}
        for name, s in self.steps.items():
            if isinstance(s.get("vars"), dict):
                self.written_vars |= {str(k) for k in s["vars"]}
            for c in s.get("case") or [] if isinstance(s.get("case"), list) else []:
                then = c.get("then") if isinstance(c, dict) else None
                for action in then if isinstance(then, list) else [then]:
                    if isinstance(action, dict) and isinstance(action.get("set"), dict):
                        self.written_vars |= {str(k) for k in action["set"]}
            tool = s.get("tool")
            for t in _task_items(tool) or []:
                for rule in t.body.get("eval") or [] if isinstance(t.body.get("eval"), list) else []:
                    body = (
                        rule.get("else")
                        if isinstance(rule, dict) and isinstance(rule.get("else"), dict)
                        else rule
                    )
                    if isinstance(body, dict) and isinstance(body.get("set_vars"), dict):
                        self.written_vars |= {str(k) for k in body["set_vars"]}
            task = s.get("task") if s.get("type", "workbook") == "workbook" else None
            if isinstance(task, str):
                self.task_callers.setdefault(task, []).append(name)
            for g in self._legacy_groups(s, quiet=True) or []:
                for t in g.targets:
                    if isinstance(t.args, dict):
                        self.incoming.setdefault(t.step, set()).update(str(k) for k in t.args)

    # -- template references valid in every context ------------------------------
    def _global_templates(self) -> None:
        loops = {n for n, s in self.steps.items() if isinstance(s.get("loop"), dict)}
        callers = {
            t: steps[0]
            for t, steps in self.task_callers.items()
            if len(steps) == 1 and t not in self.steps and t not in self.workload_keys
        }
        for t, steps in self.task_callers.items():
            if len(steps) > 1 and t not in self.steps:
                self.ambiguous_tasks = getattr(self, "ambiguous_tasks", set()) | {t}

        def resolver(ref: NameRef) -> tuple[str, int] | None:
            if ref.name == "vars" and ref.path:
                return self._vars_read(ref.path[0]), 1
            if ref.name in callers:
                return callers[ref.name], 0
            if (
                ref.name.endswith("_results")
                and ref.name[: -len("_results")] in loops
                and ref.name not in self.steps
            ):
                return f"{ref.name[: -len('_results')]}.results", 0
            return None

        def fn(text: str, path: tuple) -> str | None:
            try:
                return rewrite_template(text, resolver)
            except TemplateRewriteError as e:
                self.note("warning", "template", f"{e}; its references were not rewritten", path=path,
                          line=self._line_at(path))  # fmt: skip
                return None

        for key in ("workload", "workbook", "workflow", "executor", "keychain", "vars"):
            if key in self.doc:
                _walk_strings(self.doc[key], fn, (key,))

    def _vars_read(self, name: str) -> str:
        in_root, written = name in self.root_vars, name in self.written_vars
        if in_root and written:
            return f"(ctx.{name} | default(workload.{name}))"
        if in_root:
            return f"workload.{name}"
        return f"ctx.{name}"

    def _line_at(self, path: tuple) -> int:
        node: Any = self.doc
        line = 1
        for p in path:
            try:
                line = _line(node, p, line)
                node = node[p]
            except (KeyError, IndexError, TypeError):
                break
        return line

    # -- v1 workbook tasks read their `with` values by name ------------------------------
    def _v1_workbook_inputs(self) -> None:
        """A v1 workbook task rendered with the caller's `with` values as names; in the standard form a
        workbook call's merged input is ``args``: ``{{ x }}`` becomes ``{{ args.x }}`` for those names."""
        entries = getattr(self, "v1_entries", [])
        if not entries:
            return
        passed: dict[str, set[str]] = {}
        for st in self.doc.get("workflow") or []:
            if not isinstance(st, dict):
                continue
            for t in _task_items(st.get("tool")) or []:
                if t.body.get("kind") == "workbook" and isinstance(t.body.get("name"), str):
                    keys = set(t.body["input"]) if isinstance(t.body.get("input"), dict) else set()
                    if isinstance(st.get("input"), dict):
                        keys |= set(st["input"])
                    passed.setdefault(t.body["name"], set()).update(str(k) for k in keys)
        reserved = {
            "workload",
            "ctx",
            "iter",
            "args",
            "keychain",
            "execution_id",
            "steps",
            "results",
            "input",
        }
        for e in entries:
            tool = e.get("tool")
            if not isinstance(tool, dict) or tool.get("kind") == "python":
                continue
            names = set(passed.get(str(e.get("name")), set()))
            if isinstance(tool.get("input"), dict):
                names |= {str(k) for k in tool["input"]}
            names -= reserved
            if not names:
                continue

            def resolver(ref: NameRef, _names: set[str] = names) -> tuple[str, int] | None:
                return (f"args.{ref.name}", 0) if ref.name in _names else None

            for k in list(tool.keys()):
                if k in ("input", "kind") or k in RAW_TEXT_KEYS:
                    continue
                try:
                    tool[k] = _rewrite_all(tool[k], resolver)
                except TemplateRewriteError as err:
                    self.note("warning", "workbook-input", f"{err}; names not rewritten", tool, k)

    # -- legacy postgres results (one `command_<i>` entry per statement) --------------
    def _legacy_pg_results(self) -> None:
        """Early-era postgres results were keyed by statement (``command_0``...); the standard result is the
        last statement's ``{rows, row_count, columns}``. In a file that still addresses ``command_<i>``,
        ``X.command_<last>`` reads become ``X`` and whole-result reads ``{'command_<last>': X}``."""
        if not _COMMAND_N.search(self._text_of(self.doc)):
            return
        pg: dict[str, int] = {}
        for name, st in self.steps.items():
            items = _task_items(st.get("tool"))
            if items and len(items) == 1 and items[0].body.get("kind") == "postgres":
                sql = items[0].body.get("command", items[0].body.get("query"))
                if isinstance(sql, str):
                    pg[name] = max(_count_statements(sql) - 1, 0)
        if not pg:
            return
        wrapped: set[str] = set()

        def resolver(ref: NameRef) -> tuple[str, int] | None:
            last = pg.get(ref.name)
            if last is None:
                return None
            if ref.path and _COMMAND_N.fullmatch(ref.path[0]):
                if int(ref.path[0].split("_")[1]) == last:
                    return ref.name, 1
                return None
            if not ref.path:
                wrapped.add(ref.name)
                return f"{{'command_{last}': {ref.name}}}", 0
            return None

        def fn(text: str, path: tuple) -> str | None:
            try:
                return rewrite_template(text, resolver)
            except TemplateRewriteError:
                return None

        for key in ("workflow", "workbook"):
            if key in self.doc:
                _walk_strings(self.doc[key], fn, (key,))
        if wrapped:
            self.note("warning", "postgres-result", f"whole results of postgres steps {sorted(wrapped)} keep the "
                      "legacy `{'command_<i>': ...}` shape because the file reads `command_<i>`; the standard "
                      "result is the last statement's {rows, row_count, columns}", self.doc, "workflow",
                      ("workflow",))  # fmt: skip

    @staticmethod
    def _text_of(node: Any) -> str:
        parts: list[str] = []

        def collect(n: Any) -> None:
            if isinstance(n, dict):
                for v in n.values():
                    collect(v)
            elif isinstance(n, list):
                for v in n:
                    collect(v)
            elif isinstance(n, str):
                parts.append(n)

        collect(node)
        return "\n".join(parts)

    # -- root vars -> workload -----------------------------------------------------
    def _root_vars(self) -> None:
        d = self.doc
        if "vars" not in d:
            return
        v = d["vars"]
        if not isinstance(v, dict):
            self.note("refused", "root-vars", "root `vars` is not a mapping", d, "vars", ("vars",))
            return
        wl = d.get("workload")
        clash = sorted(set(v) & set(wl)) if isinstance(wl, dict) else []
        if clash:
            self.note("refused", "root-vars", f"root vars {clash} also exist in `workload`; rename one", d, "vars",
                      ("vars",))  # fmt: skip
            return
        if not isinstance(wl, dict):
            _rename_key(d, "vars", "workload")
        else:
            for k in list(v.keys()):
                _pop(v, k, wl)
            _pop(d, "vars")
        self.note("info", "root-vars", "root `vars` became `workload` defaults; writes to them go to `ctx`",
                  d, "workload", ("workload",))  # fmt: skip

    # -- one step ----------------------------------------------------------------
    def _step(self, s: CommentedMap, path: tuple) -> None:
        if not isinstance(s.get("step"), str) or id(s) in self.frozen:
            return
        before = _plain(s)
        trailing = _take_trailing(s)
        try:
            self._step_body(s, path)
        finally:
            _give_trailing(s, trailing)
        if s.fa.flow_style() and _plain(s) != before:
            s.fa.set_block_style()  # a rewritten one-line step reads better in block style

    def _step_body(self, s: CommentedMap, path: tuple) -> None:
        if "end_loop" in s:
            self.note("refused", "end-loop", f"`end_loop: {s['end_loop']}` has no loop step whose chain reaches it",
                      s, "end_loop", (*path, "end_loop"))  # fmt: skip
        self._v1_tool(s, path)
        self._step_when(s, path)
        for key in ("args", "with"):
            if isinstance(s.get(key), dict):
                self._step_input(s, key, path)
            elif key in s:
                self.note("refused", "step-input", f"step `{key}` is not a mapping of input names; left as written",
                          s, key, (*path, key))  # fmt: skip
        tasks = _task_items(s.get("tool"))
        for t in tasks or []:
            self._task_body(t.body, (*path, "tool"), s)
        if "retry" in s:
            self._step_retry(s, path)
        for key in ("save", "sink"):
            if key in s:
                self._step_sink(s, key, path)
        if "case" in s:
            self._case(s, path)
        if "vars" in s:
            self._step_vars(s, path)
        if isinstance(s.get("next"), (list, str)) and "case" not in s:
            self._next(s, path)
        self._loop(s, path)
        self._passthrough_inputs(s, path)
        if "tool" not in s and "next" not in s and not any(k in s for k in ("case", "end_loop", "type")):
            _put(s, "tool", _flow(_cm(kind="noop")), after="desc" if "desc" in s else "step")
            self.note("info", "empty-step", "a step with neither tool nor next got `tool: {kind: noop}`", s, "step",
                      (*path, "step"))  # fmt: skip

    # v1: type / task / with / inline config -> tool
    def _v1_tool(self, s: CommentedMap, path: tuple) -> None:
        """v1 `type` / `task` / `with` (and early-v2 `tool: <kind>`) with the tool's keys on the step -> `tool`."""
        tool_name = s.get("tool") if isinstance(s.get("tool"), str) else None
        if "type" not in s and tool_name is None and not ("task" in s and "tool" not in s):
            return
        anchor = "type" if "type" in s else "tool" if tool_name is not None else "task"
        t = tool_name if tool_name is not None else s.get("type")
        try:
            if "tool" in s and tool_name is None:
                raise _Refuse("the step has both `type` and `tool`", s, "type")
            if tool_name is not None and "type" in s:
                raise _Refuse("the step has both `type` and `tool`", s, "type")
            if "pass" in s or "call" in s:
                raise _Refuse(
                    "`pass` / `call` steps have no standard counterpart", s, "pass" if "pass" in s else "call"
                )
            kind = "workbook" if t in (None, "workbook") else str(t)
            if kind == "iterator":
                self._v1_iterator(s, path)
                return
            config_keys = [k for k in s if k not in V1_STEP_KEYS and not (kind == "workbook" and k == "name")]
            if kind in ROUTING_ONLY_TYPES:
                if config_keys:
                    raise _Refuse(f"a `type: {kind}` step has tool keys {config_keys}", s, anchor)
                _pop(s, anchor)
                return
            if isinstance(s.get("with"), dict) and kind != "workbook" and "input" in config_keys:
                raise _Refuse("the step has both `with` and an `input` key", s, "with")
        except _Refuse as e:
            self.refuse(e, "step-type", s, anchor, (*path, anchor))
            return
        kind = KIND_ALIASES.get(kind, kind)
        if "data" in config_keys and kind != "http" and isinstance(s.get("data"), dict) and "with" not in s:
            _rename_key(
                s, "data", "with"
            )  # v1 `data:` on a step is its input (http keeps `data` as its body)
            config_keys = [k for k in config_keys if k != "data"]
        tool = CommentedMap()
        tool["kind"] = kind
        if kind == "workbook":
            tool["name"] = s.get("task") or s.get("name")
        for k in config_keys:
            _pop(s, k, tool)
        pos = _index(s, anchor)
        for k in ("type", "task", "tool") + (("name",) if kind == "workbook" else ()):
            if k in s and (k != "tool" or tool_name is not None):
                if k != anchor:
                    s.ca.items.pop(k, None)
                s.pop(k)
        s.insert(pos, "tool", tool)
        if isinstance(s.get("with"), dict):
            try:
                self._merge_input(tool, s, "with", path)
            except _Refuse as e:  # unreachable after the check above; kept so a refusal is never a crash
                self.refuse(e, "step-type", s, "with", (*path, "with"))

    def _v1_iterator(self, s: CommentedMap, path: tuple) -> None:
        """v1 `type: iterator` (collection, element, mode, task) -> a `loop:` step whose tool is the task."""
        try:
            task = s.get("task")
            if not isinstance(task, dict) or "collection" not in s or "element" not in s:
                raise _Refuse(
                    "an iterator step needs `collection`, `element` and a `task` mapping", s, "type"
                )
            if "loop" in s:
                raise _Refuse("an iterator step that also has `loop`", s, "loop")
            extra = [
                k
                for k in s
                if k not in V1_STEP_KEYS and k not in ("collection", "element", "mode", "concurrency")
            ]
            if extra:
                raise _Refuse(f"iterator keys {extra} have no counterpart", s, extra[0])
            tkind = task.get("kind", task.get("type"))
            if not isinstance(tkind, str):
                raise _Refuse("the iterator's task has no `type`", s, "task")
            if "save" in task and "save" in s:
                raise _Refuse("both the iterator and its task have `save`", s, "save")
        except _Refuse as e:
            self.refuse(e, "iterator", s, "type", (*path, "type"))
            return
        loop = CommentedMap()
        loop["in"] = s["collection"]
        loop["iterator"] = s["element"]
        spec = CommentedMap()
        if "mode" in s:
            spec["mode"] = s["mode"]
        if "concurrency" in s:
            spec["max_in_flight"] = s["concurrency"]
        if spec:
            loop["spec"] = spec
        pos = _index(s, "type")
        tool = CommentedMap()
        tool["kind"] = KIND_ALIASES.get(tkind, tkind)
        for k in list(task.keys()):
            if k in ("type", "kind"):
                continue
            if k == "save":
                _pop(task, k, s)  # per-iteration storage: a task of the loop's pipeline
            elif k in ("data", "with", "args") and isinstance(task[k], dict) and "input" not in tool:
                _pop(task, k, tool, "input")
            else:
                _pop(task, k, tool)
        for k in ("type", "collection", "element", "mode", "concurrency", "task"):
            if k in s:
                _pop(s, k)
        s.insert(pos, "loop", loop)
        s.insert(pos + 1, "tool", tool)
        self._task_body(tool, (*path, "tool"), s)

    def _merge_input(self, tool: CommentedMap, src: CommentedMap, key: str, path: tuple) -> None:
        """Move ``src[key]`` (a legacy `with` / `args` mapping) into ``tool.input``."""
        val = src[key]
        if "input" not in tool:
            if src is tool:
                _rename_key(tool, key, "input")
            else:
                _pop(src, key, tool, "input")
            return
        if not isinstance(tool["input"], dict):
            raise _Refuse("`input` is not a mapping", src, key)
        clash = sorted(set(val) & set(tool["input"]))
        if clash:
            raise _Refuse(f"`{key}` and `input` both set {clash}", src, key)
        for k in list(val.keys()):
            _pop(val, k, tool["input"])
        _pop(src, key)

    def _step_input(self, s: CommentedMap, key: str, path: tuple) -> None:
        """Step-level `args` / `with` -> the step's `input` (merged into every task's input)."""
        try:
            if key == "with" and isinstance(s.get("tool"), dict) and "kind" in s["tool"]:
                self._merge_input(s["tool"], s, key, path)
            elif "input" in s:
                if not isinstance(s["input"], dict) or set(s[key]) & set(s["input"]):
                    raise _Refuse(f"step `{key}` and `input` overlap", s, key)
                for k in list(s[key].keys()):
                    _pop(s[key], k, s["input"])
                _pop(s, key)
            else:
                _rename_key(s, key, "input")
        except _Refuse as e:
            self.refuse(e, "step-input", s, key, (*path, key))

    # step.when -> admission rules
    def _step_when(self, s: CommentedMap, path: tuple) -> None:
        if "when" not in s:
            return
        spec = s.get("spec")
        if spec is not None and (not isinstance(spec, dict) or isinstance((spec.get("policy") or {}), dict)
                                 and "admit" in (spec.get("policy") or {})):  # fmt: skip
            self.note(
                "refused", "step-when", "the step already has admission rules", s, "when", (*path, "when")
            )
            return
        cond = s["when"]
        rules = CommentedSeq([
            _cm(("when", _dq(cond)), ("then", _flow(_cm(allow=True)))),
            _cm(("else", _cm(("then", _flow(_cm(allow=False)))))),
        ])  # fmt: skip
        if spec is None:
            spec = CommentedMap()
            s.insert(_index(s, "when"), "spec", spec)
        policy = spec.setdefault("policy", CommentedMap())
        policy["admit"] = _cm(("rules", rules))
        _pop(s, "when")
        self.note("info", "step-when", "step `when` became `spec.policy.admit.rules`: a refused token ends its "
                  "branch (it no longer follows the step's arcs)", s, "spec", (*path, "spec"))  # fmt: skip

    # task-level fixes: type -> kind, args/with -> input, retry, eval, set_vars
    def _task_body(self, body: CommentedMap, path: tuple, step: CommentedMap | None) -> None:
        trailing = _take_trailing(body)
        try:
            self._task_body_fix(body, path, step)
        finally:
            _give_trailing(body, trailing)

    def _task_body_fix(self, body: CommentedMap, path: tuple, step: CommentedMap | None) -> None:
        if "kind" not in body and "type" in body:
            _rename_key(body, "type", "kind")
            body["kind"] = KIND_ALIASES.get(str(body["kind"]), body["kind"])
        kind = body.get("kind")
        for key in ("with", "args"):
            if isinstance(body.get(key), dict) and not (key == "args" and kind in ARGS_NATIVE_KINDS):
                try:
                    self._merge_input(body, body, key, path)
                except _Refuse as e:
                    self.refuse(e, "task-input", body, key, (*path, key))
        if isinstance(body.get("retry"), dict):
            try:
                rule = self._retry_rule(body["retry"], str(kind), step.get("step") if step else None)
                self._add_rules(body, [rule], body, "retry")
                _pop(body, "retry")
            except _Refuse as e:
                self.refuse(e, "retry", body, "retry", (*path, "retry"))
        if "eval" in body:
            try:
                rules = self._eval_rules(body["eval"], body)
                self._add_rules(body, rules, body, "eval")
                _pop(body, "eval")
            except _Refuse as e:
                self.refuse(e, "eval", body, "eval", (*path, "eval"))
        for key in ("sink", "save"):
            if isinstance(body.get(key), dict):
                self.note("refused", "task-sink", f"a task-level `{key}` is not translated; move it to the step",
                          body, key, (*path, key))  # fmt: skip
        rules = (
            ((body.get("spec") or {}).get("policy") or {}).get("rules")
            if isinstance(body.get("spec"), dict)
            else None
        )
        for r in rules if isinstance(rules, list) else []:
            if not isinstance(r, dict):
                continue
            if "expr" in r and "when" not in r:
                _rename_key(r, "expr", "when")
            for holder in (r.get("then"), (r.get("else") or {}).get("then") if isinstance(r.get("else"), dict) else None,
                           r.get("else")):  # fmt: skip
                if isinstance(holder, dict) and "set_vars" in holder and "set_ctx" not in holder:
                    _rename_key(holder, "set_vars", "set_ctx")

    def _eval_rules(self, raw: Any, body: CommentedMap) -> list[CommentedMap]:
        """The v10-era ``eval: [{expr, do, ...}, {else: {do, set_vars}}]`` -> policy rules."""
        if not isinstance(raw, list):
            raise _Refuse("`eval` is not a list of rules", body, "eval")
        out = []
        for r in raw:
            if not isinstance(r, dict):
                raise _Refuse("an `eval` rule is not a mapping", body, "eval")
            if "else" in r:
                then = self._eval_then(r["else"] if isinstance(r["else"], dict) else {"do": r["else"]}, body)
                out.append(_cm(("else", _cm(("then", then)))))
            else:
                cond = r.get("expr", r.get("when"))
                if cond is None:
                    raise _Refuse("an `eval` rule has no `expr`", body, "eval")
                out.append(_cm(("when", _dq(cond)), ("then", self._eval_then(r, body))))
        return out

    def _eval_then(self, r: dict, body: CommentedMap) -> CommentedMap:
        then = CommentedMap()
        for k, v in r.items():
            if k in ("expr", "when"):
                continue
            if k == "set_vars":
                then["set_ctx"] = v
            elif k in ("do", "attempts", "backoff", "delay", "to", "set_ctx", "set_iter", "set"):
                then[k] = v
            else:
                raise _Refuse(f"`eval` key {k!r} has no counterpart", body, "eval")
        then.setdefault("do", "continue")
        return then

    def _add_rules(self, body: CommentedMap, rules: list[CommentedMap], node: Any, key: Any) -> None:
        """Put ``rules`` in front of the task's policy rules (an existing `else` stays last)."""
        spec = body.get("spec")
        if spec is None:
            spec = CommentedMap()
            body["spec"] = spec
        if not isinstance(spec, dict):
            raise _Refuse("the task `spec` is not a mapping", node, key)
        policy = spec.setdefault("policy", CommentedMap())
        if not isinstance(policy, dict):
            raise _Refuse("the task policy is not a mapping", node, key)
        existing = policy.get("rules")
        if existing is None:
            policy["rules"] = CommentedSeq(rules)
            return
        if not isinstance(existing, list):
            raise _Refuse("the task policy `rules` is not a list", node, key)
        if any(isinstance(r, dict) and "else" in r for r in rules) and any(
            isinstance(r, dict) and "else" in r for r in existing
        ):
            raise _Refuse("both the legacy block and the task policy define an `else` rule", node, key)
        for i, r in enumerate(rules):
            existing.insert(i, r)

    # retry blocks -> a `do: retry` rule
    def _retry_rule(self, retry: dict, kind: str, step_name: str | None) -> CommentedMap:
        then = CommentedMap()
        then["do"] = "retry"
        known = {"max_attempts", "attempts", "initial_delay", "delay", "backoff", "backoff_multiplier", "when",
                 "retry_when", "retry_on", "backoff_seconds", "retry_on_status"}  # fmt: skip
        extra = sorted(set(retry) - known)
        if extra:
            raise _Refuse(f"retry keys {extra} have no counterpart in task policy rules", retry, extra[0])
        # the legacy defaults: 3 attempts, 1 s doubling (backoff_multiplier 2.0)
        then["attempts"] = retry.get("max_attempts", retry.get("attempts", 3))
        backoff = retry.get("backoff")
        delay = retry.get("initial_delay", retry.get("delay", retry.get("backoff_seconds")))
        mult = retry.get("backoff_multiplier")
        if "backoff_seconds" in retry and backoff is None and mult is None:
            backoff = "fixed"  # a constant wait between attempts
        if isinstance(backoff, dict):
            extra = sorted(set(backoff) - {"type", "base_seconds", "delay"})
            if extra:
                raise _Refuse(f"backoff keys {extra} (caps) have no counterpart", retry, "backoff")
            delay = backoff.get("base_seconds", backoff.get("delay", delay))
            backoff = backoff.get("type")
        elif isinstance(backoff, (int, float)) and not isinstance(backoff, bool):
            delay, backoff = backoff, "fixed"
        if mult is not None:
            if float(mult) == 1.0:
                backoff = backoff or "fixed"
            elif float(mult) == 2.0:
                backoff = "exponential" if backoff in (None, "exponential") else backoff
            else:
                raise _Refuse(f"backoff_multiplier {mult} has no counterpart (exponential doubles)", retry,
                              "backoff_multiplier")  # fmt: skip
        if backoff is None and mult is None:
            backoff = "exponential"
        if backoff is not None:
            if str(backoff) not in BACKOFFS:
                raise _Refuse(f"backoff {backoff!r} is not one of {sorted(BACKOFFS)}", retry, "backoff")
            then["backoff"] = str(backoff)
        if delay is not None:
            then["delay"] = delay
        conds: list[str] = []
        raw_when = retry.get("when", retry.get("retry_when"))
        for c in raw_when if isinstance(raw_when, list) else ([raw_when] if raw_when is not None else []):
            expr = single_expression(c)
            if expr is None:
                raise _Refuse(f"retry condition {c!r} is not one `{{{{ expression }}}}`", retry, "when")
            conds.append(self._policy_expr(expr, kind, step_name, retry_names=True))
        statuses = retry.get("retry_on_status")
        if statuses is not None:
            codes = statuses if isinstance(statuses, list) else [statuses]
            conds.append(f"outcome.http.status in [{', '.join(str(c) for c in codes)}]")
        retry_on = retry.get("retry_on")
        if retry_on is not None:
            kinds = retry_on if isinstance(retry_on, list) else [retry_on]
            listed = ", ".join(f"'{k}'" for k in kinds)
            conds.append(f"outcome.status == 'error' and outcome.error.kind in [{listed}]")
        if not conds:
            cond = "outcome.status == 'error'"
        elif len(conds) == 1:
            cond = conds[0]
        else:
            cond = " or ".join(_group(c) for c in conds)
        return _cm(("when", _tmpl(cond)), ("then", _flow(then)))

    def _policy_expr(
        self, expr: str, kind: str | None, step_name: str | None, retry_names: bool = False
    ) -> str:
        """A legacy condition over the tool's response, as a policy condition over ``outcome``."""

        def resolver(ref: NameRef) -> tuple[str, int] | None:
            if ref.name in ("response", "result", "this"):
                return "outcome.result", 0
            if ref.name == "error":
                return "outcome.error", 0
            if ref.name == "data":
                return "outcome.result.data", 0
            if step_name and ref.name == step_name:
                return "outcome.result", 0
            if retry_names and ref.name == "status_code":  # the v1 retry context's names
                return "outcome.result.status_code", 0
            if retry_names and ref.name == "attempt":
                return "outcome.meta.attempt", 0
            if retry_names and ref.name == "success":
                return "(outcome.status == 'ok')", 0
            return None

        expr = rewrite_event_names(expr, self._policy_event)
        return rewrite_template("{{ " + expr + " }}", resolver)[3:-3]

    @staticmethod
    def _policy_event(name: str) -> Any:
        if name in ("call.done", "step.exit", "action_completed", "task_complete"):
            return "ok"
        if name in ("call.error", "action_error", "task_error"):
            return "error"
        raise _Refuse(f"event {name!r} has no task-outcome counterpart")

    # step-level retry -> a rule on the step's one task
    def _step_retry(self, s: CommentedMap, path: tuple) -> None:
        try:
            tasks = _task_items(s.get("tool"))
            if not tasks or len(tasks) != 1:
                raise _Refuse("a step `retry` needs exactly one task to attach to", s, "retry")
            raw = s["retry"]
            if raw is True or (isinstance(raw, int) and not isinstance(raw, bool) and raw > 0):
                raw = {} if raw is True else {"max_attempts": raw}  # `retry: true` / `retry: <attempts>`
            if not isinstance(raw, dict):
                raise _Refuse("`retry` is not a mapping, `true` or a number of attempts", s, "retry")
            rule = self._retry_rule(raw, str(tasks[0].body.get("kind")), s["step"])
            self._add_rules(tasks[0].body, [rule], s, "retry")
            _pop(s, "retry")
        except _Refuse as e:
            self.refuse(e, "retry", s, "retry", (*path, "retry"))

    # step vars -> step set (ctx writes)
    def _step_vars(self, s: CommentedMap, path: tuple) -> None:
        v = s["vars"]
        name = s["step"]
        try:
            if not isinstance(v, dict):
                raise _Refuse("`vars` is not a mapping", s, "vars")
            target = s.get("set")
            if target is not None and not isinstance(target, dict):
                raise _Refuse("`set` is not a mapping", s, "set")
            new = CommentedMap()
            for k in list(v.keys()):
                val = v[k]
                if isinstance(val, str):
                    val = _restyle(val, rewrite_template(val, self._self_result_resolver(name)))
                new[f"ctx.{k}"] = val
                if k in v.ca.items:
                    new.ca.items[f"ctx.{k}"] = v.ca.items[k]
            if target is None:
                pos = _index(s, "vars")
                _pop(s, "vars")
                s.insert(pos, "set", new)
            else:
                clash = sorted(set(new) & set(target))
                if clash:
                    raise _Refuse(f"`vars` and `set` both write {clash}", s, "vars")
                for k in new:
                    target[k] = new[k]
                _pop(s, "vars")
        except _Refuse as e:
            self.refuse(e, "step-vars", s, "vars", (*path, "vars"))
        except TemplateRewriteError as e:
            self.refuse(_Refuse(str(e)), "step-vars", s, "vars", (*path, "vars"))

    @staticmethod
    def _self_result_resolver(step_name: str) -> Resolver:
        def resolver(ref: NameRef) -> tuple[str, int] | None:
            if ref.name in ("result", "response", "this"):
                return step_name, 0
            return None

        return resolver

    # loop.mode -> loop.spec.mode
    def _loop(self, s: CommentedMap, path: tuple) -> None:
        loop = s.get("loop")
        if not isinstance(loop, dict):
            return
        moved = [k for k in ("mode", "max_in_flight") if k in loop]
        unknown = [k for k in loop if k not in ("in", "iterator", "spec", "mode", "max_in_flight")]
        if unknown:
            self.note("refused", "loop", f"loop keys {unknown} have no standard counterpart", loop, unknown[0],
                      (*path, "loop", unknown[0]))  # fmt: skip
        if not moved:
            return
        spec = loop.get("spec")
        if spec is None:
            spec = CommentedMap()
            loop["spec"] = spec
        if not isinstance(spec, dict):
            self.note(
                "refused", "loop", "`loop.spec` is not a mapping", loop, "spec", (*path, "loop", "spec")
            )
            return
        mode = loop.get("mode")
        if mode is not None and mode not in ("sequential", "parallel"):
            self.note("refused", "loop", f"loop mode {mode!r} has no counterpart (sequential / parallel)", loop, "mode",
                      (*path, "loop", "mode"))  # fmt: skip
            moved = [k for k in moved if k != "mode"]
        for k in moved:
            if k in spec:
                self.note(
                    "refused",
                    "loop",
                    f"`loop.{k}` and `loop.spec.{k}` both exist",
                    loop,
                    k,
                    (*path, "loop", k),
                )
                continue
            _pop(loop, k, spec)

    # -- routing -----------------------------------------------------------------
    def _legacy_groups(self, s: CommentedMap, quiet: bool = False) -> list[_Group] | None:
        """A legacy `next` (list or name) as routing groups; None when there is none or it is a router."""
        if quiet:
            try:
                return self._legacy_groups(s)
            except _Refuse:
                return None
        nxt = s.get("next")
        if isinstance(nxt, str):
            return [_Group("always", [_Target(nxt)], line=_line(s, "next"))]
        if not isinstance(nxt, list):
            return None
        groups: list[_Group] = []
        for i, item in enumerate(nxt):
            line = _line(nxt, i)
            if isinstance(item, str):
                groups.append(_Group("always", [_Target(item)], line=line))
            elif isinstance(item, dict) and "then" in item and ("when" in item or "condition" in item):
                when = item.get("when", item.get("condition"))
                groups.append(_Group("cond", self._targets(item["then"]), when=when, line=line))
                if "else" in item:
                    if any(isinstance(x, dict) and "when" in x for x in nxt[i + 1 :]):
                        raise _Refuse("a `when` with its own `else` is followed by more conditions", nxt, i)
                    groups.append(_Group("default", self._targets(item["else"]), line=line))
            elif isinstance(item, dict) and "else" in item and "step" not in item:
                groups.append(_Group("default", self._targets(item["else"]), line=line))
            elif isinstance(item, dict) and isinstance(item.get("step"), str):
                args = _target_args(item, nxt, i)
                extra = [k for k in item if k not in ("step", *ARG_KEYS, "when", "condition", "set", "desc")]
                if extra:
                    raise _Refuse(f"next item keys {extra} have no counterpart", nxt, i)
                tgt = _Target(item["step"], args, item)
                if "when" in item or "condition" in item:
                    when = item.get("when", item.get("condition"))
                    groups.append(_Group("cond", [tgt], when=when, set=item.get("set"), line=line))
                else:
                    groups.append(_Group("always", [tgt], set=item.get("set"), line=line))
            else:
                raise _Refuse("a `next` item is neither a step, a `{when, then}` nor an `{else}`", nxt, i)
        return groups

    @staticmethod
    def _targets(raw: Any) -> list[_Target]:
        items = raw if isinstance(raw, list) else [raw]
        out = []
        for t in items:
            if isinstance(t, str):
                out.append(_Target(t))
            elif isinstance(t, dict) and isinstance(t.get("step"), str):
                extra = [k for k in t if k not in ("step", *ARG_KEYS)]
                if extra:
                    raise _Refuse(f"target keys {extra} have no counterpart", t)
                out.append(_Target(t["step"], _target_args(t, t, None), t))
            else:
                raise _Refuse("a routing target is not a step name or `{step, with}`", t)
        return out

    def _guard(self, s: CommentedMap) -> str | None:
        """Legacy routing never left a failed step, while a standard arc (with or without `when`) also
        routes a failure (SEMANTICS §5): migrated arcs keep the legacy rule with this guard (loop steps excepted)."""
        if "loop" in s or "tool" not in s:
            return None
        return "event.name != 'call.error'"

    def _arc(self, t: _Target, when: str | None = None, set_: Any = None) -> CommentedMap:
        arc = CommentedMap()
        arc["step"] = t.step
        if when is not None:
            arc["when"] = _tmpl(when) if not str(when).startswith("{{") else _dq(when)
        if t.args is not None:
            arc["args"] = t.args
        if set_ is not None:
            arc["set"] = set_
        return arc

    def _router(
        self, groups: list[_Group], guard: str | None, cond_expr: Callable[[Any], str]
    ) -> CommentedMap:
        """Routing groups (first matching `cond` fires; `default` if none did; `always` always) -> a router."""
        conds = [g for g in groups if g.kind == "cond"]
        default = [t for g in groups if g.kind == "default" for t in g.targets]
        always = [g for g in groups if g.kind == "always"]
        arcs = CommentedSeq()

        def when_of(raw: Any, extra: list[str]) -> str:
            expr = cond_expr(raw)
            mentions_event = re.search(r"(?<![\w.])(event|outcome|error)\b", expr) is not None
            return conjoin(None if mentions_event else guard, *extra, expr)

        if not conds:
            targets = [(t, g.set) for g in always for t in g.targets] + [(t, None) for t in default]
            mode = "exclusive" if len(targets) <= 1 else "inclusive"
            for t, st in targets:
                arcs.append(self._arc(t, guard, st))
        elif not always and all(len(g.targets) == 1 for g in conds) and len(default) <= 1:
            mode = "exclusive"
            for g in conds:
                arcs.append(self._arc(g.targets[0], when_of(g.when, []), g.set))
            for t in default:
                arcs.append(self._arc(t, guard))
        else:
            mode = "inclusive"
            exprs = [cond_expr(g.when) for g in conds]
            for g in always:
                for t in g.targets:
                    arcs.append(self._arc(t, guard, g.set))
            for i, g in enumerate(conds):
                earlier = [f"not {_group_always(e)}" for e in exprs[:i]]
                for t in g.targets:
                    arcs.append(self._arc(t, when_of(g.when, earlier), g.set))
            if default:
                none_matched = "not (" + " or ".join(_group(e) for e in exprs) + ")"
                for t in default:
                    arcs.append(self._arc(t, conjoin(guard, none_matched)))
        return _cm(("spec", _flow(_cm(mode=mode))), ("arcs", arcs))

    def _cond_expr_plain(self, raw: Any) -> str:
        expr = single_expression(raw)
        if expr is None:
            if isinstance(raw, bool):
                return "true" if raw else "false"
            raise _Refuse(f"condition {raw!r} is not one `{{{{ expression }}}}`")
        return expr

    def _next(self, s: CommentedMap, path: tuple) -> None:
        try:
            groups = self._legacy_groups(s)
            assert groups is not None
            router = self._router(groups, self._guard(s), self._cond_expr_plain)
            self._replace_next(s, router)
        except _Refuse as e:
            self.refuse(e, "next", s, "next", (*path, "next"))

    @staticmethod
    def _replace_next(s: CommentedMap, router: CommentedMap) -> None:
        comment = s.ca.items.get("next")
        pos = _index(s, "next")
        s.pop("next")
        s.insert(pos, "next", router)
        if comment is not None:
            s.ca.items["next"] = comment

    # -- storage (sink / save) -----------------------------------------------------
    def _pipeline(self, s: CommentedMap) -> list[_TaskRef]:
        tasks = _task_items(s.get("tool"))
        if not tasks:
            raise _Refuse("the step has no tool to attach storage to", s, "step")
        return tasks

    def _set_pipeline(self, s: CommentedMap, tasks: list[_TaskRef]) -> None:
        """Write ``tasks`` back as the step's pipeline (list form; label-maps kept where used)."""
        if len(tasks) == 1 and tasks[0].style == "single":
            return
        labelmap_file = any(t.style == "labelmap" for t in tasks)
        seq = s["tool"] if isinstance(s.get("tool"), list) else CommentedSeq()
        items = []
        for t in tasks:
            body = t.body
            if t.style == "labelmap" or labelmap_file or body.get("kind") == "workbook":
                items.append(_cm((t.label, body)))
            else:
                if body.get("name") != t.label:
                    if "name" in body:
                        body["name"] = t.label
                    else:
                        body.insert(0, "name", t.label)
                items.append(body)
        del seq[:]
        seq.extend(items)
        if not isinstance(s.get("tool"), list):
            pos = _index(s, "tool")
            comment = s.ca.items.pop("tool", None)
            s.pop("tool")
            s.insert(pos, "tool", seq)
            if comment is not None:
                s.ca.items["tool"] = comment

    def _main_task(self, s: CommentedMap) -> tuple[list[_TaskRef], _TaskRef]:
        tasks = self._pipeline(s)
        if len(tasks) != 1:
            raise _Refuse("storage blocks are translated for one-task steps only", s, "tool")
        main = tasks[0]
        if main.style == "single":
            main.label = str(main.body.get("name")) if main.body.get("name") and main.body.get("kind") != "workbook" \
                else s["step"]  # fmt: skip
            main.style = "name"
        return tasks, main

    def _step_sink(self, s: CommentedMap, key: str, path: tuple) -> None:
        try:
            cfg = s[key]
            if _storage_kind(cfg) in EVENT_LOG_KINDS:
                self.note("info", key, f"`{key}` to the event log needs no task: every result is recorded as an "
                          "event", s, key, (*path, key))  # fmt: skip
                _pop(s, key)
                return
            tasks, main = self._main_task(s)
            era = "v1" if key == "save" else "v2"
            built = self._storage_task(cfg, main, era, s, key)
            if built is None:  # event-log sinks: every result is an event already
                _pop(s, key)
                return
            label = self._fresh_label(f"{s['step']}_{key}", tasks)
            tasks.append(_TaskRef(label, built, "name"))
            self._add_passthrough(s, tasks, main)
            self._set_pipeline(s, tasks)
            _pop(s, key)
        except _Refuse as e:
            self.refuse(e, key, s, key, (*path, key))

    @staticmethod
    def _fresh_label(base: str, tasks: list[_TaskRef]) -> str:
        labels = {t.label for t in tasks}
        label, n = base, 2
        while label in labels:
            label, n = f"{base}_{n}", n + 1
        return label

    def _result_referenced(self, step_name: str, own: CommentedMap) -> bool:
        """Whether any template outside the step reads the step's result by name."""
        found = False

        def fn(text: str, path: tuple) -> None:
            nonlocal found
            if found or step_name not in text:
                return None
            try:
                found = any(r.name == step_name for r in free_names(text))
            except TemplateRewriteError:
                found = True
            return None

        for s in self.doc.get("workflow") or []:
            if s is not own and isinstance(s, dict):
                _walk_strings(s, fn)
        for key in ("workbook", "workload"):
            if key in self.doc:
                _walk_strings(self.doc[key], fn)
        return found

    def _add_passthrough(self, s: CommentedMap, tasks: list[_TaskRef], main: _TaskRef) -> None:
        """Keep the step's result (the main task's) when storage tasks now run after it."""
        if any(t.label.endswith("_result") and t.body.get("kind") == "noop" for t in tasks):
            return
        if not self._result_referenced(s["step"], s):
            return
        label = self._fresh_label(f"{s['step']}_result", tasks)
        tasks.append(_TaskRef(label, _cm(kind="noop", result=_tmpl(f"results.{main.label}")), "name"))

    def _storage_task(
        self, cfg: Any, main: _TaskRef, era: str, s: CommentedMap, key: str
    ) -> CommentedMap | None:
        """A legacy sink / save block -> a storage task (None for event-log sinks)."""
        if not isinstance(cfg, dict):
            raise _Refuse(f"`{key}` is not a mapping", s, key)
        params: dict[str, Any] = {}
        kind = None
        tool = cfg.get("tool")
        if isinstance(tool, dict):
            kind = tool.get("kind") or tool.get("type")
            params.update({k: v for k, v in tool.items() if k not in ("kind", "type")})
        elif isinstance(tool, str):
            kind = tool
        storage = cfg.get("storage")
        if isinstance(storage, dict):
            kind = kind or storage.get("type") or storage.get("kind")
            params.update({k: v for k, v in storage.items() if k not in ("type", "kind")})
        elif isinstance(storage, str):
            kind = kind or storage
        for k in ("backend", "kind", "type"):
            if kind is None and isinstance(cfg.get(k), str):
                kind = cfg[k]
        params.update(
            {k: v for k, v in cfg.items() if k not in ("tool", "storage", "backend", "kind", "type")}
        )
        if kind is None:
            raise _Refuse(f"`{key}` names no storage kind", s, key)
        kind = str(kind).lower()
        if kind in EVENT_LOG_KINDS:
            self.note("info", key, f"`{key}` to the event log needs no task: every result is recorded as an event",
                      s, key)  # fmt: skip
            return None
        main_kind = str(main.body.get("kind"))
        resolver = self._sink_resolver(main.label, main_kind, era)

        def rw(value: Any) -> Any:
            if isinstance(value, str):
                return _restyle(value, rewrite_template(value, resolver))
            if isinstance(value, dict):
                out = CommentedMap()
                for k, v in value.items():
                    out[k] = rw(v)
                return out
            if isinstance(value, list):
                return CommentedSeq([rw(v) for v in value])
            return value

        data = None
        for k in ("args", "data", "from"):
            if k in params and data is None:
                data = params.pop(k)
        statement = None
        for k in ("statement", "command", "commands", "query", "sql"):
            if k in params and statement is None:
                statement = params.pop(k)
        auth = params.pop("auth", params.pop("credential", None))
        table = params.pop("table", None)
        mode = str(params.pop("mode", "insert") or "insert").lower()
        keys = params.pop("key", params.pop("keys", None))
        task = CommentedMap()
        task["kind"] = kind
        if kind in ("postgres", "duckdb"):
            if kind == "postgres":
                if auth is None:
                    raise _Refuse("a postgres sink without `auth` (a credential name)", s, key)
                task["auth"] = auth
            if statement is not None:
                if data is not None and not isinstance(data, dict):
                    raise _Refuse("a sink statement's data is not a mapping", s, key)
                task["command"] = rw(self._statement_with_data(statement, data, kind, s, key))
            elif table is not None and isinstance(data, dict):
                if not _TABLE.match(str(table)):
                    raise _Refuse(f"table {table!r} is not a plain (schema.)name", s, key)
                task["command"] = LiteralScalarString(
                    _insert_sql(str(table), list(data), mode, keys, kind, s, key)
                )
                task["params"] = rw(data)
            else:
                raise _Refuse(f"a {kind} sink needs `statement` or `table` with a data mapping", s, key)
            extra = sorted(set(params) - {"database", "db_path", "schema", "spec", "batch", "chunk_size"})
            if extra:
                raise _Refuse(f"{kind} sink keys {extra} have no counterpart", s, key)
            for k in ("database", "db_path", "schema"):
                if k in params:
                    task[k] = rw(params[k])
        elif kind == "python":
            code = params.pop("code", None)
            if code is None:
                raise _Refuse("a python sink without `code`", s, key)
            task["code"] = code
            if data is not None:
                task["input"] = rw(data) if isinstance(data, dict) else _cm(data=rw(data))
            if params:
                raise _Refuse(f"python sink keys {sorted(params)} have no counterpart", s, key)
        elif kind == "http":
            for k in ("method", "url", "endpoint", "headers", "params", "timeout"):
                if k in params:
                    task[k] = rw(params.pop(k))
            task.setdefault("method", "POST")
            if data is not None:
                task["json"] = rw(data)
            if params:
                raise _Refuse(f"http sink keys {sorted(params)} have no counterpart", s, key)
        elif kind in STORAGE_KINDS:
            # the table tools write records by reference: `table` names the resource, one sink call is one record
            if table is not None:
                params.setdefault("resource", table)
            extra = sorted(set(params) - STORAGE_KIND_KEYS)
            if extra:
                raise _Refuse(f"{kind} sink keys {extra} have no counterpart", s, key)
            if "uri" not in params and "resource" not in params:
                raise _Refuse(f"a {kind} sink needs `uri` or `table`", s, key)
            for k, v in params.items():
                task[k] = rw(v)
            if isinstance(data, dict):
                task["data"] = CommentedSeq([rw(data)])
            elif data is not None:
                task["data"] = rw(data)
            if mode not in ("insert", "append"):
                task["mode"] = "overwrite" if mode in ("replace", "overwrite") else mode
        else:
            raise _Refuse(f"storage kind {kind!r} has no standard tool", s, key)
        return task

    def _sink_resolver(self, main_label: str, main_kind: str, era: str) -> Resolver:
        """Inside a storage task, legacy result names read the main task's result."""
        whole = f"results.{main_label}"
        if main_kind == "http":
            unwrapped = f"{whole}.data"
        elif main_kind in ("postgres", "duckdb"):
            unwrapped = whole
        else:
            unwrapped = f"({whole}.data if {whole}.data is defined else {whole})"

        def resolver(ref: NameRef) -> tuple[str, int] | None:
            if ref.name in ("response", "this"):
                return whole, 0
            if ref.name == "result":
                return (whole if era == "v1" else unwrapped), 0
            if ref.name == "data":
                return unwrapped, 0
            return None

        return resolver

    def _statement_with_data(self, statement: Any, data: Any, kind: str, s: CommentedMap, key: str) -> Any:
        """A sink statement: `:name` binds and `{{ data.x }}` read the sink's data mapping."""
        if not isinstance(statement, str):
            raise _Refuse("a sink statement is not a string", s, key)
        if not isinstance(data, dict):
            return statement
        exprs: dict[str, str] = {}
        for k, v in data.items():
            e = single_expression(v) if isinstance(v, str) else None
            exprs[str(k)] = (
                e if e is not None else repr(_plain(v)) if not isinstance(v, str) else repr(str(v))
            )
        if "{{" not in statement:

            def bind(m: re.Match) -> str:
                name = m.group(1)
                if name not in exprs:
                    raise _Refuse(f"statement bind :{name} is not in the sink data", s, key)
                return "{{ " + exprs[name] + " }}"

            return _restyle(statement, re.sub(r"(?<![:\w]):([A-Za-z_]\w*)", bind, statement))

        def resolver(ref: NameRef) -> tuple[str, int] | None:
            if ref.name == "data" and ref.path and ref.path[0] in exprs:
                return _group(exprs[ref.path[0]]), 1
            return None

        return _restyle(statement, rewrite_template(statement, resolver))

    # -- case ----------------------------------------------------------------------
    def _case(self, s: CommentedMap, path: tuple) -> None:
        """`case` rules -> arcs (their `next`), task policy rules (retry, fail, set) and storage tasks (sink, log)."""
        name = s["step"]
        is_loop = isinstance(s.get("loop"), dict)
        try:
            rules = s["case"]
            if not isinstance(rules, list):
                raise _Refuse("`case` is not a list", s, "case")
            arc_groups: list[_Group] = []
            pipe: list[tuple[str, dict[str, Any], Any]] = []  # (policy condition, actions, rule node)
            for i, rule in enumerate(rules):
                if not isinstance(rule, dict) or "when" not in rule or "then" not in rule:
                    raise _Refuse("a case rule is not `{when, then}`", rules, i)
                cond = single_expression(rule["when"])
                if cond is None:
                    raise _Refuse(
                        f"case condition {rule['when']!r} is not one `{{{{ expression }}}}`", rules, i
                    )
                actions = self._case_actions(rule["then"], rules, i)
                unknown = sorted(set(actions) - {"next", "sink", "retry", "set", "vars", "log", "fail"})
                if unknown:
                    raise _Refuse(f"case actions {unknown} have no standard counterpart", rules, i)
                if "next" in actions:
                    set_ = self._ctx_set(actions.get("set") or actions.get("vars"))
                    arc_cond = self._arc_expr(cond, name, is_loop)
                    arc_groups.append(_Group("cond", self._targets(actions["next"]), when=_tmpl(arc_cond), set=set_,
                                             line=_line(rules, i)))  # fmt: skip
                pipe_actions = {k: v for k, v in actions.items() if k in ("sink", "retry", "log", "fail")}
                if not pipe_actions and ("set" in actions or "vars" in actions) and "next" not in actions:
                    pipe_actions["set"] = actions.get("set") or actions.get("vars")
                if pipe_actions:
                    pipe.append((cond, pipe_actions, rules[i]))
            tasks = None
            if pipe:
                tasks = self._case_pipeline(s, pipe)
            structural = self._legacy_groups(s) if isinstance(s.get("next"), (list, str)) else None
            if isinstance(s.get("next"), dict):
                if arc_groups:
                    raise _Refuse("`case` routing next to a `next` router", s, "case")
                structural = None
            groups = arc_groups + [_Group("default", g.targets, set=g.set) if g.kind == "always" else g
                                   for g in (structural or [])]  # fmt: skip
            router = self._router(groups, None, self._cond_expr_plain) if groups else None
        except _Refuse as e:
            self.refuse(e, "case", s, "case", (*path, "case"))
            return
        except TemplateRewriteError as e:
            self.refuse(_Refuse(str(e)), "case", s, "case", (*path, "case"))
            return
        if tasks is not None:
            self._set_pipeline(s, tasks)
        if router is not None:
            if "next" in s:
                self._replace_next(s, router)
            else:
                s.insert(_index(s, "case"), "next", router)
        _pop(s, "case")

    @staticmethod
    def _case_actions(then: Any, node: Any, key: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if isinstance(then, dict):
            out = dict(then)
        elif isinstance(then, list):
            targets = [a for a in then if isinstance(a, dict) and isinstance(a.get("step"), str)]
            if targets:  # `then: [- step: x]`: targets written directly
                out["next"] = targets
            for a in then:
                if a in targets:
                    continue
                if not isinstance(a, dict):
                    raise _Refuse("a case action is not a mapping", node, key)
                for k, v in a.items():
                    if k in out:
                        raise _Refuse(f"case action {k!r} appears twice in one rule", node, key)
                    out[k] = v
        else:
            raise _Refuse("case `then` is not a mapping", node, key)
        res = out.get("result")
        if isinstance(res, dict) and set(res) == {"from"} and res["from"] in ("response", "result"):
            del out["result"]  # the step's result is its tool's response already
        return out

    def _ctx_set(self, raw: Any) -> CommentedMap | None:
        if raw is None:
            return None
        if isinstance(raw, list) and all(isinstance(x, dict) and set(x) == {"name", "value"} for x in raw):
            raw = {x["name"]: x["value"] for x in raw}  # the `[{name, value}]` spelling
        if not isinstance(raw, dict):
            raise _Refuse("a case `set` is not a mapping")
        out = CommentedMap()
        for k, v in raw.items():
            key = str(k) if str(k).startswith(("ctx.", "iter.")) else f"ctx.{k}"
            out[key] = v
        return out

    def _arc_expr(self, cond: str, step_name: str, is_loop: bool) -> str:
        """A case condition evaluated by routing: event names mapped, response/result -> the step's result."""

        def events(n: str) -> Any:
            if is_loop:
                if n == "loop.done":
                    return ["loop.done"]
                raise _Refuse(
                    f"a loop step's case routes on {n!r} per iteration; arcs run once, after the loop"
                )
            return {"call.done": ["call.done"], "call.error": ["call.error"], "step.exit": ["call.done", "call.error"],
                    "loop.done": ["loop.done"]}.get(n) or _raise(_Refuse(f"event {n!r} has no routing counterpart"))  # fmt: skip

        def resolver(ref: NameRef) -> tuple[str, int] | None:
            if ref.name in ("response", "result", "this"):
                return step_name, 0
            if ref.name == "error":
                return "outcome.error", 0
            return None

        expr = rewrite_event_names(cond, events)
        return rewrite_template("{{ " + expr + " }}", resolver)[3:-3]

    def _case_pipeline(self, s: CommentedMap, pipe: list[tuple[str, dict[str, Any], Any]]) -> list[_TaskRef]:
        tasks, main = self._main_task(s)
        kind = str(main.body.get("kind"))
        name = s["step"]
        rules: list[CommentedMap] = []
        chains: list[list[_TaskRef]] = []
        for cond, actions, node in pipe:
            pcond = self._policy_expr(cond, kind, name)
            then = CommentedMap()
            chain: list[_TaskRef] = []
            if "retry" in actions:
                if set(actions) - {"retry"}:
                    raise _Refuse("a case rule that retries and also stores or logs", node)
                r = actions["retry"]
                if not isinstance(r, dict):
                    raise _Refuse("case `retry` is not a mapping", node)
                if set(r) & {"params", "url", "method", "headers", "body", "data", "json"}:
                    raise _Refuse(
                        "pagination retries (new request parameters) are not translated; use a jump rule",
                        node,
                    )
                retry_rule = self._retry_rule(
                    {k: v for k, v in r.items() if k not in ("when", "retry_when")}, kind, name
                )
                retry_then = retry_rule["then"]
                rules.append(_cm(("when", _tmpl(pcond)), ("then", retry_then)))
                continue
            if "sink" in actions:
                sinks = actions["sink"] if isinstance(actions["sink"], list) else [actions["sink"]]
                for sk in sinks:
                    built = self._storage_task(sk, main, "v2", s, "case")
                    if built is not None:
                        label = self._fresh_label(
                            f"{name}_sink", tasks + [t for c in chains for t in c] + chain
                        )
                        chain.append(_TaskRef(label, built, "name"))
            if "log" in actions:
                label = self._fresh_label(f"{name}_log", tasks + [t for c in chains for t in c] + chain)
                msg = actions["log"]
                if isinstance(msg, str):
                    msg = _restyle(msg, rewrite_template(msg, self._sink_resolver(main.label, kind, "v2")))
                chain.append(_TaskRef(label, _cm(("kind", "python"), ("input", _cm(("message", _dq(msg)))),
                                                 ("code", LiteralScalarString("print(message)\nresult = {'logged': message}\n"))), "name"))  # fmt: skip
            if "set" in actions:
                set_ = self._ctx_set(actions["set"])
                assert set_ is not None
                then["set_ctx"] = CommentedMap(
                    (k[4:] if k.startswith("ctx.") else k, v) for k, v in set_.items()
                )
            if chain:
                then.insert(0, "do", "jump")
                then.insert(1, "to", chain[0].label)
                chains.append(chain)
            elif "fail" in actions:
                then.insert(0, "do", "fail")
            else:
                status = (
                    "ok"
                    if "outcome.status == 'ok'" in pcond
                    else "error"
                    if "outcome.status == 'error'" in pcond
                    else None
                )
                if status is None:
                    raise _Refuse(
                        "a case rule that only sets values must test the outcome (call.done / call.error)",
                        node,
                    )
                then.insert(0, "do", "continue" if status == "ok" else "fail")
            rules.append(_cm(("when", _tmpl(pcond)), ("then", _flow(then) if len(then) <= 2 else then)))
        if chains:
            rules.append(_cm(("when", _tmpl("outcome.status == 'ok'")), ("then", _flow(_cm(do="break")))))
        self._add_rules(main.body, rules, s, "case")
        for chain in chains:
            tasks.extend(chain)
        passthrough_before = len(tasks)
        self._add_passthrough(s, tasks, main)
        end_label = tasks[passthrough_before].label if len(tasks) > passthrough_before else None
        # the last task of each chain ends the pipeline (or goes to the passthrough), failures included:
        # the legacy worker logged a failed sink and carried on
        for chain in chains:
            last = chain[-1]
            is_final = tasks[-1] is last
            if end_label:
                then = _flow(_cm(do="jump", to=end_label))
            else:
                then = _flow(_cm(do="continue" if is_final else "break"))
            self._add_rules(last.body, [_cm(("else", _cm(("then", then))))], s, "case")
            for t in chain[:-1]:
                self._add_rules(t.body, [_cm(("when", _tmpl("outcome.status == 'error'")),
                                              ("then", _flow(_cm(do="jump", to=last.label))))], s, "case")  # fmt: skip
        return tasks

    # -- python main() parameters fed by arcs ---------------------------------------
    def _passthrough_inputs(self, s: CommentedMap, path: tuple) -> None:
        """v1 bound `main(...)` parameters from values routed in with `with`; make them inputs."""
        incoming = self.incoming.get(s["step"], set())
        for t in _task_items(s.get("tool")) or [] if incoming else []:
            _bind_main_params(t.body, incoming)

    # -- v1 loops: a loop step whose `next` chain ends at an end_loop step -------------
    def _v1_loops(self) -> None:
        ends = {str(s["end_loop"]): s for s in self.steps.values() if "end_loop" in s}
        for loop_name, end in ends.items():
            loop = self.steps.get(loop_name)
            if loop is None or not isinstance(loop.get("loop"), dict) or "tool" in loop or "type" in loop:
                continue
            idx = self.doc["workflow"].index(loop)
            try:
                # a dry run on a copy first: a refusal must leave the real document untouched
                trial = _Migrator(copy.deepcopy(self.doc), self.file)
                trial.v1 = self.v1
                trial._index_steps()
                trial._scan()
                trial._collapse(trial.steps[loop_name], trial.steps[end["step"]])
                self._collapse(loop, end)
            except (_Refuse, TemplateRewriteError) as e:
                err = e if isinstance(e, _Refuse) else _Refuse(str(e))
                self.refuse(err, "end-loop", loop, "loop", ("workflow", idx, "loop"))
                # the loop, its chain and its end step stay exactly as written
                self.frozen.update(id(st) for st in self._region(loop, end))

    def _collapse(self, L: CommentedMap, E: CommentedMap) -> None:
        """Fold the steps between loop step L and its end_loop step E into L's pipeline."""
        l_trailing, e_trailing = _take_trailing(L), _take_trailing(E)
        try:
            self._collapse_into(L, E)
        finally:
            _give_trailing(L, l_trailing)
            _give_trailing(E, e_trailing)

    def _collapse_into(self, L: CommentedMap, E: CommentedMap) -> None:
        lname, ename = L["step"], E["step"]
        entry_groups = self._legacy_groups(L)
        if not entry_groups or len(entry_groups) != 1 or entry_groups[0].kind != "always" \
                or len(entry_groups[0].targets) != 1:  # fmt: skip
            raise _Refuse("the loop step must route to exactly one first body step", L, "next")
        entry = entry_groups[0].targets[0]
        # the body: every step reachable from the entry without passing E
        body: list[str] = []
        routes: dict[str, list[_Group]] = {}
        todo = [entry.step]
        while todo:
            n = todo.pop()
            if n in body or n == ename:
                continue
            st = self.steps.get(n)
            if st is None:
                raise _Refuse(f"the loop body routes to missing step {n!r}", L, "next")
            if n == lname:
                raise _Refuse("the loop body routes back to the loop step", L, "next")
            for k in ("loop", "case", "sink", "save", "retry", "vars", "end_loop", "when"):
                if k in st:
                    raise _Refuse(f"body step {n!r} has `{k}`; nested constructs are not folded", st, k)
            body.append(n)
            groups = self._legacy_groups(st) or []
            routes[n] = groups
            for g in groups:
                todo.extend(t.step for t in g.targets)
        order = [n for n in self.steps if n in body]  # file order
        pos = {n: i for i, n in enumerate(order)}
        reachable = self._reachable_from_entry()
        outside_refs: set[str] = set()
        for n, st in self.steps.items():
            if n in body or n == lname:
                continue
            for g in self._legacy_groups(st, quiet=True) or []:
                for t in g.targets:
                    if t.step in body:
                        if n in reachable:
                            raise _Refuse(
                                f"step {n!r} outside the loop routes into its body step {t.step!r}", L, "next"
                            )
                        outside_refs.add(t.step)
        for n in order:
            kinds = [g.kind for g in routes[n]]
            if any(len(g.targets) != 1 for g in routes[n]) or kinds.count("always") > 1:
                raise _Refuse(
                    f"body step {n!r} fans out; a pipeline runs one task at a time", self.steps[n], "next"
                )
            if "always" in kinds and len(kinds) > 1:
                raise _Refuse(
                    f"body step {n!r} routes both always and on conditions (a fan-out)", self.steps[n], "next"
                )
            for g in routes[n]:
                if g.targets[0].step != ename and pos[g.targets[0].step] <= pos[n]:
                    raise _Refuse(f"body step {n!r} routes backwards; not folded", self.steps[n], "next")
        # tasks: one per body step (v1 tool conversion first), then the iteration result
        tasks: list[_TaskRef] = []
        for n in order:
            st = self.steps[n]
            self._v1_tool(st, ("workflow", self.doc["workflow"].index(st)))
            items = _task_items(st.get("tool"))
            if not items or len(items) != 1:
                raise _Refuse(f"body step {n!r} does not run exactly one task", st, "step")
            tb = items[0].body
            if isinstance(st.get("with"), dict) or isinstance(st.get("args"), dict):
                raise _Refuse(f"body step {n!r} has `with` without a task", st, "with")
            tb = copy.deepcopy(tb) if n in outside_refs else tb
            if isinstance(st.get("desc"), str) and "desc" not in tb:
                tb.insert(
                    1 if "kind" in tb else 0, "desc", st["desc"]
                )  # the step's description stays with its task
            tasks.append(_TaskRef(n, tb, "name"))
        collector = self._fresh_label(f"{lname}_iteration", tasks)
        names = set(order)

        def body_resolver(current: str | None, in_policy: bool) -> Resolver:
            def resolver(ref: NameRef) -> tuple[str, int] | None:
                if in_policy and ref.name == current:
                    return "outcome.result", 0
                if ref.name in names:
                    return f"results.{ref.name}", 0
                return None

            return resolver

        def rw(value: Any, resolver: Resolver) -> Any:
            if isinstance(value, str):
                return _restyle(value, rewrite_template(value, resolver))
            if isinstance(value, dict):
                for k in list(value.keys()):
                    if k not in RAW_TEXT_KEYS:
                        value[k] = rw(value[k], resolver)
                return value
            if isinstance(value, list):
                for i in range(len(value)):
                    value[i] = rw(value[i], resolver)
                return value
            return value

        # values routed in with `with` become iteration-scope writes (set_iter) of the rule that routes
        def set_iter_of(t: _Target, current: str | None) -> CommentedMap | None:
            if not isinstance(t.args, dict) or not t.args:
                return None
            out = CommentedMap()
            for k, v in t.args.items():
                out[k] = rw(copy.deepcopy(v), body_resolver(current, True))
            return out

        labels = [t.label for t in tasks] + [collector]
        first_writes = set_iter_of(entry, None)
        routed_in: dict[str, set[str]] = {entry.step: set(entry.args or {})}
        for n in order:
            for g in routes[n]:
                for tgt in g.targets:
                    routed_in.setdefault(tgt.step, set()).update(str(k) for k in (tgt.args or {}))
        for i, n in enumerate(order):
            _bind_main_params(tasks[i].body, routed_in.get(n, set()))
        for i, n in enumerate(order):
            t = tasks[i]
            rw(t.body, body_resolver(n, False))
            nxt_label = labels[i + 1]
            rules = CommentedSeq()

            def jump(target: str, writes: CommentedMap | None, nxt_label: str = nxt_label) -> CommentedMap:
                to = collector if target == ename else target
                then = CommentedMap()
                then["do"] = "continue" if to == nxt_label else "jump"
                if to != nxt_label:
                    then["to"] = to
                if writes:
                    then["set_iter"] = writes
                return then

            groups = routes[n]
            if not groups:  # a dead end ends the iteration
                rules.append(
                    _cm(("when", _tmpl("outcome.status == 'ok'")), ("then", _flow(jump(ename, None))))
                )
            elif groups[0].kind == "always":
                tgt = groups[0].targets[0]
                then = jump(tgt.step, set_iter_of(tgt, n))
                if then["do"] != "continue" or "set_iter" in then:
                    rules.append(_cm(("when", _tmpl("outcome.status == 'ok'")), ("then", then)))
            else:
                conds = [g for g in groups if g.kind == "cond"]
                default = [g for g in groups if g.kind == "default"]
                for g in conds:
                    expr = single_expression(g.when)
                    if expr is None:
                        raise _Refuse(
                            f"condition {g.when!r} is not one `{{{{ expression }}}}`", self.steps[n], "next"
                        )
                    pexpr = rewrite_template("{{ " + expr + " }}", body_resolver(n, True))[3:-3]
                    tgt = g.targets[0]
                    rules.append(_cm(("when", _tmpl(conjoin("outcome.status == 'ok'", pexpr))),
                                     ("then", jump(tgt.step, set_iter_of(tgt, n)))))  # fmt: skip
                tgt = default[0].targets[0] if default else None
                rules.append(_cm(("when", _tmpl("outcome.status == 'ok'")),
                                 ("then", jump(tgt.step if tgt else ename, set_iter_of(tgt, n) if tgt else None))))  # fmt: skip
            if rules:
                spec = t.body.setdefault("spec", CommentedMap())
                policy = spec.setdefault("policy", CommentedMap())
                if "rules" in policy:
                    raise _Refuse(f"body step {n!r} already has policy rules", self.steps[n], "tool")
                policy["rules"] = rules
        if first_writes:
            first = tasks[0].body
            inputs = CommentedMap()
            for k, v in first_writes.items():
                inputs[k] = v
            # the first body step read the loop's `with` values as names: bind them for the whole iteration
            tasks.insert(0, _TaskRef(self._fresh_label(f"{lname}_bind", tasks), _cm(
                ("kind", "noop"),
                ("spec", _cm(("policy", _cm(("rules", CommentedSeq([_cm(("else", _cm(("then", _cm(
                    ("do", "continue"), ("set_iter", inputs))))))]))))))), "name"))  # fmt: skip
            del first
        # the iteration's result: {body step: its result} (the v1 `<loop>_results` item)
        collect = CommentedMap()
        for n in order:
            collect[n] = _tmpl(f"results.{n} | default(none)")
        tasks.append(_TaskRef(collector, _cm(("kind", "noop"), ("result", collect)), "name"))
        # workbook calls cannot keep their label in a `{name: ...}` list item; label-map form keeps both
        L_tool = CommentedSeq()
        for t in tasks:
            body = t.body
            if body.get("kind") == "workbook":
                L_tool.append(_cm((t.label, body)))
            else:
                if "name" in body:
                    body.pop("name")
                body.insert(0, "name", t.label)
                L_tool.append(body)
        # E: its `result` becomes a task computing it; references to the loop body read the last iteration
        post = self._post_loop_resolver(lname, names)
        end_args = E.get("with")
        self._fold_end(E, lname, post)
        L_next = _cm(
            ("spec", _flow(_cm(mode="exclusive"))),
            ("arcs", CommentedSeq([self._arc(_Target(ename, end_args))])),
        )
        if "with" in E:
            _pop(E, "with")
        # write L
        self._replace_next(L, L_next)
        _put(L, "tool", L_tool, before="next")
        # the body steps are gone from the workflow, unless an unreachable step still routes to them
        wf = self.doc["workflow"]
        for n in order:
            if n not in outside_refs:
                wf.remove(self.steps[n])
                del self.steps[n]
        for st in wf:
            if isinstance(st, dict) and st is not L:
                for key in (
                    "next",
                    "tool",
                    "set",
                    "vars",
                    "case",
                    "sink",
                    "save",
                    "result",
                    "with",
                    "args",
                    "input",
                ):
                    if key in st and st is not E:
                        st[key] = rw(st[key], post)
        self.note("info", "end-loop", f"steps {order} became the pipeline of loop step {lname!r}; {ename!r} runs "
                  "once after the loop", L, "loop", ("workflow", wf.index(L), "loop"))  # fmt: skip
        for n in sorted(outside_refs):
            self.note("warning", "end-loop", f"step {n!r} is also kept as a step: a step unreachable from the entry "
                      "routes to it", self.steps[n], "step")  # fmt: skip

    def _post_loop_resolver(self, lname: str, body: set[str]) -> Resolver:
        def resolver(ref: NameRef) -> tuple[str, int] | None:
            if ref.name in body:
                return f"({lname}.results | last).{ref.name}", 0
            return None

        return resolver

    def _fold_end(self, E: CommentedMap, lname: str, post: Resolver) -> None:
        """The end_loop step: its `result` (keys may read earlier keys) becomes a noop task returning it."""
        res = E.get("result")
        keys_so_far: dict[str, str] = {}
        if isinstance(res, dict) and res:
            out = CommentedMap()
            for k, v in res.items():
                if isinstance(v, str):

                    def inline(ref: NameRef, _known: dict[str, str] = keys_so_far) -> tuple[str, int] | None:
                        if ref.name in _known:
                            return _group(_known[ref.name]), 0
                        return post(ref)

                    new = rewrite_template(v, inline)
                    out[k] = _restyle(v, new)
                    e = single_expression(new)
                    if e is not None:
                        keys_so_far[str(k)] = e
                else:
                    out[k] = v
            E.insert(_index(E, "result"), "tool", _cm(("kind", "noop"), ("result", out)))
            _pop(E, "result")
        elif "result" in E:
            _pop(E, "result", None)
        # E's own arcs read its result keys by bare name (v1 put them in the global context)
        if keys_so_far or isinstance(res, dict):
            rkeys = set(res.keys()) if isinstance(res, dict) else set()
            ename = E["step"]

            def own(ref: NameRef) -> tuple[str, int] | None:
                if ref.name in rkeys:
                    return f"{ename}.{ref.name}", 0
                return post(ref)

            if "next" in E:
                E["next"] = _rewrite_all(E["next"], own)
        _pop(E, "end_loop")

    def _reachable_from_entry(self) -> set[str]:
        wf = [s for s in self.doc["workflow"] if isinstance(s, dict)]
        if not wf:
            return set()
        entry = "start" if "start" in self.steps else wf[0].get("step")
        seen: set[str] = set()
        todo = [entry]
        while todo:
            n = todo.pop()
            if n in seen or n not in self.steps:
                continue
            seen.add(n)
            for g in self._legacy_groups(self.steps[n], quiet=True) or []:
                todo.extend(t.step for t in g.targets)
            nxt = self.steps[n].get("next")
            if isinstance(nxt, dict):
                todo.extend(a.get("step") for a in nxt.get("arcs") or [] if isinstance(a, dict))
            end = self.steps[n].get("loop")
            if end is not None:  # a v1 loop step continues at its end_loop step
                todo.extend(s["step"] for s in self.steps.values() if s.get("end_loop") == n)
        return seen


ARG_KEYS = ("with", "args", "data", "input")  # what a legacy target passes on (v1 `data` / `input` spellings)


def _target_args(item: dict, node: Any, key: Any) -> Any:
    present = [k for k in ARG_KEYS if k in item]
    if len(present) > 1:
        raise _Refuse(f"a routing target passes values under several keys {present}", node, key)
    args = item[present[0]] if present else None
    if args is not None and not isinstance(args, dict):
        raise _Refuse("the values a routing target passes are not a mapping", node, key)
    return args


def _group_always(expr: str) -> str:
    return f"({expr})" if _needs_parens(expr) or " " in expr.strip() else expr


def _raise(e: Exception) -> Any:
    raise e


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


def _bind_main_params(body: CommentedMap, incoming: set[str]) -> None:
    """Python ``main(p)`` read ``p`` from values routed in (v1 `with`); give it ``input: {p: "{{ p }}"}``."""
    if body.get("kind") != "python" or not isinstance(body.get("code"), str):
        return
    inputs = body.get("input") if isinstance(body.get("input"), dict) else {}
    missing = [p for p in _main_params(body["code"]) if p in incoming and p not in inputs and p not in body]
    if not missing:
        return
    if "input" not in body:
        body.insert(_index(body, "code"), "input", CommentedMap())
    for p in missing:
        body["input"][p] = _tmpl(p)


_COMMAND_N = re.compile(r"command_\d+")


def _count_statements(sql: str) -> int:
    """Statements in a SQL text (top-level `;`, quotes and comments respected)."""
    return len(split_sql(sql)) or 1


def _storage_kind(cfg: Any) -> str | None:
    if not isinstance(cfg, dict):
        return None
    tool, storage = cfg.get("tool"), cfg.get("storage")
    for cand in (tool.get("kind") if isinstance(tool, dict) else tool,
                 storage.get("type") if isinstance(storage, dict) else storage,
                 cfg.get("backend"), cfg.get("kind"), cfg.get("type")):  # fmt: skip
        if isinstance(cand, str):
            return cand.lower()
    return None


def _main_params(code: str) -> list[str]:
    import ast

    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "main":
            return [a.arg for a in node.args.args + node.args.kwonlyargs]
    return []


def _insert_sql(table: str, cols: list[Any], mode: str, keys: Any, kind: str, s: Any, key: str) -> str:
    names = [str(c) for c in cols]
    bad = [c for c in names if not _IDENT.match(c)]
    if bad:
        raise _Refuse(f"sink columns {bad} are not plain names", s, key)
    if mode not in ("insert", "append", "upsert", "merge"):
        raise _Refuse(f"sink mode {mode!r} has no counterpart (insert / upsert)", s, key)
    ph = [f"%({c})s" if kind == "postgres" else f"${c}" for c in names]
    sql = f"INSERT INTO {table} ({', '.join(names)})\nVALUES ({', '.join(ph)})"
    if mode in ("upsert", "merge"):
        key_list = [str(k) for k in (keys if isinstance(keys, list) else [keys])] if keys else []
        if not key_list:
            raise _Refuse("an upsert sink without `key`", s, key)
        if any(not _IDENT.match(k) for k in key_list):
            raise _Refuse(f"sink keys {key_list} are not plain names", s, key)
        rest = [c for c in names if c not in key_list]
        if rest:
            sets = ",\n  ".join(f"{c} = EXCLUDED.{c}" for c in rest)
            sql += f"\nON CONFLICT ({', '.join(key_list)}) DO UPDATE SET\n  {sets}"
        else:
            sql += f"\nON CONFLICT ({', '.join(key_list)}) DO NOTHING"
    return sql + ";\n"


# ---------------------------------------------------------------------------
# public API


def migrate_text(text: str, file: str = "<memory>") -> MigrationResult:
    """Migrate one playbook's YAML text; the result keeps the original when nothing is legacy."""
    from noetl_dagster.dsl.legacy import find_legacy_constructs

    try:  # libyaml first: most files are standard already and need no round-trip tree
        quick = yaml.load(text, Loader=_FastLoader)
    except yaml.YAMLError:
        quick = None  # let ruamel report the error with its line
    if isinstance(quick, dict) and quick.get("kind") == "Playbook" and not find_legacy_constructs(quick):
        return MigrationResult(file, text, text, [])
    y = _yaml_for(text)
    try:
        doc = y.load(text)
    except YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise MigrationInputError(f"{file}:{line}: yaml-syntax: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(doc, CommentedMap):
        raise MigrationInputError(f"{file}:1: not-a-playbook: the document is not a mapping")
    mapping, sequence, offset = _layout(doc)
    y.indent(mapping=mapping, sequence=sequence, offset=offset)
    if doc.get("kind") != "Playbook":
        raise MigrationInputError(f"{file}:1: not-a-playbook: `kind` is {doc.get('kind')!r}, not Playbook")
    if not _needs_migration(doc, find_legacy_constructs):
        return MigrationResult(file, text, text, [])
    before = _plain(doc)
    m = _Migrator(doc, file)
    m.run()
    if _plain(doc) == before:  # only refusals: keep the file byte for byte
        return MigrationResult(file, text, text, sorted(m.notes, key=lambda n: (n.line, n.level)))
    out = io.StringIO()
    y.dump(doc, out)
    new = out.getvalue()
    if not new.endswith("\n"):
        new += "\n"
    notes = sorted(m.notes, key=lambda n: (n.line, n.level))
    return MigrationResult(file, text, new, notes)


def _needs_migration(doc: CommentedMap, finder: Callable[[dict], list]) -> bool:
    if finder(doc):
        return True
    # steps with neither tool nor next: only rewritten inside files that are legacy anyway
    return False


def migrate_file(path: str | Path) -> MigrationResult:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise MigrationInputError(f"{p}: cannot read: {e.strerror}") from None
    return migrate_text(text, str(p))


def iter_notes(results: list[MigrationResult]) -> Iterator[MigrationNote]:
    for r in results:
        yield from r.notes
