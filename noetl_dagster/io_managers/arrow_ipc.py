"""Arrow IPC / Feather v2 files (Tier 1.5): columnar interchange, memory-mappable when uncompressed."""

from __future__ import annotations

from typing import Any, ClassVar

import dagster as dg
from pydantic import Field

from noetl_dagster.io_managers.base import NoetlTableIOManager
from noetl_dagster.storage.tables import FORMAT_ARROW


class ArrowIPCIOManager(NoetlTableIOManager):
    """Writes outputs as Arrow IPC files and registers each version in the NoETL registry."""

    table_format: ClassVar[str] = FORMAT_ARROW

    compression: str = Field(
        default="lz4", description="lz4 (pyarrow's Feather default), zstd, or uncompressed (mmap-friendly)"
    )

    def _write_options(self, context: dg.OutputContext) -> dict[str, Any]:
        return {"compression": self.compression}
