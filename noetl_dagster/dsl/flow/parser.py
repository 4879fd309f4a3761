"""Flow text -> syntax tree (:mod:`.ast`), with Lark (LALR) and errors at line:column.

Literals are decoded here, so that a bad JSON or YAML literal is reported at
its own position in the flow file, and guard expressions are checked as
JSONPath.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from noetl_dagster.dsl.flow.ast import (
    Block,
    Declaration,
    FlowDocument,
    Guard,
    Label,
    Literal,
    Pos,
    Resource,
    ResourceLiteral,
    Statement,
    Step,
    TaskList,
    TaskRef,
)
from noetl_dagster.dsl.flow.errors import FlowSyntaxError, excerpt

GRAMMAR_FILE = Path(__file__).with_name("grammar.lark")

# what a person reads instead of terminal names in "expected ..." messages
_TERMINALS = {
    "ARROW": "an arrow (→ or ->)",
    "STAR": "'*'",
    "MERGE": "'>'",
    "DECLARE": "a declaration (@flow, @task)",
    "LABEL": "a label (:name)",
    "NAME": "a task name",
    "GUARD": "a guard (`jsonpath`)",
    "URI": "a resource (<uri>)",
    "DOC": "a documentation string (''' or \"\"\")",
    "PARAM_YAML": "parameters (- yaml -)",
    "PARAM_JSON_OBJECT": "parameters ({ json })",
    "PARAM_JSON_ARRAY": "parameters ([ json ])",
    "PARAM_EMPTY": "parameters ()",
    "RES_YAML": "a resource literal <- yaml ->",
    "RES_JSON_OBJECT": "a resource literal <{ json }>",
    "RES_JSON_ARRAY": "a resource literal <[ json ]>",
    "RES_EMPTY": "an empty resource literal <>",
    "SEMICOLON": "';'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "LSQB": "'['",
    "RSQB": "']'",
    "EQUAL": "'='",
    "QMARK": "'?'",
    "VBAR": "'|'",
    "$END": "the end of the flow",
}
_ORDER = list(_TERMINALS)


@cache
def _lark() -> Lark:
    return Lark(
        GRAMMAR_FILE.read_text(encoding="utf-8"),
        parser="lalr",
        start="start",
        propagate_positions=True,
        maybe_placeholders=False,
    )


def parse_flow(text: str, file: str | None = None) -> FlowDocument:
    """Parse flow text; raise :class:`FlowSyntaxError` (with line and column) when it is not valid."""
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as e:
        raise _syntax_error(e, text, file) from None
    builder = _Builder(text, file)
    doc = FlowDocument(text=text, file=file)
    for child in tree.children:
        if child.data == "statement":
            doc.statements.append(builder.statement(child))
        else:
            doc.declarations.append(builder.declaration(child))
    return doc


# -- errors ----------------------------------------------------------------------------


_LITERAL_GROUPS = {
    "PARAM_YAML": "parameters", "PARAM_JSON_OBJECT": "parameters", "PARAM_JSON_ARRAY": "parameters",
    "PARAM_EMPTY": "parameters", "RES_YAML": "a resource literal", "RES_JSON_OBJECT": "a resource literal",
    "RES_JSON_ARRAY": "a resource literal", "RES_EMPTY": "a resource literal",
}  # fmt: skip
# what may begin a statement: when all of these are expected, the statement before may end here
_STARTERS = {"LABEL", "NAME", "URI", "RES_YAML", "RES_JSON_OBJECT", "RES_JSON_ARRAY", "RES_EMPTY",
             "LBRACE", "LSQB", "QMARK", "STAR", "MERGE"}  # fmt: skip
_NEW_STATEMENT = _STARTERS | {"DECLARE", "SEMICOLON", "$END"}
_URI_BEFORE = re.compile(r"<[^\s<>\-{\[][^\s<>]*>\s*$")
_LABEL_AFTER_ARROW_BEFORE = re.compile(r"(?:→|->)\s*:[A-Za-z0-9_][A-Za-z0-9_:\-]*\s*$")


def _describe(names: set[str]) -> str:
    words: list[str] = []
    for n in sorted((n for n in names if n in _TERMINALS), key=_ORDER.index):
        word = _LITERAL_GROUPS.get(n, _TERMINALS[n])
        if word not in words:
            words.append(word)
    words += sorted(n for n in names if n not in _TERMINALS)
    if not words:
        return ""
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


def _expected(names: set[str]) -> str:
    """The expected terminals, with everything that could begin a new statement folded into one phrase."""
    if _STARTERS <= names:
        rest = _describe(names - _NEW_STATEMENT)
        tail = "a new statement" + (" or the end of the flow" if "$END" in names else "")
        return f"{rest}, {tail}" if rest else tail
    return _describe(names)


def _token_text(tok: Token) -> str:
    s = str(tok)
    return repr(s if len(s) <= 40 else s[:37] + "...")


def _syntax_error(e: UnexpectedInput, text: str, file: str | None) -> FlowSyntaxError:
    line, column = getattr(e, "line", None), getattr(e, "column", None)
    if isinstance(e, UnexpectedToken):
        tok = e.token
        if tok.type == "$END":
            line, column = _end_position(text)
            msg = "the flow ends unexpectedly"
        else:
            msg = f"unexpected {_token_text(tok)}"
        expected = _expected(set(e.accepts or e.expected))
        if expected:
            msg += f"; expected {expected}"
        hint = _hint(e, text)
        if hint:
            msg += f" ({hint})"
    elif isinstance(e, UnexpectedCharacters):
        ch = text[e.pos_in_stream] if e.pos_in_stream < len(text) else ""
        msg = f"unexpected character {ch!r}"
        if ch in "(<":
            msg += " (a literal that is never closed, or a resource <uri> with spaces?)"
        elif ch == "`":
            msg += " (a guard expression needs a closing back quote)"
        elif ch in ("'", '"'):
            msg += " (documentation needs three quotes on both sides)"
    elif isinstance(e, UnexpectedEOF):
        line, column = _end_position(text)
        msg = "the flow ends unexpectedly"
    else:  # pragma: no cover - lark has no other UnexpectedInput kinds
        msg = str(e)
    return FlowSyntaxError(msg, line, column, file=file, excerpt=excerpt(text, line, column))


def _hint(e: UnexpectedToken, text: str) -> str | None:
    tok = e.token
    before = text if tok.type == "$END" or tok.start_pos is None else text[: tok.start_pos]
    if tok.type == "ARROW" and _URI_BEFORE.search(before):
        return "a resource can only begin (load) or end (store) a flow statement"
    if tok.type == "ARROW" and _LABEL_AFTER_ARROW_BEFORE.search(before):
        return (
            "a label after an arrow is the input label of the task after it (`→ :x A`) or ends the statement"
        )
    if tok.type == "ARROW" and before.rstrip().endswith(("}", "]")) and "@task" in before:
        return (
            "a subflow right after a @task declaration is that task's subflow: end the declaration with ';'"
        )
    if tok.type == "$END" and ("RBRACE" in e.expected or "RSQB" in e.expected):
        return "a subflow is missing its closing bracket"
    return None


def _end_position(text: str) -> tuple[int, int]:
    """Just after the last character that is not blank."""
    lines = text.rstrip().split("\n")
    return len(lines), len(lines[-1]) + 1


# -- tree -> ast ---------------------------------------------------------------------------


def _pos(node: Tree | Token) -> Pos:
    if isinstance(node, Token):
        return Pos(node.line or 1, node.column or 1)
    return Pos(getattr(node.meta, "line", 1), getattr(node.meta, "column", 1))


class _Builder:
    def __init__(self, text: str, file: str | None):
        self.text = text
        self.file = file

    def error(self, message: str, pos: Pos) -> FlowSyntaxError:
        return FlowSyntaxError(message, pos.line, pos.column, file=self.file,
                               excerpt=excerpt(self.text, pos.line, pos.column))  # fmt: skip

    # statements ---------------------------------------------------------------------
    def statement(self, tree: Tree) -> Statement:
        st = Statement(steps=[], pos=_pos(tree))
        for child in tree.children:
            if isinstance(child, Token):  # ARROW
                continue
            if child.data == "source":
                st.source = self.source(child)
            elif child.data == "step":
                st.steps.append(self.step(child))
            elif child.data == "destination":
                for part in child.children:
                    if isinstance(part, Token) and part.type == "MERGE":
                        st.destination_merge = True
                    elif isinstance(part, Token) and part.type == "LABEL":
                        st.destination = self.label(part)
                    else:
                        st.destination = self.resource(part)
        return st

    def source(self, tree: Tree) -> Label | Resource | ResourceLiteral:
        (part,) = tree.children
        if isinstance(part, Token):
            return self.label(part)
        if part.data == "resource":
            return self.resource(part)
        (tok,) = part.children
        return ResourceLiteral(self.literal(tok), _pos(part))

    def step(self, tree: Tree) -> Step:
        target = None
        step = Step(target=None, pos=_pos(tree))  # type: ignore[arg-type]
        for child in tree.children:
            if isinstance(child, Token) and child.type == "LABEL":
                if target is None:
                    step.in_label = self.label(child)
                else:
                    step.out_label = self.label(child)
            elif child.data == "modifier":
                self.modifier(step, child)
            elif child.data == "task_list":
                tasks = [self.task(t) for t in child.children]
                target = tasks[0] if len(tasks) == 1 else TaskList(tasks, _pos(child))
            elif child.data == "block":
                target = self.block(child)
        step.target = target  # type: ignore[assignment]
        return step

    def modifier(self, step: Step, tree: Tree) -> None:
        (part,) = tree.children
        pos = _pos(tree)
        if isinstance(part, Token) and part.type == "STAR":
            if step.star:
                raise self.error("'*' is given twice for one step", pos)
            step.star = True
        elif isinstance(part, Token) and part.type == "MERGE":
            if step.merge:
                raise self.error("'>' is given twice for one step", pos)
            step.merge = True
        else:
            if step.guard is not None:
                raise self.error("a step has at most one guard", pos)
            step.guard = self.guard(part)

    def guard(self, tree: Tree) -> Guard:
        (tok,) = tree.children
        expr = str(tok)[1:-1].strip()
        pos = _pos(tok)
        if not expr:
            raise self.error("empty guard expression", pos)
        from noetl_dagster.dsl.flow.jsonpath import compile_path

        try:
            compile_path(expr)
        except ValueError as e:
            raise self.error(f"guard is not a valid JSONPath expression: {e}", pos) from None
        return Guard(expr, pos)

    def task(self, tree: Tree) -> TaskRef:
        name_tok = tree.children[0]
        params = self.params(tree.children[1]) if len(tree.children) > 1 else None
        return TaskRef(str(name_tok), params, _pos(name_tok))

    def block(self, tree: Tree) -> Block:
        statements = [self.statement(c) for c in tree.children if isinstance(c, Tree)]
        if not statements:
            raise self.error("a subflow needs at least one flow statement", _pos(tree))
        return Block(statements, _pos(tree))

    def resource(self, tree: Tree) -> Resource:
        uri_tok = tree.children[0]
        params = self.params(tree.children[1]) if len(tree.children) > 1 else None
        return Resource(str(uri_tok)[1:-1], params, _pos(uri_tok))

    def label(self, tok: Token) -> Label:
        return Label(str(tok)[1:], _pos(tok))

    def params(self, tree: Tree) -> Literal:
        (tok,) = tree.children
        return self.literal(tok)

    # declarations -------------------------------------------------------------------
    def declaration(self, tree: Tree) -> Declaration:
        decl_tok, name_tok, *rest = tree.children
        kind = str(decl_tok)[1:]
        pos = _pos(decl_tok)
        if kind not in ("flow", "task"):
            raise self.error(f"unknown declaration @{kind}; use @flow or @task", pos)
        decl = Declaration(kind=kind, name=str(name_tok), pos=pos)  # type: ignore[arg-type]
        for child in rest:
            if child.data == "alias":
                (tok,) = child.children
                decl.alias = TaskRef(str(tok), None, _pos(tok))
            elif child.data == "params":
                decl.params = self.params(child)
            elif child.data == "doc":
                (tok,) = child.children
                decl.doc = _dedent_doc(str(tok)[3:-3])
            elif child.data == "block":
                decl.block = self.block(child)
        if kind == "flow" and (decl.alias or decl.block):
            raise self.error("@flow takes a name, parameters and documentation only", pos)
        if decl.alias and decl.block:
            raise self.error(
                f"@task {decl.name} has an alias, so it cannot also have a subflow", decl.block.pos
            )
        return decl

    # literals -----------------------------------------------------------------------
    def literal(self, tok: Token) -> Literal:
        t = tok.type
        s = str(tok)
        pos = _pos(tok)
        if t in ("PARAM_EMPTY", "RES_EMPTY"):
            return Literal("empty", "", {}, pos)
        if t in ("PARAM_YAML", "RES_YAML"):
            body = s[2:-2]
            return Literal("yaml", body, self._yaml(body, pos, 2), pos)
        body = s[1:-1]  # keep the braces / brackets: they are the JSON value's own
        kind = "json_object" if t in ("PARAM_JSON_OBJECT", "RES_JSON_OBJECT") else "json_array"
        return Literal(kind, body, self._json(body, pos, 1), pos)  # type: ignore[arg-type]

    def _inside(self, pos: Pos, offset: int, line0: int, col0: int) -> Pos:
        """Position of (line0, col0) (0-based) inside a literal whose body starts ``offset`` after ``pos``."""
        if line0 == 0:
            return Pos(pos.line, pos.column + offset + col0)
        return Pos(pos.line + line0, col0 + 1)

    def _yaml(self, body: str, pos: Pos, offset: int) -> Any:
        if not body.strip():
            return {}
        try:
            value = yaml.safe_load(body)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
            where = self._inside(pos, offset, mark.line, mark.column) if mark else pos
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise self.error(f"invalid YAML literal: {problem}", where) from None
        return {} if value is None else value

    def _json(self, body: str, pos: Pos, offset: int) -> Any:
        try:
            return json.loads(body)
        except json.JSONDecodeError as e:
            where = self._inside(pos, offset, e.lineno - 1, e.colno - 1)
            raise self.error(f"invalid JSON literal: {e.msg}", where) from None


def _dedent_doc(text: str) -> str:
    import textwrap

    return textwrap.dedent(text).strip()
