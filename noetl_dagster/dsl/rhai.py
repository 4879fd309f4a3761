"""A subset of Rhai (NoETL's scripting kind): parse (recursive descent, linear in the code, into lark
trees) with line numbers, interpret with a bounded operation count. No Python binding of Rhai exists on PyPI; this covers what playbooks use:
``let``/``const``, arithmetic and comparison, strings, arrays, object maps ``#{...}``, ``if``/``else``
(also as an expression), ``while``, ``loop``, ``for x in`` arrays, ranges (``a..b``, ``a..=b``) and
strings, ``break``/``continue``/``return``, compound assignment, and the common string/array/map
methods. Anything else (``fn``, closures, ``switch``, ``import``, ``try``…) is a :class:`RhaiError`
naming the construct and its line. The script's value is its last expression.

A hostile script is bounded before it allocates (docs/limits.md): the code by its size and its
nesting depth before the parse, whose steps count as operations; integers are i64 (overflow is an error, as in Rhai, not a
Python big integer); every value a script builds is charged to a memory budget (``max_memory``
bytes in total) before it exists; walking a value (``==``, ``contains``, ``sort``, ``to_json``,
string ``+``, the result) counts as operations, so a self-containing array or a shared structure
2**60 values deep stops at ``max_operations``.
"""

from __future__ import annotations

import gc
import json
from typing import Any

from lark import Token, Tree

from noetl_dagster.dsl.rhai_syntax import (  # noqa: F401 - GRAMMAR, _Parser: the tests compare the parse with lark's
    GRAMMAR,
    MAX_DEPTH,
    OUTSIDE,
    RhaiError,
    _check_depth,
    _line,
    _outside_symbol,
    _Parser,
)

DEFAULT_MAX_OPERATIONS = 100_000
MAX_CODE_SIZE = (
    16 * 1024
)  # characters (the parse is linear: ~20 ms for 16 KiB; its steps count as operations)
DEFAULT_MAX_MEMORY = 256 * 1024 * 1024  # bytes a script may allocate in all (strings, array and map slots)
I64 = (-(2**63), 2**63 - 1)
_SLOT, _ENTRY = 8, 32  # bytes charged for an array slot, a map entry
_WALK = 8  # values walked per operation


_TREES: dict[
    str, tuple[Tree, int]
] = {}  # code -> (its tree, the parse's steps): a step in a cycle runs the same code
_TREES_MAX_CHARS = 1024 * 1024  # code kept in the cache in all (a tree grows with its code)


def parse(code: str, max_operations: int = DEFAULT_MAX_OPERATIONS) -> Tree:
    """The syntax tree, or RhaiError naming the first construct outside the subset and its line;
    ``rhai_limit`` when the parse alone takes more than ``max_operations`` steps."""
    tree, steps = _parsed(code)
    if steps > max_operations:
        raise _too_many(max_operations, None)
    return tree


def _parsed(code: str) -> tuple[Tree, int]:
    """(tree, parse steps), cached by the code's text (the interpreter only reads the trees)."""
    hit = _TREES.get(code)
    if hit is None:
        hit = _parse(code)
        if len(_TREES) >= 1024 or sum(map(len, _TREES)) + len(code) > _TREES_MAX_CHARS:
            _TREES.clear()
        _TREES[code] = hit
    return hit


def _too_many(max_operations: int, line: int | None) -> RhaiError:
    return RhaiError(f"too many operations (max_operations {max_operations})", line, "rhai_limit")


def _parse(code: str) -> tuple[Tree, int]:
    if len(code) > MAX_CODE_SIZE:
        raise RhaiError(f"the script is {len(code)} characters, over the limit of {MAX_CODE_SIZE}", None,
                        "rhai_limit")  # fmt: skip
    _check_depth(code)
    for n, text in enumerate(code.splitlines(), 1):
        bare = text.split("//", 1)[0]
        words = set(bare.replace("(", " ").replace("{", " ").replace(";", " ").split())
        for key, what in OUTSIDE.items():
            if key in words or (not key.isalpha() and key in bare and _outside_symbol(key, bare)):
                raise RhaiError(f"{what} are outside the supported Rhai subset", n, "rhai_unsupported")
    collecting = gc.isenabled()
    gc.disable()  # the tree is all new objects: collections during its build made the parse superlinear
    try:
        parser = _Parser(code)
        return parser.parse(), parser.steps
    except RecursionError:  # e.g. thousands of `-` or `**` in a row, each a level of the tree
        raise RhaiError("the script nests too deeply to parse", None, "rhai_limit") from None
    finally:
        if collecting:
            gc.enable()


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class _Return(Exception):
    def __init__(self, value: Any):
        self.value = value


def _type(v: Any) -> str:
    return {bool: "bool", int: "i64", float: "f64", str: "string", list: "array", dict: "map"}.get(
        type(v), "()"
    )


class Budget:
    """The bounds of one script run: operations counted, bytes charged before they are allocated."""

    def __init__(self, max_operations: int, max_memory: int):
        self.ops = 0
        self.max_operations = max_operations
        self.memory = 0  # bytes allocated so far (never given back: counted work, not a live measure)
        self.max_memory = max_memory

    def _tick(self, node: Any, n: int = 1) -> None:
        self.ops += n
        if self.ops > self.max_operations:
            raise _too_many(self.max_operations, _line(node))

    def _alloc(self, nbytes: int, node: Any) -> None:
        """Charge ``nbytes`` about to be allocated; RhaiError (rhai_limit) past ``max_memory``."""
        self.memory += nbytes
        if self.memory > self.max_memory:
            raise RhaiError(f"the script allocates more than max_memory ({self.max_memory} bytes)", _line(node),
                            "rhai_limit")  # fmt: skip

    def _weigh(self, value: Any, node: Any) -> int:
        """The bytes a deep copy of ``value`` takes (strings by their characters, a slot per element),
        walked without recursion at one operation per _WALK values: a cycle or a shared structure far
        bigger than its allocations stops at max_operations."""
        total, seen, stack = 0, 0, [value]
        while stack:
            v = stack.pop()
            seen += 1
            if seen % _WALK == 0:
                self._tick(node)
            if isinstance(v, str):
                total += _str_bytes(v)
            elif isinstance(v, list):
                total += _SLOT * len(v)
                stack.extend(v)
            elif isinstance(v, dict):
                total += _ENTRY * len(v)
                stack.extend(v.keys())
                stack.extend(v.values())
            elif isinstance(v, range):
                total += _SLOT * len(v)
                self._tick(node, len(v) // _WALK)
            else:
                total += _SLOT
        return total

    def _int(self, v: Any, node: Any) -> Any:
        """``v``, when an integer, inside i64 (Rhai's INT): overflow is an error, never a big integer."""
        if isinstance(v, int) and not isinstance(v, bool) and not I64[0] <= v <= I64[1]:
            raise RhaiError("arithmetic overflow (integers are i64)", _line(node))
        return v

    def _show(self, v: Any, node: Any) -> str:
        """A value as text (``+`` with a string, ``to_string``, ``print``): weighed and charged first."""
        if isinstance(v, (list, dict, range)):
            self._alloc(self._weigh(v, node), node)
        return _show(v)

    def _charge_method(self, obj: Any, name: str, args: list[Any], n: Any) -> None:
        """What a method is about to allocate (or walk), charged before it runs."""
        if isinstance(obj, str):
            size = _str_bytes(obj)
            if name in ("to_upper", "to_lower"):
                self._alloc(3 * size, n)  # a case mapping can grow a character into three
            elif name in ("trim", "sub_string"):
                self._alloc(size, n)
            elif name == "replace" and len(args) == 2 and all(isinstance(x, str) for x in args):
                hits = obj.count(args[0]) if args[0] else len(obj) + 1
                self._alloc(size + hits * _str_bytes(args[1]), n)
            elif name == "split":
                sep = args[0] if args and isinstance(args[0], str) and args[0] else " "
                self._alloc(size + _SLOT * (obj.count(sep) + 1), n)
            elif name == "chars":
                self._alloc(size + _SLOT * len(obj), n)
        elif isinstance(obj, list):
            if name in ("push", "insert"):
                self._alloc(_SLOT, n)
            elif name == "append" and args and isinstance(args[0], (list, range, str)):
                self._alloc(_SLOT * len(args[0]), n)
            elif name == "extract":
                self._alloc(_SLOT * len(obj), n)
            elif name in ("contains", "index_of", "sort", "sum", "max", "min"):
                self._weigh(obj, n)  # comparisons walk the elements
                for a in args:
                    self._weigh(a, n)
        elif isinstance(obj, dict):
            if name in ("keys", "values"):
                self._alloc(_SLOT * len(obj), n)
            elif name == "mixin" and args and isinstance(args[0], dict):
                self._alloc(_ENTRY * len(args[0]), n)


class Interpreter(Budget):
    def __init__(self, variables: dict[str, Any] | None = None, max_operations: int = DEFAULT_MAX_OPERATIONS,
                 log: Any = None, max_memory: int = DEFAULT_MAX_MEMORY):  # fmt: skip
        super().__init__(max_operations, max_memory)
        self.scopes: list[dict[str, Any]] = [dict(variables or {})]
        self.log = log or (lambda _m: None)

    # -- running ---------------------------------------------------------------------------------
    def run(self, tree: Tree, parse_steps: int = 0) -> Any:
        """The script's value; ``parse_steps``, the parse's work, is charged first (one budget)."""
        self._tick(None, parse_steps)
        try:
            value = self._stmts(tree.children[0])
        except _Return as r:
            value = r.value
        except (_Break, _Continue):
            raise RhaiError("`break`/`continue` outside a loop", None) from None
        except RecursionError:  # e.g. a chain of thousands of `+`, each a level of the tree
            raise RhaiError("the script nests too deeply", None, "rhai_limit") from None
        self._alloc(self._weigh(value, None), None)  # the result is copied out (ranges become lists)
        return value

    def _stmts(self, node: Tree) -> Any:
        value = None
        for child in node.children:
            if child is None:
                continue
            value = self._stmt(child)
        return value

    def _block(self, node: Tree) -> Any:
        self.scopes.append({})
        try:
            return self._stmts(node.children[0])
        finally:
            self.scopes.pop()

    def _stmt(self, n: Any) -> Any:
        self._tick(n)
        if not isinstance(n, Tree):
            return self._expr(n)
        d = n.data
        if d == "let":
            self.scopes[-1][str(n.children[0])] = (
                self._expr(n.children[1]) if len(n.children) > 1 and n.children[1] is not None else None
            )  # `let x;` has no value child
            return None
        if d == "assign":
            self._assign(n)
            return None
        if d == "expr_stmt":
            return self._expr(n.children[0])
        if d == "empty":
            return None
        if d in ("while_", "loop", "for_"):
            return self._loop(n)
        if d == "break_":
            raise _Break
        if d == "continue_":
            raise _Continue
        if d == "return_":
            raise _Return(self._expr(n.children[0]) if n.children and n.children[0] is not None else None)
        return self._expr(n)

    def _loop(self, n: Tree) -> None:
        if n.data == "for_":
            name, seq = str(n.children[0]), self._expr(n.children[1])
            if isinstance(seq, dict):
                raise RhaiError("`for` over a map: iterate `m.keys()` or `m.values()`", _line(n))
            if not isinstance(seq, (list, str, range)):
                raise RhaiError(f"`for` needs an array, a range or a string, not {_type(seq)}", _line(n))
            items, body = seq, n.children[2]
        else:
            items, body = None, n.children[-1]
        scope: dict[str, Any] = {}
        self.scopes.append(scope)
        try:
            it = iter(items) if items is not None else None
            while True:
                self._tick(n)
                if it is not None:
                    try:
                        scope[name] = next(it)
                    except StopIteration:
                        break
                elif n.data == "while_" and not self._truth(self._expr(n.children[0]), n):
                    break
                try:
                    self._block(body)
                except _Break:
                    break
                except _Continue:
                    continue
        finally:
            self.scopes.pop()

    def _lookup(self, name: str, node: Any) -> dict[str, Any]:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope
        raise RhaiError(f"variable not found: {name}", _line(node))

    def _assign(self, n: Tree) -> None:
        lv, op, rhs = n.children
        name = str(lv.children[0])
        scope = self._lookup(name, n)
        value = self._expr(rhs)
        path = lv.children[1:]
        holder: Any = scope
        key: Any = name
        for part in path:
            holder = holder[key] if holder is not scope else scope[name]
            key = str(part.children[0]) if part.data == "lv_prop" else self._expr(part.children[0])
            if isinstance(holder, list):
                key = self._index_of(holder, key, n)
            elif not isinstance(holder, dict):
                raise RhaiError(f"cannot assign into a {_type(holder)}", _line(n))
        if str(op) != "=":
            value = self._binop(str(op)[0], holder[key], value, n)
        holder[key] = value

    def _index_of(self, seq: list | str, i: Any, node: Any) -> int:
        if not isinstance(i, int) or isinstance(i, bool):
            raise RhaiError(f"an array index must be an integer, not {_type(i)}", _line(node))
        j = i + len(seq) if i < 0 else i
        if not 0 <= j < len(seq):
            raise RhaiError(f"index {i} out of bounds (length {len(seq)})", _line(node))
        return j

    def _truth(self, v: Any, node: Any) -> bool:
        if not isinstance(v, bool):
            raise RhaiError(f"a condition must be a bool, not {_type(v)}", _line(node))
        return v

    # -- expressions -----------------------------------------------------------------------------
    def _expr(self, n: Any) -> Any:
        self._tick(n)
        if isinstance(n, Token):
            raise RhaiError(f"unexpected {n!s}", n.line)
        d = n.data
        c = n.children
        if d == "int_":
            text = str(c[0]).replace("_", "")
            if len(text) > 19:  # past i64 whatever the digits; int() of a long literal is itself work
                raise RhaiError("integer literal out of range (integers are i64)", _line(n))
            return self._int(int(text), n)
        if d == "float_":
            return float(str(c[0]).replace("_", ""))
        if d == "string":
            text = str(c[0])
            self._alloc(len(text), n)
            return json.loads(text)
        if d == "true":
            return True
        if d == "false":
            return False
        if d == "unit":
            return None
        if d == "array":
            self._alloc(_SLOT * len(c), n)
            return [self._expr(x) for x in c if x is not None]
        if d == "map":
            self._alloc(_ENTRY * len(c), n)
            out = {}
            for p in c:
                if p is not None:
                    k = p.children[0]
                    out[json.loads(str(k)) if k.type == "STRING" else str(k)] = self._expr(p.children[1])
            return out
        if d == "var":
            name = str(c[0])
            return self._lookup(name, n)[name]
        if d == "if_expr":
            if self._truth(self._expr(c[0]), n):
                return self._block(c[1])
            if len(c) > 2 and c[2] is not None:
                return self._block(c[2]) if c[2].data == "block" else self._expr(c[2])
            return None
        if d == "block":
            return self._block(n)
        if d == "neg":
            v = self._expr(c[0])
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise RhaiError(f"cannot negate a {_type(v)}", _line(n))
            return self._int(-v, n)
        if d == "not_":
            return not self._truth(self._expr(c[0]), n)
        if d == "and_op":
            return self._truth(self._expr(c[0]), n) and self._truth(self._expr(c[1]), n)
        if d == "or_op":
            return self._truth(self._expr(c[0]), n) or self._truth(self._expr(c[1]), n)
        if d == "binop":
            return self._binop(str(c[1]), self._expr(c[0]), self._expr(c[2]), n)
        if d == "pow":
            return self._binop("**", self._expr(c[0]), self._expr(c[1]), n)
        if d == "range":
            a, b = self._expr(c[0]), self._expr(c[2])
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in (a, b)):
                raise RhaiError("a range needs integers", _line(n))
            return range(a, b + 1 if str(c[1]) == "..=" else b)
        if d == "prop":
            obj, name = self._expr(c[0]), str(c[1])
            if isinstance(obj, dict):
                return obj.get(name)
            if name == "len" or name == "length":
                return len(obj) if isinstance(obj, (list, str)) else None
            raise RhaiError(f"property {name!r} of a {_type(obj)}", _line(n))
        if d == "index":
            obj, i = self._expr(c[0]), self._expr(c[1])
            if isinstance(obj, dict):
                if not isinstance(i, str):
                    raise RhaiError("a map index must be a string", _line(n))
                return obj.get(i)
            if isinstance(obj, (list, str)):
                return obj[self._index_of(obj, i, n)]
            raise RhaiError(f"cannot index a {_type(obj)}", _line(n))
        if d == "method":
            obj = self._expr(c[0])
            args = [self._expr(a) for a in c[2].children] if c[2] is not None else []
            return self._method(obj, str(c[1]), args, n, c[0])
        if d == "call":
            args = [self._expr(a) for a in c[1].children] if c[1] is not None else []
            return self._call(str(c[0]), args, n)
        raise RhaiError(f"`{d}` is outside the supported Rhai subset", _line(n), "rhai_unsupported")

    def _binop(self, op: str, a: Any, b: Any, n: Any) -> Any:
        num = (int, float)
        if op == "+" and (isinstance(a, str) or isinstance(b, str)):
            sa, sb = self._show(a, n), self._show(b, n)
            self._alloc(_str_bytes(sa) + _str_bytes(sb), n)
            return sa + sb
        if op == "+" and isinstance(a, list) and isinstance(b, list):
            self._alloc(_SLOT * (len(a) + len(b)), n)
            return a + b
        if op == "+" and isinstance(a, dict) and isinstance(b, dict):
            self._alloc(_ENTRY * (len(a) + len(b)), n)
            return {**a, **b}
        if op in ("==", "!="):
            self._weigh(a, n)  # a comparison walks both values: counted, as every walk
            self._weigh(b, n)
            same = a == b and type(a) is type(b) or (isinstance(a, num) and isinstance(b, num) and a == b)
            return same if op == "==" else not same
        if op in ("<", ">", "<=", ">="):
            if not (isinstance(a, num) and isinstance(b, num) or isinstance(a, str) and isinstance(b, str)):
                raise RhaiError(f"cannot compare {_type(a)} {op} {_type(b)}", _line(n))
            return {"<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op]
        if not (isinstance(a, num) and isinstance(b, num)) or isinstance(a, bool) or isinstance(b, bool):
            raise RhaiError(f"cannot apply {op} to {_type(a)} and {_type(b)}", _line(n))
        ints = isinstance(a, int) and isinstance(b, int)
        if op in ("/", "%") and b == 0:
            raise RhaiError("division by zero", _line(n))
        try:
            if op == "+":
                out = a + b
            elif op == "-":
                out = a - b
            elif op == "*":
                out = a * b
            elif op in ("/", "%") and ints:  # i64: the quotient truncates toward zero, exactly
                q = abs(a) // abs(b)
                q = q if (a < 0) == (b < 0) else -q
                out = q if op == "/" else a - b * q
            elif op == "/":
                out = a / b
            elif op == "%":
                out = a % b
            elif op == "**":
                if ints and b >= 0:
                    if abs(a) > 1 and b > 63:  # past i64 before Python computes a huge power
                        raise RhaiError("arithmetic overflow (integers are i64)", _line(n))
                    out = a**b
                else:
                    out = float(a) ** b
            else:
                raise RhaiError(f"operator {op}", _line(n))
        except OverflowError:
            raise RhaiError("arithmetic overflow", _line(n)) from None
        return self._int(out, n) if ints else out

    def _method(self, obj: Any, name: str, args: list[Any], n: Any, target: Any) -> Any:
        if name in ("to_string", "to_debug"):
            return self._show(obj, n)
        if name in ("len", "length"):
            if isinstance(obj, (list, str, dict)):
                return len(obj)
        if name == "is_empty" and isinstance(obj, (list, str, dict)):
            return len(obj) == 0
        self._charge_method(obj, name, args, n)
        if isinstance(obj, str):
            s = obj
            table = {
                "to_upper": lambda: s.upper(), "to_lower": lambda: s.lower(), "trim": lambda: s.strip(),
                "contains": lambda x: x in s, "starts_with": lambda x: s.startswith(x), "ends_with": lambda x: s.endswith(x),
                "split": lambda x=" ": s.split(x), "replace": lambda a, b: s.replace(a, b), "index_of": lambda x: s.find(x),
                "sub_string": lambda i, k=None: s[i:] if k is None else s[i:i + k], "chars": lambda: list(s),
                "parse_int": lambda: int(s), "parse_float": lambda: float(s),
            }  # fmt: skip
        elif isinstance(obj, list):
            a = obj
            table = {
                "push": lambda x: a.append(x), "pop": lambda: a.pop() if a else None, "shift": lambda: a.pop(0) if a else None,
                "insert": lambda i, x: a.insert(i, x), "contains": lambda x: x in a, "index_of": lambda x: a.index(x) if x in a else -1,
                "reverse": lambda: a.reverse(), "sort": lambda: a.sort(), "clear": lambda: a.clear(),
                "remove": lambda i: a.pop(self._index_of(a, i, n)), "extract": lambda i, k=None: a[i:] if k is None else a[i:i + k],
                "append": lambda b: a.extend(b), "sum": lambda: sum(a), "max": lambda: max(a), "min": lambda: min(a),
            }  # fmt: skip
        elif isinstance(obj, dict):
            m = obj
            table = {
                "keys": lambda: list(m), "values": lambda: list(m.values()), "contains": lambda k: k in m,
                "remove": lambda k: m.pop(k, None), "get": lambda k: m.get(k), "clear": lambda: m.clear(),
                "mixin": lambda b: m.update(b),
            }  # fmt: skip
        else:
            table = {}
        fn = table.get(name)
        if fn is None:
            raise RhaiError(
                f"method {name}() of a {_type(obj)} is outside the supported Rhai subset",
                _line(n),
                "rhai_unsupported",
            )
        try:
            return self._int(fn(*args), n)
        except (TypeError, ValueError, OverflowError) as e:
            raise RhaiError(f"{name}(): {e}", _line(n)) from None

    def _call(self, name: str, args: list[Any], n: Any) -> Any:
        if name in ("print", "log", "debug", "info", "warn", "error"):
            self.log(" ".join(self._show(a, n) for a in args))
            return None
        if name in ("to_json", "to_string"):
            for a in args:
                self._alloc(self._weigh(a, n), n)
        elif name == "parse_json" and args and isinstance(args[0], str):
            self._alloc(_SLOT * len(args[0]), n)  # at most a value per character
        simple = {
            "to_json": lambda v: json.dumps(v, separators=(",", ":"), default=_listed), "parse_json": _parse_json,
            "parse_int": lambda s: int(s), "parse_float": lambda s: float(s), "type_of": _type,
            "to_string": _show, "range": lambda a, b: range(a, b),
        }  # fmt: skip
        fn = simple.get(name)
        if fn is None:
            raise RhaiError(
                f"function {name}() is outside the supported Rhai subset", _line(n), "rhai_unsupported"
            )
        try:
            return self._int(fn(*args), n)
        except (TypeError, ValueError, OverflowError) as e:
            raise RhaiError(f"{name}(): {e}", _line(n)) from None


def _str_bytes(s: str) -> int:
    return len(s) if s.isascii() else 4 * len(s)


def _parse_json(s: str) -> Any:
    try:
        return json.loads(s)
    except ValueError:
        return None


def _show(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, dict)):
        return json.dumps(v, default=_listed)
    return str(v)


def _listed(v: Any) -> Any:
    if isinstance(v, range):
        return list(v)
    raise TypeError(f"{type(v).__name__} is not JSON")


def plain(value: Any) -> Any:
    """A script value as JSON-able data (ranges become lists)."""
    if isinstance(value, range):
        return list(value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def run(code: str, variables: dict[str, Any] | None = None, *, max_operations: int = DEFAULT_MAX_OPERATIONS,
        log: Any = None, max_memory: int = DEFAULT_MAX_MEMORY) -> Any:  # fmt: skip
    """Parse and run ``code``; its last expression's value. The parse's steps count against
    ``max_operations`` as the run's operations do."""
    tree, steps = _parsed(code)
    return plain(Interpreter(variables, max_operations, log, max_memory).run(tree, steps))
