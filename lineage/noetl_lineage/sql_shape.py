"""The shape of an ``INSERT … SELECT`` / ``CREATE TABLE … AS SELECT`` statement that
openlineage-sql's parse result does not give: the ``INSERT`` column list, the order of the
select list, and what each select item does to its inputs (issue 18.5 column lineage).

openlineage-sql names each output column after the select item (its alias, the column's own
name, or ``_0``, ``_1``… for unnamed expressions, counted across the statement) and lists
them by name, not position; it ignores ``INSERT INTO t (a, b)``. With the select list in order,
item *i* of every ``UNION`` branch writes the *i*-th column of the list, and its lineage is
the parse result's entry of that item's name.

Per item, the OpenLineage column-lineage subtype (DIRECT transformations of the facet spec):

- ``IDENTITY``: the item is a bare column reference (``x``, ``s.x``, ``x AS y``) and the
  query has no ``WITH`` / derived table in between (through one, the value may have been
  computed there: ``TRANSFORMATION``, the conservative answer);
- ``AGGREGATION``: an aggregate function call without ``OVER`` (``sum(x)``, ``round(avg(x), 2)``);
- ``TRANSFORMATION``: any other expression; ``masking`` when it hashes (``md5(x)``, ``sha256``…).

Per branch also the columns it reads without writing them (the facet's dataset-level
``INDIRECT`` lineage): ``JOIN … ON`` (``JOIN``), ``WHERE`` / ``HAVING`` / ``QUALIFY``
(``FILTER``), ``GROUP BY`` (``GROUP_BY``), ``ORDER BY`` (``SORT``) — only when unambiguous: a
column qualified by a table or alias of the branch, or any column when the branch reads one
table; nothing through a subquery, ``USING`` or a derived table.

A tokenizer, not a parser: comments, strings (``''``, ``E''``, dollar quotes), quoted
identifiers and parentheses are respected; anything it does not recognise (``SELECT *``,
``VALUES``, a column count that does not match the list) gives ``None`` and the caller keeps
openlineage-sql's names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<comment>--[^\n]*|/\*.*?\*/)
  | (?P<string>[EeNnBbXx]?'(?:[^']|'')*')
  | (?P<dollar>\$(?P<tag>[A-Za-z_]\w*)?\$.*?\$(?P=tag)?\$)
  | (?P<qident>"(?:[^"]|"")*"|`[^`]*`|\[[^\]]*\])
  | (?P<number>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+)
  | (?P<ident>[A-Za-z_][\w$]*)
  | (?P<op>::|<>|<=|>=|!=|\|\||[-+*/%(),.;=<>:~!@#^&|?\[\]{}])
    """,
    re.VERBOSE | re.DOTALL,
)

AGGREGATES = frozenset(
    "sum avg count min max stddev stddev_pop stddev_samp variance var_pop var_samp array_agg string_agg "
    "listagg group_concat bool_and bool_or every bit_and bit_or median mode percentile_cont "
    "percentile_disc approx_count_distinct count_if countif any_value arg_max arg_min first last list "
    "json_agg jsonb_agg json_object_agg jsonb_object_agg corr covar_pop covar_samp".split()
)
MASKING = frozenset(
    "md5 sha1 sha224 sha256 sha384 sha512 sha2 hash digest crc32 xxhash64 murmur_hash".split()
)
_NOT_ALIAS = frozenset(
    "end null true false from where group order limit union intersect except having window as and or not "
    "is in like between case when then else distinct all on returning".split()
)
_SET_OPS = frozenset({"union", "intersect", "except"})
_CLAUSE_END = frozenset(
    {
        "from",
        "where",
        "group",
        "having",
        "window",
        "order",
        "limit",
        "offset",
        "fetch",
        "union",
        "intersect",
        "except",
        "returning",
        "on",
        "into",
    }
)


class _Tok(NamedTuple):
    kind: str  # ident | qident | string | number | op
    text: str
    depth: int  # parenthesis depth of this token (a parenthesis: the depth outside it)
    word: str  # lower-cased keyword/identifier, "" for other kinds


def _rebased(toks: list[_Tok], by: int) -> list[_Tok]:
    return toks if not by else [t._replace(depth=t.depth - by) for t in toks]


@dataclass(frozen=True)
class Item:
    """One select-list item: the name openlineage-sql gives it and what it does to its inputs."""

    name: str
    subtype: str  # IDENTITY | TRANSFORMATION | AGGREGATION
    masking: bool = False


@dataclass(frozen=True)
class Shape:
    """``columns``: the INSERT column list (None: no list, the select names are the columns);
    ``branches``: the select list of each ``UNION`` branch, in order."""

    columns: tuple[str, ...] | None
    branches: tuple[tuple[Item, ...], ...]
    # (table as written, column, INDIRECT subtype) read by WHERE / JOIN … ON / GROUP BY / HAVING / ORDER BY
    indirect: tuple[tuple[str, str, str], ...] = ()

    def targets(self) -> tuple[str, ...]:
        return self.columns if self.columns is not None else tuple(i.name for i in self.branches[0])


def _tokens(sql: str) -> list[_Tok] | None:
    out: list[_Tok] = []
    depth, pos = 0, 0
    make = _Tok._make
    for m in _TOKEN.finditer(sql):
        if m.start() != pos:
            return None  # a character we do not know: no shape
        pos = m.end()
        kind = m.lastgroup
        if kind == "ws" or kind == "comment":
            continue
        text = m.group()
        if kind == "op":
            if text == ")":
                depth -= 1
                if depth < 0:
                    return None
            elif text == "(":
                out.append(make((kind, text, depth, "")))
                depth += 1
                continue
        elif kind == "dollar" or kind == "tag":
            kind = "string"
        out.append(make((kind, text, depth, text.lower() if kind == "ident" else "")))
    return out if pos == len(sql) else None


def split_statements(sql: str) -> list[str]:
    """``sql`` cut at the top-level semicolons (strings, comments and quotes respected)."""
    if ";" not in sql:
        return [sql.strip()] if sql.strip() else []
    parts, start, pos, depth = [], 0, 0, 0
    while pos < len(sql):
        m = _TOKEN.match(sql, pos)
        if m is None:  # unknown character: leave the rest whole
            break
        t = m.group()
        if m.lastgroup == "op":
            depth += t == "("
            depth -= t == ")"
            if t == ";" and depth == 0:
                parts.append(sql[start : m.start()])
                start = m.end()
        pos = m.end()
    parts.append(sql[start:])
    return [p.strip() for p in parts if p.strip()]


def _ident(t: _Tok) -> str:
    if t.kind == "qident":
        body = t.text[1:-1]
        return body.replace('""', '"') if t.text[0] == '"' else body
    return t.text


_WRITES = re.compile(r"\s*(?:(?:--[^\n]*\n|/\*.*?\*/)\s*)*(?:insert|create)\b", re.IGNORECASE | re.DOTALL)


def shape(sql: str) -> Shape | None:
    """The shape of one ``INSERT … SELECT`` or ``CREATE TABLE … AS SELECT`` statement, or None."""
    if not _WRITES.match(sql):
        return None
    toks = _tokens(sql)
    if not toks:
        return None
    words = [t.word for t in toks]
    columns: tuple[str, ...] | None = None
    if words[0] == "insert":
        try:
            i = words.index("into") + 1
        except ValueError:
            return None
        while (
            i < len(toks)
            and (toks[i].kind in ("ident", "qident") or toks[i].text == ".")
            and words[i] not in ("select", "with", "values", "default", "overwrite", "by")
        ):
            i += 1
        if i < len(toks) and words[i] == "as" and i + 1 < len(toks):  # INSERT INTO t AS alias (…)
            i += 2
        if (
            i < len(toks)
            and toks[i].text == "("
            and i + 1 < len(toks)
            and words[i + 1] not in ("select", "with")
        ):
            end = next(
                (j for j in range(i + 1, len(toks)) if toks[j].text == ")" and toks[j].depth == 0), None
            )
            if end is None:
                return None
            names = [t for t in toks[i + 1 : end] if t.text != ","]
            if not names or any(t.kind not in ("ident", "qident") for t in names):
                return None
            columns = tuple(_ident(t) for t in names)
            i = end + 1
        query = toks[i:]
    elif words[0] == "create":
        at = next((j for j, t in enumerate(toks) if t.word == "as" and t.depth == 0), None)
        if at is None:
            return None
        query = toks[at + 1 :]
    else:
        return None
    query = _rebased(query, query[0].depth if query else 0)
    indirect: list[tuple[str, str, str]] = []
    branches = _branches(query, indirect)
    if not branches:
        return None
    width = len(branches[0])
    if any(len(b) != width for b in branches) or (columns is not None and len(columns) != width):
        return None
    return Shape(columns, branches, tuple(dict.fromkeys(indirect)))


def _branches(query: list[_Tok], indirect: list[tuple[str, str, str]]) -> tuple[tuple[Item, ...], ...] | None:
    """The select lists of the top-level SELECT and its UNION / INTERSECT / EXCEPT branches."""
    while query and query[0].text == "(" and query[-1].text == ")" and query[-1].depth == 0:  # (SELECT …)
        inner = query[1:-1]
        if any(t.depth < 1 for t in inner):
            break  # (a) UNION (b): not one parenthesized query
        query = _rebased(inner, 1)
    if not query:
        return None
    words = [t.word if t.depth == 0 else "" for t in query]
    through_cte = words[0] == "with"
    starts = [j for j, w in enumerate(words) if w == "select"]
    if not starts or (not through_cte and starts[0] != 0):
        return None
    for j, w in enumerate(words):  # (a) UNION (b): a parenthesized branch we do not read
        if w in _SET_OPS:
            k = j + 2 if j + 1 < len(words) and words[j + 1] in ("all", "distinct") else j + 1
            if k < len(query) and query[k].text == "(":
                return None
    unnamed = [0]  # openlineage-sql counts unnamed items across the whole statement
    out = []
    for n, s in enumerate(starts):
        if n and not (
            words[s - 1] in _SET_OPS or (words[s - 1] in ("all", "distinct") and words[s - 2] in _SET_OPS)
        ):
            return None  # a SELECT somewhere we do not expect
        end = next((j for j in range(s + 1, len(query)) if words[j] in _CLAUSE_END), len(query))
        stop = next((j for j in range(end, len(query)) if words[j] in _SET_OPS), len(query))
        derived = any(
            query[k].text == "(" and query[k + 1].word in ("select", "with") for k in range(end, stop - 1)
        )
        items = _items(query[s + 1 : end], unnamed, through_cte or derived)
        if items is None:
            return None
        out.append(items)
        if not (through_cte or derived):
            indirect += _indirect(query[end:stop], items)
    return tuple(out)


def _items(toks: list[_Tok], unnamed: list[int], indirect: bool) -> tuple[Item, ...] | None:
    if toks and toks[0].word in ("distinct", "all"):
        toks = toks[1:]
        if toks and toks[0].word == "on" and len(toks) > 1 and toks[1].text == "(":  # DISTINCT ON (…)
            close = next((j for j in range(2, len(toks)) if toks[j].text == ")" and toks[j].depth == 0), None)
            if close is None:
                return None
            toks = toks[close + 1 :]
    if not toks:
        return None
    parts: list[list[_Tok]] = [[]]
    for t in toks:
        if t.text == "," and t.depth == 0:
            parts.append([])
        else:
            parts[-1].append(t)
    items = []
    for p in parts:
        item = _item(p, unnamed, indirect)
        if item is None:
            return None
        items.append(item)
    return tuple(items)


def _item(toks: list[_Tok], unnamed: list[int], indirect: bool) -> Item | None:
    if not toks or (toks[-1].text == "*" and (len(toks) == 1 or toks[-2].text == ".")):
        return None  # empty, or `*` / `t.*`: positions unknown
    alias = None
    if len(toks) >= 2 and toks[-2].word == "as" and toks[-1].kind in ("ident", "qident"):
        alias, toks = _ident(toks[-1]), toks[:-2]
    elif (
        len(toks) >= 2
        and toks[-1].kind in ("ident", "qident")
        and toks[-1].word not in _NOT_ALIAS
        and toks[-1].depth == 0
        and (toks[-2].kind in ("ident", "qident", "number", "string") or toks[-2].text == ")")
        and toks[-2].text != "."
        and toks[-2].word not in ("as",)
    ):
        alias, toks = _ident(toks[-1]), toks[:-1]
    column = (
        len(toks) in (1, 3, 5)
        and all(t.kind in ("ident", "qident") for t in toks[0::2])
        and all(t.text == "." for t in toks[1::2])
        and toks[0].word not in ("null", "true", "false", "current_date", "current_timestamp", "current_time")
    )
    if column:
        return Item(alias or _ident(toks[-1]), "TRANSFORMATION" if indirect else "IDENTITY")
    calls = {t.word for i, t in enumerate(toks[:-1]) if t.kind == "ident" and toks[i + 1].text == "("}
    windowed = any(t.word == "over" for t in toks)
    subtype = "AGGREGATION" if calls & AGGREGATES and not windowed else "TRANSFORMATION"
    name = alias
    if name is None:
        name = f"_{unnamed[0]}"
        unnamed[0] += 1
    return Item(name, subtype, bool(calls & MASKING))


_REGION = {"where": "FILTER", "having": "FILTER", "qualify": "FILTER", "group": "GROUP_BY", "order": "SORT"}
_JOINS = frozenset({"join", "inner", "left", "right", "full", "cross", "natural", "outer", "lateral"})
_NOT_COLUMN = _NOT_ALIAS | frozenset(
    "ilike similar escape exists any some asc desc nulls first last interval date time timestamp with "
    "without zone by collate current_date current_time current_timestamp localtime localtimestamp cast "
    "array row filter partition rows range unbounded preceding following current default using".split()
)


ITEM = "@item"  # the table of an indirect ref by select-list position: the column is the item's name


def _indirect(toks: list[_Tok], items: tuple[Item, ...] = ()) -> list[tuple[str, str, str]]:
    """``(table as written, column, subtype)`` for the columns a branch's FROM … clauses read
    without writing them: JOIN conditions, WHERE / HAVING / QUALIFY filters, GROUP BY, ORDER BY.
    Only what is unambiguous: a column qualified by a table or alias of the branch, or any
    column when the branch reads one table; nothing through a subquery."""
    words = [t.word if t.depth == 0 else "" for t in toks]
    if not words or words[0] != "from":
        return []
    tables: dict[str, str] = {}  # alias or table name -> table as written
    regions: list[tuple[str, list[_Tok]]] = []
    i, n, region = 1, len(toks), None
    while i < n:
        t, w = toks[i], words[i]
        if t.depth == 0 and w in _REGION:
            region = (_REGION[w], [])
            regions.append(region)
            i += 2 if w in ("group", "order") else 1
            continue
        if t.depth == 0 and (
            w in ("limit", "offset", "fetch", "window", "returning")
            or (w == "on" and i + 1 < n and words[i + 1] == "conflict")
        ):
            break  # the end of what the branch reads
        if region is not None:
            region[1].append(t)
        elif t.depth == 0 and w == "on":
            region = None
            cond: list[_Tok] = []
            i += 1
            while i < n and not (
                toks[i].depth == 0 and (words[i] in _JOINS or words[i] in _REGION or toks[i].text == ",")
            ):
                cond.append(toks[i])
                i += 1
            regions.append(("JOIN", cond))
            continue
        elif t.text == "(":
            return []  # a derived table or a function in FROM
        elif t.kind in ("ident", "qident") and w not in _JOINS and w not in ("as", "using"):
            j = i
            parts = [_ident(toks[j])]
            while j + 2 < n and toks[j + 1].text == "." and toks[j + 2].kind in ("ident", "qident"):
                j += 2
                parts.append(_ident(toks[j]))
            name = ".".join(parts)
            j += 1
            if j < n and words[j] == "as":
                j += 1
            alias = (
                _ident(toks[j])
                if j < n
                and toks[j].kind in ("ident", "qident")
                and words[j] not in (_JOINS | _NOT_COLUMN | set(_REGION) | {"on", "limit"})
                else None
            )
            tables[(alias or parts[-1]).lower()] = name
            i = j + 1 if alias else j
            continue
        i += 1
    out = []
    for subtype, region_toks in regions:
        if any(
            t.text == "(" and k + 1 < len(region_toks) and region_toks[k + 1].word in ("select", "with")
            for k, t in enumerate(region_toks)
        ):
            continue  # a subquery: its columns are not this branch's
        if subtype in ("GROUP_BY", "SORT"):  # GROUP BY 1, 2 / ORDER BY 2: the select item at that position
            out += [
                (ITEM, items[int(t.text) - 1].name, subtype)
                for k, t in enumerate(region_toks)
                if t.kind == "number"
                and t.depth == 0
                and t.text.isdigit()
                and 0 < int(t.text) <= len(items)
                and (k == 0 or region_toks[k - 1].text == ",")
                and (
                    k + 1 == len(region_toks)
                    or region_toks[k + 1].text == ","
                    or region_toks[k + 1].word in ("asc", "desc", "nulls")
                )
            ]
        for qual, column in _column_refs(region_toks):
            table = (
                tables.get(qual.lower())
                if qual
                else (next(iter(tables.values())) if len(tables) == 1 else None)
            )
            if table:
                out.append((table, column, subtype))
    return out


def _column_refs(toks: list[_Tok]) -> list[tuple[str | None, str]]:
    refs = []
    i, n = 0, len(toks)
    while i < n:
        t = toks[i]
        if t.kind in ("ident", "qident") and not (i and toks[i - 1].text in (".", "::")):
            j = i
            parts = [_ident(t)]
            while j + 2 < n and toks[j + 1].text == "." and toks[j + 2].kind in ("ident", "qident"):
                j += 2
                parts.append(_ident(toks[j]))
            called = j + 1 < n and toks[j + 1].text == "("
            if not called and (len(parts) > 1 or (t.kind == "qident" or t.word not in _NOT_COLUMN)):
                refs.append((".".join(parts[:-1]) or None, parts[-1]))
            i = j + 1
            continue
        i += 1
    return refs
