"""Points from records, Arrow tables and references; ids; batched upserts."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from qdrant_client import models

from noetl_dagster.tools.qdrant.client import (
    _ID_NAMESPACE,
    DEFAULT_BATCH,
    ORIGINAL_ID_KEY,
    SharedClient,
    translate_error,
)
from noetl_dagster.tools.qdrant.collection import CollectionInfo, collection_dimension
from noetl_dagster.tools.registry import ToolContext, ToolError

# -- points --------------------------------------------------------------------------------------


def point_id(value: Any) -> tuple[int | str, str | None]:
    """(Qdrant id, original string id kept in the payload or None)."""
    if isinstance(value, bool):
        raise ToolError(
            f"qdrant: point id must be an unsigned integer or a string, got {value!r}", kind="config_error"
        )
    if isinstance(value, (int, np.integer)):
        if value < 0:
            raise ToolError(f"qdrant: point id must be >= 0, got {value}", kind="config_error")
        return int(value), None
    if isinstance(value, uuid.UUID):
        return str(value), None
    if isinstance(value, str) and value:
        if value.isdigit():
            return int(value), None
        try:
            return str(uuid.UUID(value)), None
        except ValueError:
            return str(uuid.uuid5(_ID_NAMESPACE, value)), value
    raise ToolError(
        f"qdrant: point id must be an unsigned integer or a non-empty string, got {value!r}",
        kind="config_error",
    )


@dataclass
class PointSet:
    """Points ready to upsert: ids, vectors (list of lists or a 2-D array) and payloads."""

    ids: list[int | str]
    vectors: Any
    payloads: list[dict[str, Any]]

    def __len__(self) -> int:
        return len(self.ids)

    def dimension(self) -> int | None:
        if isinstance(self.vectors, np.ndarray):
            return int(self.vectors.shape[1]) if self.vectors.ndim == 2 and len(self.vectors) else None
        return len(self.vectors[0]) if self.vectors else None

    def check_dimension(self, expected: int, collection: str) -> None:
        if isinstance(self.vectors, np.ndarray):
            if self.vectors.ndim != 2 or (len(self.vectors) and self.vectors.shape[1] != expected):
                raise ToolError(
                    f"qdrant: collection {collection!r} expects vectors of dimension {expected}, got {self.vectors.shape[-1]}",
                    kind="qdrant_dimension",
                )
            return
        for i, vec in enumerate(self.vectors):
            if len(vec) != expected:
                raise ToolError(
                    f"qdrant: collection {collection!r} expects vectors of dimension {expected}; "
                    f"point {i} (id {self.ids[i]!r}) has {len(vec)}",
                    kind="qdrant_dimension",
                )

    def batches(self, size: int) -> Iterator[models.Batch]:
        for start in range(0, len(self.ids), size):
            vecs = self.vectors[start : start + size]
            if isinstance(vecs, np.ndarray):
                vecs = vecs.tolist()
            yield models.Batch(
                ids=self.ids[start : start + size], vectors=vecs, payloads=self.payloads[start : start + size]
            )


def _vector(value: Any, where: str) -> list[float]:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return value if isinstance(value, list) else list(value)
    raise ToolError(
        f"qdrant: {where}: vector must be a list of numbers, got {type(value).__name__}", kind="config_error"
    )


def points_from_records(
    records: Sequence[Mapping[str, Any]], *, embedder: Any = None, text_field: str = "text", id_field: str = "id",
    vector_field: str = "vector",
) -> PointSet:  # fmt: skip
    ids: list[int | str] = []
    vectors: list[Any] = []
    payloads: list[dict[str, Any]] = []
    to_embed: list[int] = []
    for i, rec in enumerate(records):
        if not isinstance(rec, Mapping):
            raise ToolError(
                f"qdrant: point {i} must be a mapping with id and vector, got {type(rec).__name__}",
                kind="config_error",
            )
        if id_field not in rec:
            raise ToolError(
                f"qdrant: point {i} has no {id_field!r}; every point needs an id so that re-upserting replaces it",
                kind="config_error",
            )
        pid, original = point_id(rec[id_field])
        if "payload" in rec:
            payload = rec["payload"]
            if payload is None:
                payload = {}
            if not isinstance(payload, Mapping):
                raise ToolError(f"qdrant: point {i}: payload must be a mapping", kind="config_error")
            payload = dict(payload)
        else:
            payload = {k: v for k, v in rec.items() if k not in (id_field, vector_field)}
        if original is not None:
            payload[ORIGINAL_ID_KEY] = original
        vec = rec.get(vector_field)
        if vec is None:
            if embedder is None:
                raise ToolError(
                    f"qdrant: point {i} (id {rec[id_field]!r}) has no {vector_field!r} "
                    "(give vectors, or `embedding` to embed a text field)",
                    kind="config_error",
                )
            text = rec.get(text_field, payload.get(text_field))
            if not isinstance(text, str):
                raise ToolError(
                    f"qdrant: point {i} has neither a vector nor a {text_field!r} text to embed",
                    kind="config_error",
                )
            to_embed.append(i)
            vectors.append(text)
        else:
            vectors.append(_vector(vec, f"point {i}"))
        ids.append(pid)
        payloads.append(payload)
    if to_embed:
        embedded = embedder.embed([vectors[i] for i in to_embed])
        for j, i in enumerate(to_embed):
            vectors[i] = embedded[j].tolist()
    return PointSet(ids, vectors, payloads)


def points_from_arrow(table: Any, *, vector_column: str = "vector", id_column: str = "id") -> PointSet:
    import pyarrow as pa

    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    if vector_column not in table.column_names:
        raise ToolError(
            f"qdrant: the Arrow table has no vector column {vector_column!r} (columns: {', '.join(table.column_names)})",
            kind="config_error",
        )
    if id_column not in table.column_names:
        raise ToolError(f"qdrant: the Arrow table has no id column {id_column!r}", kind="config_error")
    col = table.column(vector_column).combine_chunks()
    n = table.num_rows
    if pa.types.is_fixed_size_list(col.type):
        dim = col.type.list_size
        vectors = col.flatten().to_numpy(zero_copy_only=False).reshape(n, dim)
    elif pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        lengths = col.value_lengths().to_numpy(zero_copy_only=False)
        if n and (lengths != lengths[0]).any():
            bad = int(np.argmax(lengths != lengths[0]))
            raise ToolError(f"qdrant: vectors in column {vector_column!r} differ in length (row 0: {lengths[0]}, row {bad}: {lengths[bad]})",
                            kind="qdrant_dimension")  # fmt: skip
        dim = int(lengths[0]) if n else 0
        vectors = col.flatten().to_numpy(zero_copy_only=False).reshape(n, dim)
    else:
        raise ToolError(
            f"qdrant: column {vector_column!r} must be a list of floats, got {col.type}", kind="config_error"
        )
    raw_ids = table.column(id_column).to_pylist()
    ids: list[int | str] = []
    originals: list[str | None] = []
    for v in raw_ids:
        pid, original = point_id(v)
        ids.append(pid)
        originals.append(original)
    payloads = table.drop_columns([vector_column, id_column]).to_pylist()
    for payload, original in zip(payloads, originals, strict=True):
        if original is not None:
            payload[ORIGINAL_ID_KEY] = original
    return PointSet(ids, vectors, payloads)


def _is_arrow(value: Any) -> bool:
    mod = type(value).__module__
    return mod.startswith("pyarrow") and type(value).__name__ in ("Table", "RecordBatch")


def _load_ref(value: Any, ctx: ToolContext | None) -> Any:
    from noetl_dagster.storage.payload import ResultRef, is_ref

    if not is_ref(value):
        return value
    store = getattr(ctx, "payloads", None) if ctx is not None else None
    if store is None:
        raise ToolError(
            "qdrant: cannot read a $ref input without the execution's payload store", kind="config_error"
        )
    from noetl_dagster.storage.locator import RefRefused, read_for
    from noetl_dagster.util.jsonutil import loads

    ref = ResultRef.from_dict(value["$ref"])
    try:
        data = read_for(ctx, ref, store)  # the locator: this execution's tenant, or a grant
    except RefRefused as e:
        raise ToolError(f"qdrant: {e}", kind="reference_refused") from None
    if ref.format == "arrow":
        import pyarrow as pa

        return pa.ipc.open_file(pa.BufferReader(data)).read_all()
    return loads(data)


def to_points(
    source: Any,
    *,
    ctx: ToolContext | None = None,
    embedder: Any = None,
    options: Mapping[str, Any] | None = None,
) -> PointSet:
    """Accept every input shape the tool documents and return a PointSet."""
    opts = options or {}
    source = _load_ref(source, ctx)
    if isinstance(source, PointSet):
        return source
    if _is_arrow(source):
        return points_from_arrow(
            source, vector_column=opts.get("vector_column", "vector"), id_column=opts.get("id_column", "id")
        )
    if isinstance(source, Mapping):
        for key in ("points", "records", "rows", "results"):
            if key in source:
                return to_points(source[key], ctx=ctx, embedder=embedder, options=options)
        raise ToolError("qdrant: points must be a list of records or an Arrow table, got a mapping without points/records/rows",
                        kind="config_error")  # fmt: skip
    if isinstance(source, str):
        raise ToolError(
            "qdrant: points must be a list of records or an Arrow table, got a string", kind="config_error"
        )
    if isinstance(source, Sequence):
        return points_from_records(
            source,
            embedder=embedder,
            text_field=opts.get("text_field", "text"),
            id_field=opts.get("id_column", "id"),
            vector_field=opts.get("vector_column", "vector"),
        )
    raise ToolError(
        f"qdrant: points must be a list of records or an Arrow table, got {type(source).__name__}",
        kind="config_error",
    )


def upsert_points(shared: SharedClient, collection: str, points: PointSet, *, batch_size: int = DEFAULT_BATCH,
                  info: CollectionInfo | None = None) -> int:  # fmt: skip
    """Upsert after checking the dimension; returns the number of points written."""
    if not len(points):
        return 0
    if info is not None:
        points.check_dimension(info.dimension, collection)
    else:
        try:
            points.check_dimension(collection_dimension(shared, collection), collection)
        except ToolError:
            points.check_dimension(collection_dimension(shared, collection, refresh=True), collection)
    with shared.lock:
        try:
            for batch in points.batches(batch_size):
                shared.client.upsert(collection, points=batch, wait=True)
        except Exception as e:  # noqa: BLE001
            raise translate_error(e, f"upserting into {collection!r}", collection) from None
    return len(points)


def count_points(shared: SharedClient, collection: str, flt: models.Filter | None = None) -> int:
    with shared.lock:
        try:
            return int(shared.client.count(collection, count_filter=flt, exact=True).count)
        except Exception as e:  # noqa: BLE001
            raise translate_error(e, f"counting {collection!r}", collection) from None
