"""Column lineage of a SQL statement (issue 18.5) with openlineage-sql, OpenLineage's own
SQL parser: for each written table, a ``columnLineage`` dataset facet naming, per output
column, the input columns it was computed from (a plain copy is ``DIRECT/IDENTITY``, an
expression ``DIRECT/TRANSFORMATION``). A statement that does not parse, or writes no
table, gives nothing (lineage then has datasets without columns, never an error).
"""

from __future__ import annotations

from typing import Any

from openlineage.client.generated import column_lineage_dataset as cl

PRODUCER = "https://github.com/noetl/noetl-dagster"
DIALECTS = {"postgres": "postgres", "duckdb": "duckdb", "snowflake": "snowflake", "mysql": "mysql", "mariadb": "mysql"}


def _name(table: Any, default_schema: str | None) -> str:
    schema = table.schema or default_schema
    parts = [p for p in (table.database, schema, table.name) if p]
    return ".".join(parts)


def column_lineage(
    sql: str | list[str], namespace: str, *, kind: str = "postgres", default_schema: str | None = None
) -> dict[str, cl.ColumnLineageDatasetFacet]:
    """``{output table name: ColumnLineageDatasetFacet}`` for the tables ``sql`` writes."""
    import openlineage_sql  # noqa: PLC0415 - optional native parser, imported only when a SQL step is seen

    statements = [sql] if isinstance(sql, str) else list(sql)
    try:
        meta = openlineage_sql.parse(statements, dialect=DIALECTS.get(kind, "generic"), default_schema=default_schema)
    except Exception:  # noqa: BLE001 - an unparsable statement has no column lineage, it is not an error
        return {}
    if meta is None or not meta.out_tables:
        return {}
    out_names = [_name(t, default_schema) for t in meta.out_tables]
    fields: dict[str, dict[str, cl.Fields]] = {n: {} for n in out_names}
    for col in meta.column_lineage:
        target = _name(col.descendant.origin, default_schema) if col.descendant.origin else out_names[0]
        inputs = [
            cl.InputField(
                namespace=namespace,
                name=_name(src.origin, default_schema),
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
