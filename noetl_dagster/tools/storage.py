"""``kind: parquet`` | ``kind: arrow`` | ``kind: iceberg``: write (or read) tables by reference.

Writing (``op: write``, the default)::

    - name: save
      kind: iceberg                     # or parquet / arrow
      uri: noetl://acme/lab/sales/dataset/orders     # or resource: orders (+ namespace, type)
      data: "{{ fetch.rows }}"          # records, a dict of columns, {rows: [...]}, or a $ref
      mode: append                      # iceberg: append | overwrite
      partition_by: [{source: day, transform: identity}]
      inputs: [noetl://acme/lab/raw/dataset/events]  # lineage (optional)

writes a new version, registers it in the NoETL registry and returns the
reference ``{uri, urn, resource_id, version, store, format, size, checksum, rows,
schema_fingerprint, location[, snapshot_id]}`` — never the rows.

Reading (``op: read``) resolves ``uri`` through the registry (tenancy and grants
apply), verifies the checksum and returns ``{rows, row_count, columns, ref}``
(``as: pydict`` gives columns instead of rows; ``columns`` selects some;
``partition_key: K`` reads partition K's newest version, see :func:`partition_uri`).

Options shared by both: ``registry`` (an http(s) URL or a database URL; default
``$NOETL_REGISTRY_URL`` or ``<data dir>/registry.db``), ``api_key`` (default
``$NOETL_REGISTRY_API_KEY``), ``store`` (payload store URL for table files;
default ``<data dir>/tables``), ``catalog`` (pyiceberg catalog properties) and
``catalog_name``. Without an API key the execution's tenant/project act.

A task of any kind can write its result the same way with a sink spec;
:func:`write_sink` is the hook the engine calls for ``sink: {kind, uri, ...}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from noetl_dagster.dsl.locator import InvalidLocator, parse_locator
from noetl_dagster.storage.locator import RefRefused, read_for
from noetl_dagster.storage.payload import (
    ChecksumMismatch,
    PayloadStore,
    ResultRef,
    checksum_algorithm,
    is_ref,
)
from noetl_dagster.storage.tables import (
    FORMAT_ARROW,
    FORMAT_ICEBERG,
    FORMAT_PARQUET,
    TableDataError,
    TableStorage,
    read_file_table,
)
from noetl_dagster.tools.configs import StorageConfig
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool
from noetl_dagster.tools.table_access import (  # noqa: F401 - REGISTRY_*_ENV, _data_dir: this module's API too
    REGISTRY_KEY_ENV,
    REGISTRY_URL_ENV,
    _data_dir,
    _scope,
    _storage,
    _target_uri,
)
from noetl_dagster.util.jsonutil import plain

_KNOWN_KEYS = {
    "op",
    "uri",
    "resource",
    "namespace",
    "type",
    "version",
    "data",
    "rows",
    "mode",
    "partition_by",
    "compression",
    "checksum",
    "inputs",
    "metadata",
    "resource_kind",
    "registry",
    "api_key",
    "store",
    "catalog",
    "catalog_name",
    "as",
    "columns",
    "input",
    "partition_key",
}


def _payloads(ctx: ToolContext) -> PayloadStore | None:
    return getattr(ctx, "payloads", None)


def table_data(value: Any, ctx: ToolContext) -> Any:
    """What a task hands over as ``data``: rows, columns, a ``{rows: …}`` result, or a ``$ref``."""
    if is_ref(value):
        ref = ResultRef.from_dict(value["$ref"])
        store = _payloads(ctx)
        if store is None:
            raise ToolError(
                f"cannot read {ref.uri}: this execution has no payload store", kind="config_error"
            )
        try:  # through the locator: a reference of another tenant, or no platform's, reads nothing
            data = read_for(ctx, ref, store)
        except RefRefused as e:
            raise ToolError(str(e), kind="reference_refused") from None
        if ref.format in (FORMAT_ARROW, "arrow_ipc", FORMAT_PARQUET):
            return read_file_table(data, FORMAT_ARROW if ref.format == "arrow_ipc" else ref.format)
        from noetl_dagster.util.jsonutil import loads  # noqa: PLC0415

        value = loads(data)
    if (
        isinstance(value, Mapping)
        and isinstance(value.get("rows"), list)
        and not isinstance(value.get("rows"), str)
    ):
        rows = value["rows"]
        if rows and not isinstance(rows[0], Mapping) and isinstance(value.get("columns"), list):
            return [dict(zip(value["columns"], r, strict=True)) for r in rows]  # rows as lists + column names
        return rows
    return value


def _write(fmt: str, inputs: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    unknown = set(inputs) - _KNOWN_KEYS
    if unknown:
        raise ToolError(f"{fmt}: unknown option(s) {sorted(unknown)}", kind="config_error")
    storage = _storage(inputs, ctx)
    uri = _target_uri(inputs, ctx, storage)
    raw = inputs["data"] if "data" in inputs else inputs.get("rows")
    if raw is None:
        raise ToolError(
            f"{fmt}: nothing to write (set data: to rows, columns or a step result)", kind="config_error"
        )
    lineage = inputs.get("inputs") or []
    if isinstance(lineage, str):
        lineage = [lineage]
    checksum = inputs.get("checksum")
    try:
        checksum = checksum_algorithm(str(checksum)) if checksum is not None else None
    except ValueError as e:
        raise ToolError(f"{fmt}: {e}", kind="config_error") from None
    pub = storage.publish(
        table_data(raw, ctx),
        uri,
        format=fmt,
        mode=str(inputs.get("mode") or "append"),
        partition_by=inputs.get("partition_by"),
        compression=inputs.get("compression"),
        checksum=checksum,
        inputs=list(lineage),
        metadata=dict(inputs.get("metadata") or {}),
        kind=inputs.get("resource_kind"),
        execution_id=getattr(ctx, "execution_id", None),
        step=getattr(ctx, "step", None),
        task=getattr(ctx, "task", None),
    )
    return pub.ref()


def partition_uri(storage: TableStorage, uri: str, key: str) -> str:
    """``partition_key: K`` on a read: the newest version recorded for partition K (its registry
    ``partition_key`` is K, or a range ``first...last`` holding K in key order), not a version another
    partition wrote after it. A table whose newest version records no partition is read as it is."""
    loc = parse_locator(uri, require_version=False)
    if loc.version is not None:
        return uri  # a pinned version is what it names
    reg = storage.registry
    newest = reg.resolve(loc.uri)
    n = int(newest.version[1:]) if newest.version[1:].isdigit() and newest.version.startswith("v") else None
    if n is None or not newest.metadata.get("partition_key"):
        return uri
    for i in range(n, max(n - PARTITION_WALK, 0), -1):
        plan = newest if i == n else reg.resolve(f"{loc.uri}@v{i}")
        label = str(plan.metadata.get("partition_key") or "")
        first, sep, last = label.partition(RANGE_SEP)
        if label == key or (sep and first <= key <= last):
            return plan.uri
    raise ToolError(f"{loc.uri} has no version for partition {key!r}", kind="not_found")


PARTITION_WALK = 5000  # versions a partition read walks back through at most
RANGE_SEP = "..."  # a range run records partition_key "<first>...<last>"


def _readers(ctx: ToolContext) -> dict[str, Any]:
    """Formats another tool stores, read through it: a ``kind: ducklake`` registered version (its table at
    the recorded snapshot; duckdb and the ducklake extension load only when one is read)."""

    def ducklake(location: Any, checksum: str | None, columns: list[str] | None) -> Any:
        from noetl_dagster.tools.ducklake import read_version  # noqa: PLC0415

        return read_version(location, checksum, ctx, columns)

    return {"ducklake": ducklake}


def _read(inputs: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    storage = _storage(inputs, ctx)
    uri = _target_uri(inputs, ctx, storage)
    if inputs.get("partition_key") not in (None, ""):
        uri = partition_uri(storage, uri, str(inputs["partition_key"]))
    as_type = str(inputs.get("as") or "records")
    if as_type not in ("records", "pydict"):
        raise ToolError("as: must be records or pydict (JSON-friendly results)", kind="config_error")
    columns = inputs.get("columns")
    table, plan = storage.fetch(
        uri, as_type="arrow", columns=list(columns) if columns else None, readers=_readers(ctx)
    )
    assert isinstance(table, pa.Table)
    out: dict[str, Any] = {
        "row_count": table.num_rows,
        "columns": list(table.schema.names),
        "ref": {
            "uri": plan.uri,
            "urn": plan.urn,
            "resource_id": plan.resource_id,
            "version": plan.version,
            "format": plan.format,
            "checksum": plan.expected_checksum,
            "rows": plan.rows,
            "location": plan.location.uri if plan.location else None,
        },
    }
    out["rows" if as_type == "records" else "columns_data"] = plain(
        table.to_pylist() if as_type == "records" else table.to_pydict()
    )
    return out


def _run(fmt: str, inputs: dict[str, Any], ctx: ToolContext) -> Any:
    from noetl_registry.errors import RegistryError  # noqa: PLC0415

    op = str(inputs.get("op") or "write")
    try:
        if op == "write":
            return _write(fmt, inputs, ctx)
        if op == "read":
            return _read(inputs, ctx)
        raise ToolError(f"{fmt}: op must be write or read, not {op!r}", kind="config_error")
    except RegistryError as e:
        raise ToolError(f"{fmt}: registry: {e.message}", kind=f"registry_{e.code}", code=e.status) from None
    except ChecksumMismatch as e:
        raise ToolError(f"{fmt}: {e}", kind="checksum_mismatch") from None
    except (TableDataError, InvalidLocator) as e:
        raise ToolError(f"{fmt}: {e}", kind="config_error") from None


def parquet_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    """Write rows as a Parquet version of a noetl:// resource (or op: read it back)."""
    return _run(FORMAT_PARQUET, inputs, ctx)


def arrow_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    """Write rows as an Arrow IPC (Feather v2) version of a noetl:// resource (or op: read it back)."""
    return _run(FORMAT_ARROW, inputs, ctx)


def iceberg_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    """Append/overwrite an Iceberg table as a version of a noetl:// resource (or op: read it back)."""
    return _run(FORMAT_ICEBERG, inputs, ctx)


def write_sink(result: Any, sink: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Write a task's result to ``sink: {kind: parquet|arrow|iceberg, uri|name, ...}``; returns the reference."""
    kind = str(sink.get("kind") or "parquet")
    fmt = {"parquet": FORMAT_PARQUET, "arrow": FORMAT_ARROW, "iceberg": FORMAT_ICEBERG}.get(kind)
    if fmt is None:
        raise ToolError(f"sink kind must be parquet, arrow or iceberg, not {kind!r}", kind="config_error")
    spec = {k: v for k, v in sink.items() if k != "kind"}
    spec["data"] = result
    return _run(fmt, spec, ctx)


register_tool("parquet", parquet_tool, config=StorageConfig, description=parquet_tool.__doc__ or "")
register_tool("arrow", arrow_tool, config=StorageConfig, description=arrow_tool.__doc__ or "")
register_tool("iceberg", iceberg_tool, config=StorageConfig, description=iceberg_tool.__doc__ or "")
