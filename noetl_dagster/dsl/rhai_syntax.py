"""The syntax of NoETL's Rhai subset: the grammar, the lexer and a recursive-descent parser linear in
the code, building lark trees with line numbers (the interpreter is :mod:`noetl_dagster.dsl.rhai`)."""

from __future__ import annotations

import re
from typing import Any

from lark import Token, Tree
from lark.tree import Meta

# The subset's grammar (lark EBNF): the parser below implements it by hand, in time linear in the
# code; the tests parse every test script with lark's Earley parser of this grammar too and compare.
GRAMMAR = r"""
start: stmts
stmts: stmt* expr?
?stmt: "let" NAME ("=" expr)? ";"                 -> let
     | "const" NAME "=" expr ";"                   -> let
     | lvalue ASSIGN expr ";"                      -> assign
     | "while" expr block                          -> while_
     | "loop" block                                -> loop
     | "for" NAME "in" expr block                  -> for_
     | "break" ";"                                 -> break_
     | "continue" ";"                              -> continue_
     | "return" expr? ";"                          -> return_
     | if_expr                                     -> expr_stmt
     | block                                       -> expr_stmt
     | expr ";"                                    -> expr_stmt
     | ";"                                         -> empty
block: "{" stmts "}"
if_expr: "if" expr block ("else" (if_expr | block))?
lvalue: NAME (lv_prop | lv_index)*
lv_prop: "." NAME
lv_index: "[" expr "]"
ASSIGN: "=" | "+=" | "-=" | "*=" | "/=" | "%="
?expr: range_
?range_: or_ | or_ RANGEOP or_                     -> range
?or_: and_ | or_ "||" and_                         -> or_op
?and_: cmp | and_ "&&" cmp                         -> and_op
?cmp: sum | sum CMPOP sum                          -> binop
?sum: product | sum ADDOP product                  -> binop
?product: power | product MULOP power              -> binop
?power: unary | unary "**" power                   -> pow
?unary: postfix | "-" unary -> neg | "!" unary -> not_
?postfix: atom
        | postfix "." NAME "(" [args] ")"          -> method
        | postfix "." NAME                         -> prop
        | postfix "[" expr "]"                     -> index
        | NAME "(" [args] ")"                      -> call
args: expr ("," expr)*
?atom: INT                                          -> int_
     | FLOAT                                        -> float_
     | STRING                                       -> string
     | "true"                                       -> true
     | "false"                                      -> false
     | "(" ")"                                      -> unit
     | "(" expr ")"
     | "[" [expr ("," expr)* ","?] "]"              -> array
     | "#{" [pair ("," pair)* ","?] "}"             -> map
     | if_expr
     | NAME                                         -> var
pair: (NAME | STRING) ":" expr
RANGEOP: "..=" | ".."
CMPOP: "==" | "!=" | "<=" | ">=" | "<" | ">"
ADDOP: "+" | "-"
MULOP: "*" | "/" | "%"
NAME: /[A-Za-z_][A-Za-z0-9_]*/
INT: /\d[\d_]*/
FLOAT: /\d[\d_]*\.\d+([eE][+-]?\d+)?/
STRING: /"(\\.|[^"\\])*"/
COMMENT: /\/\/[^\n]*/ | /\/\*(.|\n)*?\*\//
%ignore COMMENT
%import common.WS
%ignore WS
"""

OUTSIDE = {
    "fn": "function definitions (`fn`)", "switch": "`switch` expressions", "import": "modules (`import`)",
    "export": "modules (`export`)", "try": "`try`/`catch`", "throw": "`throw`", "do": "`do` loops",
    "|": "closures (`|x| ...`)", "`": "backtick string interpolation", "'": "character literals",
    "private": "`private` functions", "global": "`global` variables", "this": "`this`", "Fn": "function pointers",
}  # fmt: skip
MAX_DEPTH = 64  # nested ( [ { of the code (Rhai's own default max expression depth)


class RhaiError(Exception):
    """A script outside the subset, a syntax error or a run-time error (one line, with the line number)."""

    def __init__(self, message: str, line: int | None = None, kind: str = "rhai_error"):
        super().__init__(f"line {line}: {message}" if line else message)
        self.line, self.kind = line, kind


def _line(node: Any) -> int | None:
    meta = getattr(node, "meta", None)
    line = getattr(meta, "line", None) if meta is not None and not getattr(meta, "empty", True) else None
    return line if line is not None else getattr(node, "line", None)


def _check_depth(code: str) -> None:
    """RhaiError when brackets nest deeper than MAX_DEPTH (strings and comments skipped): one linear
    scan, before a parse whose time and recursion grow with the nesting."""
    depth, line, i, n = 0, 1, 0, len(code)
    while i < n:
        c = code[i]
        if c == "\n":
            line += 1
        elif c == '"':
            i += 1
            while i < n and code[i] != '"':
                i += 2 if code[i] == "\\" else 1
        elif c == "/" and code.startswith("//", i):
            end = code.find("\n", i)  # (not `in code[i:]`: a copy of the rest at each comment)
            i = end - 1 if end >= 0 else n
        elif c == "/" and code.startswith("/*", i):
            end = code.find("*/", i + 2)
            line += code.count("\n", i, end if end >= 0 else n)
            i = end + 1 if end >= 0 else n
        elif c in "([{":
            depth += 1
            if depth > MAX_DEPTH:
                raise RhaiError(f"the script nests deeper than {MAX_DEPTH} brackets", line, "rhai_limit")
        elif c in ")]}":
            depth = max(0, depth - 1)
        i += 1


def _outside_symbol(sym: str, text: str) -> bool:
    if sym == "|":  # a closure, not `||`
        return any(
            text[i] == "|" and text[i - 1 : i] != "|" and text[i + 1 : i + 2] != "|" for i in range(len(text))
        )
    in_string = False
    for i, c in enumerate(text):
        if c == '"' and text[i - 1 : i] != "\\":
            in_string = not in_string
        elif c == sym and not in_string:
            return True
    return False


# -- the parser: recursive descent over GRAMMAR, linear in the code ---------------------------------
# One token of lookahead and no backtracking: each token is read once and each rule call either reads
# a token or ends, so the work (``steps``) grows with the code, never with its ambiguity (the Earley
# parse this replaces took 17 s on 16 KiB). It builds the very trees the Earley parse of GRAMMAR built,
# with their line numbers (tests/tools/test_rhai.py compares the two on every test script).
_LEX = re.compile(
    r"""(?P<ws>[ \t\r\f\v]+)|(?P<nl>\n)|(?P<comment>//[^\n]*|/\*(?:.|\n)*?\*/)
    |(?P<FLOAT>\d[\d_]*\.\d+(?:[eE][+-]?\d+)?)|(?P<INT>\d[\d_]*)|(?P<STRING>"(?:\\.|[^"\\])*")
    |(?P<NAME>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<op>\#\{|\.\.=|\.\.|\*\*|==|!=|<=|>=|&&|\|\||[-+*/%]=|[-+*/%=<>!.,;:()\[\]{}])""",
    re.VERBOSE,
)
_KEYWORDS = frozenset(("let", "const", "while", "loop", "for", "in", "break", "continue", "return", "if",
                       "else", "true", "false"))  # fmt: skip
_OPS = {  # operator -> (token type, binding power) of the left-associative levels
    "||": (None, 1), "&&": (None, 2), "==": ("CMPOP", 3), "!=": ("CMPOP", 3), "<=": ("CMPOP", 3),
    ">=": ("CMPOP", 3), "<": ("CMPOP", 3), ">": ("CMPOP", 3), "+": ("ADDOP", 4), "-": ("ADDOP", 4),
    "*": ("MULOP", 5), "/": ("MULOP", 5), "%": ("MULOP", 5),
}  # fmt: skip
_ASSIGN = frozenset(("=", "+=", "-=", "*=", "/=", "%="))
_CONTINUES = frozenset((*_OPS, "**", ".", "..", "..=")) - {"-"}  # after a statement `if`: an expression
_END = Token("$END", "")


def _tokens(code: str) -> list[Token]:
    out, line, line_start, pos, n = [], 1, 0, 0, len(code)
    while pos < n:
        m = _LEX.match(code, pos)
        if m is None:
            raise RhaiError(f"syntax error or construct outside the supported Rhai subset near {code[pos]!r}", line,
                            "rhai_syntax")  # fmt: skip
        kind, text = m.lastgroup, m.group()
        if kind == "nl":
            line, line_start = line + 1, m.end()
        elif kind != "ws":
            if kind == "NAME" and text in _KEYWORDS:
                kind = "op"
            if kind != "comment":
                out.append(Token(kind, text, pos, line, pos - line_start + 1))
            if "\n" in text:  # a block comment or a string over several lines
                line, line_start = line + text.count("\n"), pos + text.rfind("\n") + 1
        pos = m.end()
    out.append(_END)
    return out


def _tree(data: str, children: list, first: Any) -> Tree:
    """A node whose line is its first token's (lark's propagate_positions)."""
    meta = Meta()
    line = _line(first) if first is not None else None
    if line is not None:
        meta.line, meta.empty = line, False
    return Tree(data, children, meta)


class _Parser:
    def __init__(self, code: str):
        self.toks = _tokens(code)
        self.i = 0
        self.steps = len(self.toks)  # work done: a step a token, a step a node

    # -- tokens ------------------------------------------------------------------------------------
    def peek(self, k: int = 0) -> Token:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def at(self, *texts: str) -> bool:
        t = self.toks[self.i]
        return t.type == "op" and str(t) in texts

    def take(self, *texts: str) -> Token:
        t = self.toks[self.i]
        if texts and not self.at(*texts):
            self.fail(t)
        self.i += 1
        return t

    def name(self) -> Token:
        t = self.toks[self.i]
        if t.type != "NAME":
            self.fail(t)
        self.i += 1
        return t

    @staticmethod
    def fail(t: Token) -> None:
        got = str(t) if t.type != "$END" else "$END"
        raise RhaiError(f"syntax error or construct outside the supported Rhai subset near {got!r}",
                        t.line if t.type != "$END" else None, "rhai_syntax")  # fmt: skip

    def node(self, data: str, children: list, first: Any) -> Tree:
        self.steps += 1
        return _tree(data, children, first)

    # -- statements --------------------------------------------------------------------------------
    def parse(self) -> Tree:
        stmts = self.stmts()
        if self.peek().type != "$END":
            self.fail(self.peek())
        return self.node("start", [stmts], stmts)

    def stmts(self) -> Tree:
        first = self.peek()
        out: list[Any] = []
        while self.peek().type != "$END" and not self.at("}"):
            s = self.stmt()
            out.append(s)
            if s.data not in ("let", "assign", "while_", "loop", "for_", "break_", "continue_", "return_",
                              "expr_stmt", "empty"):  # fmt: skip
                break  # the trailing expression, without `;`: the block's value
        return self.node("stmts", out, first if out else None)

    def stmt(self) -> Tree:
        t = self.peek()
        word = str(t) if t.type == "op" else None
        if word in ("let", "const"):
            self.take()
            name = self.name()
            if word == "const" or self.at("="):
                self.take("=")
                value = self.expr()
                self.take(";")
                return self.node("let", [name, value], t)
            self.take(";")
            return self.node("let", [name], t)
        if word == "while":
            self.take()
            cond = self.expr()
            return self.node("while_", [cond, self.block()], t)
        if word == "loop":
            self.take()
            return self.node("loop", [self.block()], t)
        if word == "for":
            self.take()
            name = self.name()
            self.take("in")
            seq = self.expr()
            return self.node("for_", [name, seq, self.block()], t)
        if word in ("break", "continue"):
            self.take()
            self.take(";")
            return self.node(word + "_", [], t)
        if word == "return":
            self.take()
            value = [] if self.at(";") else [self.expr()]
            self.take(";")
            return self.node("return_", value, t)
        if word == ";":
            self.take()
            return self.node("empty", [], t)
        if word == "{":
            return self.node("expr_stmt", [self.block()], t)
        if word == "if":
            head = self.if_expr()
            if not (self.peek().type == "op" and str(self.peek()) in _CONTINUES):
                if self.at(";"):  # `if …;` is `expr ";"`: the same tree
                    self.take()
                return self.node("expr_stmt", [head], head)
            value = self.expr(head)
        else:
            value = self.expr()
            if self.peek().type == "op" and str(self.peek()) in _ASSIGN:
                op = self.take()
                target = self.lvalue(value, op, t)
                rhs = self.expr()
                self.take(";")
                return self.node("assign", [target, Token("ASSIGN", str(op), op.start_pos, op.line, op.column), rhs],
                                 t)  # fmt: skip
        if self.at(";"):
            self.take()
            return self.node("expr_stmt", [value], t)
        if self.peek().type != "$END" and not self.at("}"):
            self.fail(self.peek())
        return value

    def lvalue(self, value: Any, op: Token, first: Token) -> Tree:
        """``a.b[i]`` read as an expression, as the target of an assignment."""
        path: list[Any] = []
        while isinstance(value, Tree) and value.data in ("prop", "index"):
            obj, part = value.children
            path.append(self.node("lv_prop" if value.data == "prop" else "lv_index", [part], value.meta.op))
            value = obj
        if first.type != "NAME" or not (isinstance(value, Tree) and value.data == "var"):
            self.fail(op)
        return self.node("lvalue", [value.children[0], *reversed(path)], first)

    def block(self) -> Tree:
        t = self.take("{")
        body = self.stmts()
        self.take("}")
        return self.node("block", [body], t)

    def if_expr(self) -> Tree:
        """``if c {…} else if d {…} else {…}``: the chain read in a loop (a long one nests, no recursion)."""
        arms = []
        tail = None
        while True:
            t = self.take("if")
            cond = self.expr()
            arms.append((t, cond, self.block()))
            if not self.at("else"):
                break
            self.take()
            if not self.at("if"):
                tail = self.block()
                break
        for t, cond, body in reversed(arms):
            tail = self.node("if_expr", [cond, body] if tail is None else [cond, body, tail], t)
        return tail

    # -- expressions -------------------------------------------------------------------------------
    def expr(self, head: Any = None) -> Any:
        """range: or_ (RANGEOP or_)? ; ``head``: an operand already read (a statement's `if`)."""
        first = head or self.peek()
        left = self.binary(0, head)
        if self.at("..", "..="):
            op = self.take()
            right = self.binary(0)
            return self.node("range", [left, Token("RANGEOP", str(op), op.start_pos, op.line, op.column), right],
                             first)  # fmt: skip
        return left

    def binary(self, floor: int, head: Any = None) -> Any:
        """The left-associative levels by binding power (comparison takes one operator, not a chain)."""
        first = head or self.peek()
        left = self.power(head)
        while True:
            t = self.peek()
            entry = _OPS.get(str(t)) if t.type == "op" else None
            if entry is None or entry[1] <= floor:
                return left
            kind, power = entry
            self.take()
            right = self.binary(power)
            if kind is None:
                left = self.node("or_op" if str(t) == "||" else "and_op", [left, right], first)
            else:
                left = self.node(
                    "binop", [left, Token(kind, str(t), t.start_pos, t.line, t.column), right], first
                )
                if (
                    kind == "CMPOP"
                    and self.peek().type == "op"
                    and _OPS.get(str(self.peek()), (0, 0))[1] == 3
                ):
                    self.fail(self.peek())  # `a < b < c`: the grammar has no chained comparison

    def power(self, head: Any = None) -> Any:
        first = head or self.peek()
        base = self.unary(head)
        if self.at("**"):
            self.take()
            return self.node("pow", [base, self.power()], first)
        return base

    def unary(self, head: Any = None) -> Any:
        if head is None and self.at("-", "!"):
            t = self.take()
            return self.node("neg" if str(t) == "-" else "not_", [self.unary()], t)
        return self.postfix(head)

    def postfix(self, head: Any = None) -> Any:
        first = head or self.peek()
        value = head if head is not None else self.atom()
        while True:
            if self.at("."):
                op = self.take()
                name = self.name()
                if self.at("("):
                    value = self.node("method", [value, name, self.args()], first)
                else:
                    value = self.node("prop", [value, name], first)
                    value.meta.op = op  # an assignment's target reads it: lv_prop's line is its `.`
            elif self.at("["):
                op = self.take()
                index = self.expr()
                self.take("]")
                value = self.node("index", [value, index], first)
                value.meta.op = op
            else:
                return value

    def args(self) -> Any:
        self.take("(")
        if self.at(")"):
            self.take()
            return None
        first = self.peek()
        items = [self.expr()]
        while self.at(","):
            self.take()
            items.append(self.expr())
        self.take(")")
        return self.node("args", items, first)

    def atom(self) -> Any:
        t = self.peek()
        if t.type in ("INT", "FLOAT", "STRING"):
            self.take()
            return self.node({"INT": "int_", "FLOAT": "float_", "STRING": "string"}[t.type], [t], t)
        if t.type == "NAME":
            self.take()
            if self.at("("):
                return self.node("call", [t, self.args()], t)
            return self.node("var", [t], t)
        text = str(t) if t.type == "op" else None
        if text in ("true", "false"):
            self.take()
            return self.node(text, [], t)
        if text == "if":
            return self.if_expr()
        if text == "(":
            self.take()
            if self.at(")"):
                self.take()
                return self.node("unit", [], t)
            inner = self.expr()
            self.take(")")
            return inner
        if text == "[":
            self.take()
            items = self.items("]", self.expr)
            return self.node("array", items, t)
        if text == "#{":
            self.take()
            items = self.items("}", self.pair)
            return self.node("map", items, t)
        self.fail(t)
        raise AssertionError  # fail raised

    def items(self, close: str, item: Any) -> list[Any]:
        """``[item ("," item)* ","?] close``: [None] when empty (lark's placeholder)."""
        out: list[Any] = []
        while not self.at(close):
            out.append(item())
            if not self.at(","):
                break
            self.take()
        self.take(close)
        return out or [None]

    def pair(self) -> Tree:
        key = self.peek()
        if key.type not in ("NAME", "STRING"):
            self.fail(key)
        self.take()
        self.take(":")
        return self.node("pair", [key, self.expr()], key)
