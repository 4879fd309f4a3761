"""Tables, reference-first: write Parquet / Arrow IPC / Iceberg, register, resolve, verify.

Dagster-free core shared by the IO managers (``noetl_dagster.io_managers``) and
the storage tool kinds (``noetl_dagster.tools.storage``).

- Parquet (Tier 2 files) and Arrow IPC / Feather v2 (Tier 1.5) are immutable
  objects in a :class:`~noetl_dagster.storage.payload.PayloadStore`, one per
  version, under the shard prefix of seed 004 §4; their checksum is the sha256
  of the bytes, computed while writing.
- Iceberg tables go through pyiceberg (a SQL catalog on SQLite by default, any
  pyiceberg catalog by properties); a version is a snapshot. Its checksum is the
  sha256 of the snapshot's data-file manifest (path, size, record count of every
  live file), re-derived and compared, together with each file's size on
  storage, on every read: Iceberg data files are immutable, so the manifest
  pins the content without re-hashing the whole table on each append.

Every write registers a version in the registry; every read resolves the
``noetl://`` URI through it (tenancy and grants apply) and fails closed when the
checksum does not match.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

import pyarrow as pa

from noetl_dagster.dsl.locator import DEFAULT_LAYOUT, ObjectLayout, ResourceLocator, parse_locator
from noetl_dagster.engine.usage import count
from noetl_dagster.storage.payload import (
    PAYLOAD_STORE_ENV,
    ChecksumMismatch,
    FilePayloadStore,
    PayloadStore,
    open_payload_store,
    store_for_uri,
)
from noetl_dagster.util.extras import require

if TYPE_CHECKING:  # pragma: no cover
    from noetl_registry.client import RegistryClient
    from noetl_registry.models import AccessPlan, Resource

# a reader of a format stored outside this layer: (location, expected checksum, columns) -> table
Reader = Callable[[Any, "str | None", "list[str] | None"], pa.Table]

FORMAT_PARQUET = "parquet"
FORMAT_ARROW = "arrow"  # as in the duckdb tool's Arrow $refs; payload_type arrow_ipc in seed 004
FORMAT_ICEBERG = "iceberg"
FORMATS = (FORMAT_PARQUET, FORMAT_ARROW, FORMAT_ICEBERG)
FORMAT_ALIASES = {
    "parquet": FORMAT_PARQUET,
    "arrow": FORMAT_ARROW,
    "arrow_ipc": FORMAT_ARROW,
    "feather": FORMAT_ARROW,
    "ipc": FORMAT_ARROW,
    "iceberg": FORMAT_ICEBERG,
}
CONTENT_TYPES = {
    FORMAT_PARQUET: "application/vnd.apache.parquet",
    FORMAT_ARROW: "application/vnd.apache.arrow.file",
    FORMAT_ICEBERG: "application/vnd.apache.iceberg",
}
AS_TYPES = ("arrow", "polars", "pandas", "records", "pydict")
PARQUET_WRITE_BUFFER = 4 << 20
IPC_BATCH_ROWS = 64 * 1024


class TableDataError(ValueError):
    """Data that cannot become an Arrow table, or a bad storage option."""


def home_dir() -> Path:
    return Path(os.environ.get("NOETL_DAGSTER_HOME", ".noetl"))


# ------------------------------------------------------------------ conversions


def to_arrow(data: Any) -> pa.Table:
    """An Arrow table from an Arrow table/batch/reader, a polars or pandas frame,
    a list of records (dicts), a dict of columns, or any Arrow C-stream exporter."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.read_all()
    mod = type(data).__module__.split(".", 1)[0]
    if mod == "polars":
        if type(data).__name__ == "LazyFrame":
            data = data.collect()
        return data.to_arrow()
    if mod == "pandas":
        pd = require("pandas", "a pandas DataFrame")

        if isinstance(data, pd.DataFrame):
            return pa.Table.from_pandas(data, preserve_index=False)
    if isinstance(data, list):
        if not data:
            raise TableDataError(
                "no rows to write: an empty list has no schema (pass an Arrow table instead)"
            )
        if not all(isinstance(r, Mapping) for r in data):
            raise TableDataError("a list of rows must hold records (dicts of column -> value)")
        return pa.Table.from_pylist([dict(r) for r in data])
    if isinstance(data, Mapping):
        if data and all(isinstance(v, (list, tuple, pa.Array, pa.ChunkedArray)) for v in data.values()):
            return pa.table({str(k): v for k, v in data.items()})
        raise TableDataError("a dict must map column names to equal-length lists")
    if hasattr(data, "__arrow_c_stream__"):
        return pa.table(data)
    raise TableDataError(
        f"cannot write {type(data).__name__} as a table: pass an Arrow table, a polars or pandas frame, "
        "a list of records or a dict of columns"
    )


def convert(table: pa.Table, as_type: str = "arrow") -> Any:
    """An Arrow table as ``arrow`` | ``polars`` | ``pandas`` | ``records`` | ``pydict``."""
    if as_type == "arrow":
        return table
    if as_type == "polars":
        return require("polars", "a polars DataFrame").from_arrow(table)
    if as_type == "pandas":
        require("pandas", "a pandas DataFrame")
        return table.to_pandas()
    if as_type == "records":
        return table.to_pylist()
    if as_type == "pydict":
        return table.to_pydict()
    raise TableDataError(f"unknown result type {as_type!r}; use one of {', '.join(AS_TYPES)}")


def schema_fingerprint(schema: pa.Schema) -> str:
    """sha256 over column names, types and nullability (metadata ignored)."""
    canon = [[f.name, str(f.type), f.nullable] for f in schema]
    return "sha256:" + hashlib.sha256(json.dumps(canon, separators=(",", ":")).encode()).hexdigest()


def column_schema(schema: pa.Schema) -> list[dict[str, Any]]:
    return [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema]


def table_checksum(table: pa.Table) -> str:
    """A content digest independent of chunking and file format: sha256 of the rows
    in an uncompressed Arrow IPC stream after combining chunks. Used by tests and
    tools to prove two reads return identical data."""
    combined = table.combine_chunks().replace_schema_metadata(None)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, combined.schema) as w:
        w.write_table(combined)
    return "sha256:" + hashlib.sha256(sink.getvalue()).hexdigest()


def normalize_format(fmt: str) -> str:
    try:
        return FORMAT_ALIASES[fmt.lower()]
    except KeyError:
        raise TableDataError(f"unknown table format {fmt!r}; use parquet, arrow or iceberg") from None


# ------------------------------------------------------------------ file formats


@dataclass
class TableWrite:
    """What a write produced: the physical location and its integrity data."""

    format: str
    uri: str
    storage_type: str
    size: int | None
    checksum: str
    rows: int
    schema_fingerprint: str
    columns: list[dict[str, Any]]
    metadata: dict[str, Any] = field(default_factory=dict)

    def location(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "storage_type": self.storage_type,
            "checksum": self.checksum,
            "size_bytes": self.size,
            "format": self.format,
            "rows": self.rows,
            "schema_fingerprint": self.schema_fingerprint,
            "metadata": self.metadata,
        }


def write_parquet(
    table: pa.Table,
    store: PayloadStore,
    key: str,
    *,
    compression: str = "snappy",
    checksum: str | None = None,
    **options: Any,
) -> TableWrite:
    import pyarrow.parquet as pq  # noqa: PLC0415

    with store.writer(key, checksum) as w:
        # Parquet emits many small pages; batching them keeps Python calls (and sync hashing) few
        sink = pa.BufferedOutputStream(pa.PythonFile(w, mode="w"), buffer_size=PARQUET_WRITE_BUFFER)
        pq.write_table(table, sink, compression=compression, **options)
        sink.close()
    count(bytes_written=w.size)  # the running task's usage (outside a task: nothing)
    return TableWrite(
        FORMAT_PARQUET,
        w.uri,
        store.name,
        w.size,
        w.checksum,
        table.num_rows,
        schema_fingerprint(table.schema),
        column_schema(table.schema),
        {"compression": compression},
    )


def write_arrow_ipc(
    table: pa.Table,
    store: PayloadStore,
    key: str,
    *,
    compression: str | None = "lz4",
    checksum: str | None = None,
) -> TableWrite:
    """Feather v2 = the Arrow IPC file format. ``lz4`` matches pyarrow's Feather default;
    ``None``/``"uncompressed"`` gives a file that can be memory-mapped without decoding."""
    codec = None if compression in (None, "", "uncompressed", "none") else compression
    options = pa.ipc.IpcWriteOptions(compression=codec)
    with store.writer(key, checksum) as w:
        with pa.ipc.new_file(w, table.schema, options=options) as writer:
            # record batches of Feather's default size: codec work spreads over threads, readers stream
            writer.write_table(table, max_chunksize=IPC_BATCH_ROWS)
    count(bytes_written=w.size)
    return TableWrite(
        FORMAT_ARROW,
        w.uri,
        store.name,
        w.size,
        w.checksum,
        table.num_rows,
        schema_fingerprint(table.schema),
        column_schema(table.schema),
        {"compression": codec or "uncompressed", "encoding": "feather_v2"},
    )


def read_file_table(data: bytes, fmt: str, columns: list[str] | None = None) -> pa.Table:
    if fmt == FORMAT_PARQUET:
        import pyarrow.parquet as pq  # noqa: PLC0415

        return pq.read_table(pa.BufferReader(data), columns=columns)
    if fmt == FORMAT_ARROW:
        table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
        return table.select(columns) if columns else table
    raise TableDataError(f"not a file format: {fmt}")


# ------------------------------------------------------------------ iceberg


def _iceberg_env() -> None:
    # Iceberg v2 stores microseconds; pandas/polars default to nanoseconds.
    os.environ.setdefault("PYICEBERG_DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE", "true")


def _partition_fields(partition_by: Any) -> list[tuple[str, str, str | None]]:
    """``["day_col", {"source": "ts", "transform": "day", "name": "ts_day"}]`` -> (source, transform, name)."""
    if partition_by is None:
        return []
    if isinstance(partition_by, (str, Mapping)):
        partition_by = [partition_by]
    out = []
    for item in partition_by:
        if isinstance(item, str):
            out.append((item, "identity", None))
        elif isinstance(item, Mapping) and "source" in item:
            out.append((str(item["source"]), str(item.get("transform", "identity")), item.get("name")))
        else:
            raise TableDataError(
                f"partition field {item!r}: use a column name or {{source, transform, name}}"
            )
    return out


class IcebergTables:
    """Iceberg tables through pyiceberg; a version of a resource is one snapshot.

    Default catalog: SQL on SQLite at ``$NOETL_DAGSTER_HOME/iceberg/catalog.db`` with a
    warehouse beside it. ``properties`` are handed to ``pyiceberg.catalog.load_catalog``
    unchanged (REST, Glue, Hive, a Postgres SQL catalog, ...)."""

    def __init__(
        self,
        catalog_name: str = "noetl",
        properties: Mapping[str, Any] | None = None,
        data_dir: str | os.PathLike[str] | None = None,
    ):
        self.catalog_name = catalog_name
        if properties:
            self.properties = {k: str(v) for k, v in properties.items()}
        else:
            base = Path(data_dir) if data_dir else home_dir()
            root = (base / "iceberg").resolve()
            (root / "warehouse").mkdir(parents=True, exist_ok=True)
            self.properties = {
                "type": "sql",
                "uri": f"sqlite:///{root / 'catalog.db'}",
                "warehouse": (root / "warehouse").as_uri(),
            }
        self._catalog: Any = None
        # identifier -> (snapshot id, its live data files): the last snapshot this object wrote, so
        # that the next append's manifest is the parent's files plus the ones it added
        self._live: dict[tuple[str, ...], tuple[int, list[tuple[str, int, int]]]] = {}

    @property
    def catalog(self) -> Any:
        if self._catalog is None:
            _iceberg_env()
            load_catalog = require("pyiceberg.catalog", "an Iceberg table").load_catalog

            self._catalog = load_catalog(self.catalog_name, **self.properties)
        return self._catalog

    @staticmethod
    def identifier(loc: ResourceLocator) -> tuple[str, ...]:
        # Iceberg joins namespace levels with '.', so a '.' inside a part would alias another table.
        for part in (loc.namespace, *loc.name.split("/")):
            if "." in part:
                raise TableDataError(f"{loc.uri}: Iceberg resources cannot have '.' in namespace or name")
        return (loc.tenant, loc.project, loc.namespace, "__".join(loc.name.split("/")))

    def write(
        self,
        table: pa.Table,
        loc: ResourceLocator,
        *,
        mode: str = "append",
        partition_by: Any = None,
        properties: Mapping[str, str] | None = None,
    ) -> TableWrite:
        from pyiceberg.exceptions import NoSuchTableError  # noqa: PLC0415

        if mode not in ("append", "overwrite"):
            raise TableDataError(f"iceberg mode must be 'append' or 'overwrite', not {mode!r}")
        ident = self.identifier(loc)
        cat = self.catalog
        cat.create_namespace_if_not_exists(ident[:-1])
        try:
            tbl = cat.load_table(ident)
        except NoSuchTableError:
            tbl = cat.create_table_if_not_exists(
                ident, schema=table.schema, properties=dict(properties or {})
            )
        self._ensure_partitioning(tbl, _partition_fields(partition_by))
        current = {f.name for f in tbl.schema().fields}
        if any(name not in current for name in table.schema.names):
            with tbl.update_schema() as update:
                update.union_by_name(table.schema)
        parent = tbl.current_snapshot()
        if mode == "overwrite" and parent is not None:
            tbl.overwrite(table)
        else:
            tbl.append(table)
        snapshot = tbl.current_snapshot()
        try:  # the data files this snapshot added (the table's total size is the location's size_bytes)
            count(bytes_written=int((snapshot.summary or {}).get("added-files-size") or 0))
        except (TypeError, ValueError):
            pass
        files = self._appended_files(tbl, ident, parent, snapshot)
        if files is None:
            files, checksum = self.manifest(tbl, snapshot.snapshot_id)
        else:
            checksum = self.manifest_checksum(snapshot.snapshot_id, files)
        self._live[ident] = (snapshot.snapshot_id, files)
        total_rows = (
            int(snapshot.summary.get("total-records", table.num_rows)) if snapshot.summary else table.num_rows
        )
        schema = tbl.schema().as_arrow()
        meta = {
            "catalog": self.catalog_name,
            "identifier": list(ident),
            "snapshot_id": snapshot.snapshot_id,
            "metadata_location": tbl.metadata_location,
            "data_files": len(files),
            "mode": mode,
            "rows_written": table.num_rows,
            "partition_spec": [
                {
                    "source": tbl.schema().find_field(pf.source_id).name,
                    "transform": str(pf.transform),
                    "name": pf.name,
                }
                for pf in tbl.spec().fields
            ],
        }
        uri = f"iceberg://{self.catalog_name}/{'.'.join(ident[:-1])}/{ident[-1]}?snapshot_id={snapshot.snapshot_id}"
        return TableWrite(
            FORMAT_ICEBERG,
            uri,
            "iceberg",
            sum(f[1] for f in files),
            checksum,
            total_rows,
            schema_fingerprint(schema),
            column_schema(schema),
            meta,
        )

    @staticmethod
    def _ensure_partitioning(tbl: Any, fields: list[tuple[str, str, str | None]]) -> None:
        if not fields:
            return
        from pyiceberg.transforms import parse_transform  # noqa: PLC0415

        schema = tbl.schema()
        have = {(schema.find_field(pf.source_id).name, str(pf.transform)) for pf in tbl.spec().fields}
        missing = [
            (s, parse_transform(t), n) for s, t, n in fields if (s, str(parse_transform(t))) not in have
        ]
        if missing:
            with tbl.update_spec() as update:
                for source, transform, name in missing:
                    update.add_field(source, transform, name)

    @staticmethod
    def manifest(tbl: Any, snapshot_id: int) -> tuple[list[tuple[str, int, int]], str]:
        """The snapshot's live data files (path, bytes, rows) and their sha256 digest."""
        files = sorted(
            (task.file.file_path, int(task.file.file_size_in_bytes), int(task.file.record_count))
            for task in tbl.scan(snapshot_id=snapshot_id).plan_files()
        )
        return files, IcebergTables.manifest_checksum(snapshot_id, files)

    @staticmethod
    def manifest_checksum(snapshot_id: int, files: list[tuple[str, int, int]]) -> str:
        digest = hashlib.sha256(json.dumps([snapshot_id, files], separators=(",", ":")).encode()).hexdigest()
        return "sha256:" + digest

    def _appended_files(
        self, tbl: Any, ident: tuple[str, ...], parent: Any, snapshot: Any
    ) -> list[tuple[str, int, int]] | None:
        """The live files of an append on top of the snapshot this object wrote last: the parent's
        files plus the ones the append added, from the manifests it wrote, instead of reading every
        manifest of the table (that grows with each append). ``None`` when that does not apply
        (first write here, another writer in between, an overwrite, delete files, or totals that
        do not add up): then :meth:`manifest` reads them all. Same list, same checksum."""
        known = self._live.get(ident)
        summary = snapshot.summary
        if (
            parent is None
            or known is None
            or known[0] != parent.snapshot_id
            or summary is None
            or snapshot.parent_snapshot_id != parent.snapshot_id
            or summary.operation.value != "append"
        ):
            return None
        from pyiceberg.manifest import ManifestContent, ManifestEntryStatus  # noqa: PLC0415

        added = []
        for mf in snapshot.manifests(tbl.io):
            if mf.content != ManifestContent.DATA:
                return None  # delete files: let the scan decide what is live
            if mf.added_snapshot_id != snapshot.snapshot_id:
                continue  # the parent's manifests, unchanged
            for entry in mf.fetch_manifest_entry(tbl.io, discard_deleted=True):
                if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot.snapshot_id:
                    f = entry.data_file
                    added.append((f.file_path, int(f.file_size_in_bytes), int(f.record_count)))
        files = sorted([*known[1], *added])
        try:
            totals = int(summary.get("total-data-files")), int(summary.get("total-records"))
        except (TypeError, ValueError):
            return None
        if totals != (len(files), sum(f[2] for f in files)) or len(set(files)) != len(files):
            return None
        return files

    def read(
        self,
        location_uri: str,
        metadata: Mapping[str, Any],
        expected_checksum: str | None,
        columns: list[str] | None = None,
    ) -> pa.Table:
        parts = urlsplit(location_uri)
        if parts.netloc != self.catalog_name:
            raise TableDataError(
                f"{location_uri} lives in Iceberg catalog {parts.netloc!r}; this reader is configured for "
                f"{self.catalog_name!r}"
            )
        ns_text, _, table_name = parts.path.strip("/").rpartition("/")
        ident = tuple(metadata.get("identifier") or (*ns_text.split("."), table_name))
        snapshot_id = int(metadata.get("snapshot_id") or dict(parse_qsl(parts.query))["snapshot_id"])
        tbl = self.catalog.load_table(ident)
        if tbl.snapshot_by_id(snapshot_id) is None:
            raise ChecksumMismatch(f"{location_uri}: snapshot {snapshot_id} no longer exists (expired?)")
        files, checksum = self.manifest(tbl, snapshot_id)
        if expected_checksum is not None and checksum != expected_checksum:
            raise ChecksumMismatch(
                f"checksum mismatch for {location_uri}: expected {expected_checksum}, got {checksum}"
            )
        for path, size, _ in files:
            actual = len(tbl.io.new_input(path))
            if actual != size:
                raise ChecksumMismatch(f"{path}: {actual} bytes on storage, the snapshot records {size}")
        scan = tbl.scan(snapshot_id=snapshot_id, selected_fields=tuple(columns) if columns else ("*",))
        return scan.to_arrow()


# ------------------------------------------------------------------ publish / fetch


@dataclass
class Publication:
    """A registered table version."""

    resource: Resource
    write: TableWrite
    inputs: list[str] = field(default_factory=list)

    def ref(self) -> dict[str, Any]:
        """The reference a task result or an event carries (ResultRef fields + identity)."""
        out = {
            "uri": self.resource.uri,
            "urn": self.resource.urn,
            "resource_id": self.resource.resource_id,
            "version": self.resource.version,
            "store": self.write.storage_type,
            "format": self.write.format,
            "size": self.write.size,
            "checksum": self.write.checksum,
            "rows": self.write.rows,
            "schema_fingerprint": self.write.schema_fingerprint,
            "location": self.write.uri,
        }
        if self.write.format == FORMAT_ICEBERG:
            out["snapshot_id"] = self.write.metadata["snapshot_id"]
        if self.inputs:
            out["inputs"] = list(self.inputs)  # lineage, also shown by the Dagster translator
        return out


class TableStorage:
    """Writes tables and records them in the registry; reads them back through it."""

    def __init__(
        self,
        registry: RegistryClient,
        store: PayloadStore | str | None = None,
        *,
        iceberg: IcebergTables | None = None,
        layout: ObjectLayout = DEFAULT_LAYOUT,
        data_dir: str | os.PathLike[str] | None = None,
        region: str = "local",
    ):
        self.registry = registry
        self.data_dir = Path(data_dir) if data_dir else home_dir()
        if isinstance(store, PayloadStore):
            self.store = store
        elif store:
            self.store = open_payload_store(store)
        elif os.environ.get(PAYLOAD_STORE_ENV):  # one object store for payloads and tables
            self.store = open_payload_store(os.environ[PAYLOAD_STORE_ENV])
        else:
            self.store = FilePayloadStore(self.data_dir / "tables")
        self._iceberg = iceberg
        self.layout = layout
        self.region = region
        self._stores: dict[str, PayloadStore] = {}

    @property
    def iceberg(self) -> IcebergTables:
        if self._iceberg is None:
            self._iceberg = IcebergTables(data_dir=self.data_dir)
        return self._iceberg

    def object_key(self, loc: ResourceLocator, fmt: str, *, execution_id: str | None = None) -> str:
        from noetl_dagster.engine.events import uuid7  # noqa: PLC0415

        ext = {FORMAT_PARQUET: "parquet", FORMAT_ARROW: "arrow"}[fmt]
        rel = f"{loc.namespace}/{loc.type}/{loc.name}/{uuid7()}.{ext}"
        return self.layout.key(loc.tenant, loc.project, rel)

    def publish(
        self,
        data: Any,
        uri: str,
        *,
        format: str = FORMAT_PARQUET,
        mode: str = "append",
        partition_by: Any = None,
        compression: str | None = None,
        checksum: str | None = None,
        inputs: Iterable[str] = (),
        metadata: Mapping[str, Any] | None = None,
        kind: str | None = None,
        execution_id: str | None = None,
        step: str | None = None,
        task: str | None = None,
    ) -> Publication:
        """Write ``data`` as a new version of ``uri`` (unversioned: the registry numbers it).
        ``checksum``: the algorithm of a file's checksum (sha256 or blake3; None: the process
        default, ``$NOETL_CHECKSUM_ALGORITHM``); an Iceberg snapshot's manifest digest stays sha256."""
        fmt = normalize_format(format)
        loc = parse_locator(uri, require_version=False)
        table = to_arrow(data)
        if fmt == FORMAT_PARQUET:
            written = write_parquet(
                table,
                self.store,
                self.object_key(loc, fmt),
                compression=compression or "snappy",
                checksum=checksum,
            )
        elif fmt == FORMAT_ARROW:
            written = write_arrow_ipc(
                table,
                self.store,
                self.object_key(loc, fmt),
                compression="lz4" if compression is None else compression,
                checksum=checksum,
            )
        else:
            written = self.iceberg.write(table, loc, mode=mode, partition_by=partition_by)
        meta = {"content_type": CONTENT_TYPES[fmt], "columns": written.columns, **dict(metadata or {})}
        location = written.location()
        location["region"] = self.region
        inputs = list(inputs)
        resource = self.registry.register(
            loc.uri,
            kind=kind,
            locations=[location],
            metadata=meta,
            inputs=inputs,
            execution_id=execution_id,
            step=step,
            task=task,
        )
        return Publication(resource, written, inputs)

    def _store_for(self, uri: str) -> PayloadStore:
        # the adapter registry, as payload writes and replay use it; another bucket of the configured
        # store's kind reuses its connection (endpoint, credentials)
        try:
            return store_for_uri(uri, like=self.store, cache=self._stores)
        except ValueError as e:
            raise TableDataError(f"no payload adapter for {uri}: {e}") from None

    def read_plan(
        self,
        plan: AccessPlan,
        *,
        columns: list[str] | None = None,
        readers: Mapping[str, Reader] | None = None,
    ) -> pa.Table:
        """The version's table, verified. ``readers``: formats stored outside this layer (``ducklake``, a
        catalog the tool layer attaches), each ``(location, expected checksum, columns) -> table``."""
        location = plan.location
        if location is None:
            raise TableDataError(f"{plan.uri} has no location to read")
        fmt = location.format or ""
        if fmt == FORMAT_ICEBERG or location.storage_type == "iceberg":
            return self.iceberg.read(location.uri, location.metadata, plan.expected_checksum, columns)
        reader = (readers or {}).get(fmt)
        if reader is not None:
            return reader(location, plan.expected_checksum, columns)
        if fmt not in (FORMAT_PARQUET, FORMAT_ARROW):
            raise TableDataError(f"{plan.uri}: cannot read format {fmt!r} as a table")
        if not plan.expected_checksum:
            raise ChecksumMismatch(
                f"{plan.uri}: the registry records no checksum; refusing an unverified read"
            )
        data = self._store_for(location.uri).read_verified(location.uri, plan.expected_checksum)
        return read_file_table(data, fmt, columns)

    def fetch(
        self,
        uri: str,
        *,
        as_type: str = "arrow",
        columns: list[str] | None = None,
        region: str | None = None,
        readers: Mapping[str, Reader] | None = None,
    ) -> tuple[Any, AccessPlan]:
        """Resolve ``uri`` (no version or ``@latest``: the newest), read, verify, convert."""
        plan = self.registry.resolve(uri, purpose="read", region=region or self.region)
        return convert(self.read_plan(plan, columns=columns, readers=readers), as_type), plan
