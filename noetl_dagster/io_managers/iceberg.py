"""Iceberg tables through pyiceberg directly (dagster-iceberg caps pyiceberg below 0.12).

A version of a resource is an Iceberg snapshot. Per asset or output metadata:
``noetl/mode`` (``append`` | ``overwrite``) and ``noetl/partition_by`` (column
names or ``{source, transform, name}`` with pyiceberg transforms such as
``day``, ``bucket[16]``), applied when the table is created or evolved.
"""

from __future__ import annotations

from typing import Any, ClassVar

import dagster as dg
from pydantic import Field

from noetl_dagster.io_managers.base import META_MODE, META_PARTITION_BY, NoetlTableIOManager
from noetl_dagster.storage.tables import FORMAT_ICEBERG, IcebergTables


class IcebergIOManager(NoetlTableIOManager):
    """Appends or overwrites Iceberg tables and registers each snapshot in the NoETL registry."""

    table_format: ClassVar[str] = FORMAT_ICEBERG

    catalog_name: str = Field(default="noetl", description="pyiceberg catalog name")
    catalog_properties: dict[str, str] = Field(
        default_factory=dict,
        description="pyiceberg load_catalog properties (type, uri, warehouse, ...); "
        "default: SQL catalog on SQLite under $NOETL_DAGSTER_HOME/iceberg",
    )
    mode: str = Field(default="append", description="append or overwrite (per-output: metadata noetl/mode)")

    def _iceberg(self) -> Any:
        return IcebergTables(self.catalog_name, self.catalog_properties or None)

    def _write_options(self, context: dg.OutputContext) -> dict[str, Any]:
        return {
            "mode": self._meta(context, META_MODE) or self.mode,
            "partition_by": self._meta(context, META_PARTITION_BY),
        }
