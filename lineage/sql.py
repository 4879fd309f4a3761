"""Column lineage of a SQL statement (issue 18.5) with openlineage-sql, OpenLineage's own
SQL parser: for each written table, a ``columnLineage`` dataset facet naming, per output
column, the input columns it was computed from (a plain copy is ``DIRECT/IDENTITY``, an
expression ``DIRECT/TRANSFORMATION``). A statement that does not parse, or writes no
table, gives nothing (lineage then has datasets without columns, never an error).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from openlineage.client.generated import column_lineage_dataset as cl

PRODUCER = "https://github.com/noetl/noetl-dagster"
DIALECTS = {"postgres": "postgres", "duckdb": "duckdb", "snowflake": "snowflake", "mysql": "mysql", "mariadb": "mysql"}


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
    sql: str | list[str], namespace: str, *, kind: str = "postgres", default_schema: str | None = None,
    database: str | None = None,
) -> SqlLineage:
    """The tables ``sql`` reads and writes, with the column lineage of each written table.
    A statement that does not parse gives an empty :class:`SqlLineage`."""
    statements = (sql,) if isinstance(sql, str) else tuple(sql)
    return _parsed(statements, namespace, kind, default_schema, database)


@lru_cache(maxsize=256)  # a loop runs the same statement many times
def _parsed(statements: tuple[str, ...], namespace: str, kind: str, default_schema: str | None,
            database: str | None) -> SqlLineage:
    import openlineage_sql  # noqa: PLC0415 - optional native parser, imported only when a SQL step is seen

    try:
        meta = openlineage_sql.parse(list(statements), dialect=DIALECTS.get(kind, "generic"),
                                     default_schema=default_schema)
    except Exception:  # noqa: BLE001 - an unparsable statement has no lineage, it is not an error
        return SqlLineage()
    if meta is None:
        return SqlLineage()
    inputs = tuple(dict.fromkeys(_name(t, default_schema, database) for t in meta.in_tables))
    outputs = tuple(dict.fromkeys(_name(t, default_schema, database) for t in meta.out_tables))
    if not outputs:
        return SqlLineage(inputs=inputs)
    return SqlLineage(inputs, outputs, _column_facets(meta, outputs, namespace, default_schema, database))


def column_lineage(
    sql: str | list[str], namespace: str, *, kind: str = "postgres", default_schema: str | None = None,
    database: str | None = None,
) -> dict[str, cl.ColumnLineageDatasetFacet]:
    """``{output table name: ColumnLineageDatasetFacet}`` for the tables ``sql`` writes."""
    return sql_lineage(sql, namespace, kind=kind, default_schema=default_schema, database=database).column_lineage


def _column_facets(meta: Any, out_names: tuple[str, ...], namespace: str, default_schema: str | None,
                   database: str | None) -> dict[str, cl.ColumnLineageDatasetFacet]:
    fields: dict[str, dict[str, cl.Fields]] = {n: {} for n in out_names}
    for col in meta.column_lineage:
        target = _name(col.descendant.origin, default_schema, database) if col.descendant.origin else out_names[0]
        inputs = [
            cl.InputField(
                namespace=namespace,
                name=_name(src.origin, default_schema, database),
                field=src.name,
                transformations=[
                    cl.Transformation(
                        type="DIRECT",
                        subtype="IDENTITY" if src.name == col.descendant.name and len(col.lineage) == 1 else "TRANSFORMATION",
                    )
                ],
            )
            for src in col.lineage
            if src.origin is not None
        ]
        if inputs:
            fields.setdefault(target, {})[col.descendant.name] = cl.Fields(inputFields=inputs)
    return {
        name: cl.ColumnLineageDatasetFacet(fields=f, producer=PRODUCER) for name, f in fields.items() if f
    }
