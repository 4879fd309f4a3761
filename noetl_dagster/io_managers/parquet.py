"""Parquet files (Tier 2), one immutable object per version."""

from __future__ import annotations

from typing import Any, ClassVar

import dagster as dg
from pydantic import Field

from noetl_dagster.io_managers.base import NoetlTableIOManager
from noetl_dagster.storage.tables import FORMAT_PARQUET


class ParquetIOManager(NoetlTableIOManager):
    """Writes outputs as Parquet (pyarrow) and registers each version in the NoETL registry."""

    table_format: ClassVar[str] = FORMAT_PARQUET

    compression: str = Field(default="snappy", description="snappy, zstd, gzip, lz4, brotli or none")

    def _write_options(self, context: dg.OutputContext) -> dict[str, Any]:
        return {"compression": self.compression}
