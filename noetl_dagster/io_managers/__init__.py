"""Reference-first IO managers: Parquet, Arrow IPC (Feather v2) and Iceberg, recorded in the NoETL registry."""

from noetl_dagster.io_managers.arrow_ipc import ArrowIPCIOManager
from noetl_dagster.io_managers.base import NoetlTableIOManager
from noetl_dagster.io_managers.iceberg import IcebergIOManager
from noetl_dagster.io_managers.parquet import ParquetIOManager

__all__ = ["ArrowIPCIOManager", "IcebergIOManager", "NoetlTableIOManager", "ParquetIOManager"]
