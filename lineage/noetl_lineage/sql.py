"""Column lineage of a SQL statement (issue 18.5) with openlineage-sql, OpenLineage's own
SQL parser: for each written table, a ``columnLineage`` dataset facet naming, per output
column, the input columns it was computed from. A statement that does not parse, or writes
no table, gives nothing (lineage then has datasets without columns, never an error).

openlineage-sql names the output columns after the select items and ignores an ``INSERT``
column list; :mod:`noetl_lineage.sql_shape` reads the list and the select list's order, so
``INSERT INTO t (a, b) SELECT x, y FROM s`` maps ``s.x -> t.a`` and ``s.y -> t.b`` (each
``UNION`` branch too), and gives each item its subtype per the facet spec: ``DIRECT/IDENTITY``
for a column taken as is (renamed or not), ``DIRECT/AGGREGATION`` for an aggregate,
``DIRECT/TRANSFORMATION`` otherwise (``masking`` for hashes). A statement whose shape it does
not know keeps openlineage-sql's names (IDENTITY only when the name is unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from openlineage.client.generated import column_lineage_dataset as cl

from noetl_lineage.sql_shape import ITEM, shape, split_statements

PRODUCER = "https://github.com/noetl/noetl-dagster"
DIALECTS = {
    "postgres": "postgres",
    "duckdb": "duckdb",
    "snowflake": "snowflake",
    "mysql": "mysql",
    "mariadb": "mysql",
}


def _name(table: Any, default_schema: str | None, database: str | None = None) -> str:
    schema = table.schema or default_schema
    parts = [p for p in (table.database or database, schema, table.name) if p]
    return ".".join(parts)


@dataclass(frozen=True)
class SqlLineage:
    """What a statement reads and writes: table names (``[database.]schema.table``) and,
    per written table, its ``columnLineage`` facet (absent when no column maps)."""

    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    column_lineage: dict[str, cl.ColumnLineageDatasetFacet] = field(default_factory=dict)


def sql_lineage(
    sql: str | list[str],
    namespace: str,
    *,
    kind: str = "postgres",
    default_schema: str | None = None,
    database: str | None = None,
) -> SqlLineage:
    """The tables ``sql`` reads and writes, with the column lineage of each written table.
    A statement that does not parse gives an empty :class:`SqlLineage`."""
    statements = (sql,) if isinstance(sql, str) else tuple(sql)
    return _parsed(statements, namespace, kind, default_schema, database)


@lru_cache(maxsize=256)  # a loop runs the same statement many times
def _parsed(
    statements: tuple[str, ...], namespace: str, kind: str, default_schema: str | None, database: str | None
) -> SqlLineage:
    import openlineage_sql  # noqa: PLC0415 - optional native parser, imported only when a SQL step is seen

    try:
        meta = openlineage_sql.parse(
            list(statements), dialect=DIALECTS.get(kind, "generic"), default_schema=default_schema
        )
    except Exception:  # noqa: BLE001 - an unparsable statement has no lineage, it is not an error
        return SqlLineage()
    if meta is None:
        return SqlLineage()
    inputs = tuple(dict.fromkeys(_name(t, default_schema, database) for t in meta.in_tables))
    outputs = tuple(dict.fromkeys(_name(t, default_schema, database) for t in meta.out_tables))
    if not outputs:
        return SqlLineage(inputs=inputs)
    return SqlLineage(inputs, outputs, _facets(statements, meta, namespace, kind, default_schema, database))


def column_lineage(
    sql: str | list[str],
    namespace: str,
    *,
    kind: str = "postgres",
    default_schema: str | None = None,
    database: str | None = None,
) -> dict[str, cl.ColumnLineageDatasetFacet]:
    """``{output table name: ColumnLineageDatasetFacet}`` for the tables ``sql`` writes."""
    return sql_lineage(
        sql, namespace, kind=kind, default_schema=default_schema, database=database
    ).column_lineage


def _facets(
    statements: tuple[str, ...],
    whole: Any,
    namespace: str,
    kind: str,
    default_schema: str | None,
    database: str | None,
) -> dict[str, cl.ColumnLineageDatasetFacet]:
    """Column lineage statement by statement: each written table gets the fields its own
    statement maps (openlineage-sql gives no target table per column when several statements
    write), in the INSERT column list's names when the select list's shape is known."""
    import openlineage_sql  # noqa: PLC0415

    fields: dict[str, dict[str, list[cl.InputField]]] = {}
    indirect: dict[str, dict[tuple[str, str], list[cl.Transformation]]] = {}
    each = [one for sql in statements for one in split_statements(sql)]
    for stmt in each:
        if len(each) == 1:
            meta = whole  # one statement: the parse already made
        else:
            try:
                meta = openlineage_sql.parse(
                    [stmt], dialect=DIALECTS.get(kind, "generic"), default_schema=default_schema
                )
            except Exception:  # noqa: BLE001 - as in _parsed
                continue
        if meta is None or not meta.out_tables or not meta.column_lineage:
            continue
        target = _name(meta.out_tables[0], default_schema, database)
        out = fields.setdefault(target, {})
        by_name = {col.descendant.name: col for col in meta.column_lineage}
        try:
            form = shape(stmt)
        except Exception:  # noqa: BLE001 - never an error from lineage: openlineage-sql's names then
            form = None
        if form is None:  # not a shape we know: openlineage-sql's names, subtype by name only
            for col in meta.column_lineage:
                single = len(col.lineage) == 1 and col.lineage[0].name == col.descendant.name
                _add(
                    out,
                    col.descendant.name,
                    col,
                    namespace,
                    default_schema,
                    database,
                    cl.Transformation(type="DIRECT", subtype="IDENTITY" if single else "TRANSFORMATION"),
                )
            continue
        for branch in form.branches:
            for column, item in zip(form.targets(), branch, strict=True):
                col = by_name.get(item.name)
                if col is None:  # a constant: no input column
                    continue
                subtype = (
                    item.subtype if item.subtype != "IDENTITY" or len(col.lineage) == 1 else "TRANSFORMATION"
                )
                _add(
                    out,
                    column,
                    col,
                    namespace,
                    default_schema,
                    database,
                    cl.Transformation(type="DIRECT", subtype=subtype, masking=True if item.masking else None),
                )
        reads = indirect.setdefault(target, {})
        for table, column, subtype in form.indirect:
            if table == ITEM:  # GROUP BY 1: the input columns of that select item
                col = by_name.get(column)
                found = [
                    (_name(src.origin, default_schema, database), src.name)
                    for src in (col.lineage if col is not None else ())
                    if src.origin is not None
                ]
            else:
                name = _resolve(table, meta.in_tables, default_schema, database)
                found = [(name, column)] if name is not None else []
            for key in found:
                ts = reads.setdefault(key, [])
                if not any(t.subtype == subtype for t in ts):
                    ts.append(cl.Transformation(type="INDIRECT", subtype=subtype))
    return {
        name: cl.ColumnLineageDatasetFacet(
            fields={c: cl.Fields(inputFields=inputs) for c, inputs in f.items()},
            dataset=[
                cl.InputField(namespace=namespace, name=t, field=c, transformations=ts)
                for (t, c), ts in indirect.get(name, {}).items()
            ]
            or None,
            producer=PRODUCER,
        )
        for name, f in fields.items()
        if f
    }


def _resolve(table: str, in_tables: Any, default_schema: str | None, database: str | None) -> str | None:
    """The name of the one input table ``table`` (as written in the statement) stands for."""
    want = [p.lower() for p in table.split(".")]
    found = {
        _name(t, default_schema, database)
        for t in in_tables
        if [p.lower() for p in (t.database or database or "", t.schema or default_schema or "", t.name)][
            -len(want) :
        ]
        == want
    }
    return found.pop() if len(found) == 1 else None


def _add(
    out: dict[str, list[cl.InputField]],
    column: str,
    col: Any,
    namespace: str,
    default_schema: str | None,
    database: str | None,
    transformation: cl.Transformation,
) -> None:
    """Add ``col``'s input columns to the output ``column`` (once each)."""
    have = out.setdefault(column, [])
    for src in col.lineage:
        if src.origin is None:
            continue
        name = _name(src.origin, default_schema, database)
        if not any(
            f.name == name and f.field == src.name and f.transformations == [transformation] for f in have
        ):
            have.append(
                cl.InputField(
                    namespace=namespace, name=name, field=src.name, transformations=[transformation]
                )
            )
