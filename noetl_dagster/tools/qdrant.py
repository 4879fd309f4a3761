"""``kind: qdrant``: vector collections on Qdrant through qdrant-client.

Connection (first that applies):
- ``url`` (+ ``api_key``), or ``auth: <credential>`` whose record has ``url`` and
  ``api_key`` (aliases ``key``, ``token``): a Qdrant server;
- ``path``: qdrant-client local mode, on disk; relative paths resolve against the
  execution's data directory; the default is ``<data_dir>/qdrant``.

Local mode lets one client open a path at a time (a second one, even in the same
process, fails), so clients are shared per process: :func:`shared_client` keeps
one per path (and one per server URL + key), and the tool, the Dagster
``QdrantResource`` and the Qdrant IO manager all go through it. Calls on a local
client are serialised by a lock (its in-memory index is not thread-safe).

Operations (``operation``, default ``query`` when a ``vector``/``text`` is given,
else ``upsert`` when points are given):

- ``create``: ``collection``, ``dimension`` (alias ``size``), ``distance``
  (cosine | dot | euclid | manhattan; default cosine), ``if_exists``
  (``ok`` default: keep it but require the same dimension | ``recreate`` | ``error``).
  Result ``{collection, operation, created, dimension, distance, count}``.
- ``upsert``: points from ``points`` | ``records`` | ``input`` | ``data``: a list
  of ``{id, vector, payload}`` (without ``payload``, the other keys are the
  payload), an Arrow table with a vector column (``vector_column``, default
  ``vector``; ``id_column``, default ``id``; other columns are the payload), a
  ``{rows: [...]}`` result, or a ``$ref`` to either; or ``vectors`` + ``payloads``
  + ``ids`` lists. Ids are unsigned integers or UUIDs; any other string id maps
  to a stable UUID (uuid5) and is kept in the payload as ``_id`` (hits report it
  as their ``id``), so re-upserting the same records replaces them.
  ``embedding`` (e.g. ``{model: hashing, dim: 384}``) embeds a record's
  ``text`` (``text_field``) when it has no vector. ``create_if_missing: true``
  creates the collection with the data's dimension and ``distance``.
  Result ``{collection, operation, count, points_count}``.
- ``query``: ``vector`` (or ``text`` with ``embedding``), ``limit`` (10),
  ``filter``, ``with_payload`` (true), ``with_vectors`` (false),
  ``score_threshold``, ``offset``. Uses ``query_points``.
  Result ``{collection, operation, hits: [{id, score, payload}], count}``.
- ``delete``: ``ids`` and/or ``filter`` (one is required). Result
  ``{collection, operation, count (deleted), points_count}``.
- ``retrieve``: ``ids`` -> ``{points, count}``; ``scroll``: ``filter``, ``limit``,
  ``offset`` -> ``{points, count, next_offset}``; ``count``: ``filter`` -> ``{count}``;
  ``info`` -> ``{dimension, distance, count}``; ``drop`` removes the collection.

``filter`` is Qdrant's own filter JSON (``{must: [{key: city, match: {value: x}}]}``)
or a shorthand ``{field: value}`` (match), ``{field: [a, b]}`` (any of),
``{field: {gte: 1, lt: 5}}`` (range), ``{field: {any|except|text|value: ...}}``;
several fields must all match.

Errors are error outcomes: ``qdrant_not_found`` (missing collection),
``qdrant_dimension`` (vector of the wrong size), ``qdrant_unavailable`` (server
down or timing out; retryable), ``qdrant_locked`` (local path held by another
process; retryable), ``qdrant_bad_request``, ``qdrant_auth``, ``config_error``.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from noetl_dagster.tools.credentials import lookup_credential
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool

KIND = "qdrant"
DEFAULT_BATCH = 1024
ORIGINAL_ID_KEY = "_id"  # payload key holding a string id that is not a UUID
OPERATIONS = ("create", "upsert", "query", "delete", "retrieve", "scroll", "count", "info", "drop")
DISTANCES = {
    "cosine": models.Distance.COSINE,
    "dot": models.Distance.DOT,
    "euclid": models.Distance.EUCLID,
    "euclidean": models.Distance.EUCLID,
    "l2": models.Distance.EUCLID,
    "manhattan": models.Distance.MANHATTAN,
    "l1": models.Distance.MANHATTAN,
}
_ID_NAMESPACE = uuid.UUID("6f1c5a0e-3d7b-5b9e-9a57-8e0f6d0c4a11")
_NATIVE_FILTER_KEYS = {"must", "should", "must_not", "min_should"}
_HTTP_RETRYABLE = {408, 425, 429, 500, 502, 503, 504}


# -- shared clients --------------------------------------------------------------------


@dataclass
class SharedClient:
    """One qdrant-client per location per process, with the lock its calls take."""

    client: QdrantClient
    location: str  # "qdrant+file:///abs/path" or the server URL
    path: str | None = None
    url: str | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)
    # collection -> dimension, so a query does not ask for the collection first; kept up to date by
    # create/drop here, and refreshed before reporting a dimension mismatch (another client may change it)
    dims: dict[str, int] = field(default_factory=dict)

    @property
    def local(self) -> bool:
        return self.path is not None

    def location_uri(self, collection: str) -> str:
        """The physical address of one collection, as recorded in the registry."""
        if self.local:
            return f"qdrant+file://{self.path}?collection={collection}"
        scheme, _, rest = (self.url or "").partition("://")
        return f"qdrant+{scheme}://{rest.rstrip('/')}?collection={collection}"


_clients: dict[tuple[str, ...], SharedClient] = {}
_clients_lock = threading.Lock()


def _key_digest(api_key: str | None) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()[:16] if api_key else ""


def shared_client(
    *, path: str | os.PathLike[str] | None = None, url: str | None = None, api_key: str | None = None,
    timeout: int | None = None,
) -> SharedClient:  # fmt: skip
    """The process's client for a local path or a server (created on first use)."""
    if (path is None) == (url is None):
        raise ToolError("qdrant: give either a local `path` or a server `url`", kind="config_error")
    if path is not None:
        real = str(Path(path).expanduser().resolve())
        key: tuple[str, ...] = ("local", real)
    else:
        real = str(url).rstrip("/")
        key = ("server", real, _key_digest(api_key))
    with _clients_lock:
        hit = _clients.get(key)
        if hit is not None:
            return hit
        try:
            if path is not None:
                Path(real).mkdir(parents=True, exist_ok=True)
                client = QdrantClient(path=real)
                shared = SharedClient(client, f"qdrant+file://{real}", path=real)
            else:
                # no version probe at construction: it is a blocking request that only warns
                client = QdrantClient(url=real, api_key=api_key, timeout=timeout, check_compatibility=False)
                shared = SharedClient(client, real, url=real)
        except Exception as e:  # noqa: BLE001 - opening errors become tool errors
            raise translate_error(e, f"opening {real}") from None
        _clients[key] = shared
        return shared


def release_client(
    *, path: str | os.PathLike[str] | None = None, url: str | None = None, api_key: str | None = None
) -> bool:
    """Close and forget a shared client (frees a local path for another process)."""
    key: tuple[str, ...] = (
        ("local", str(Path(path).expanduser().resolve()))
        if path is not None
        else ("server", str(url).rstrip("/"), _key_digest(api_key))
    )
    with _clients_lock:
        shared = _clients.pop(key, None)
    if shared is None:
        return False
    with shared.lock:
        shared.client.close()
    return True


def release_all() -> None:
    with _clients_lock:
        items = list(_clients.values())
        _clients.clear()
    for shared in items:
        with shared.lock:
            shared.client.close()


# close while the interpreter can still import (qdrant-client's __del__ fails at shutdown)
atexit.register(release_all)


# -- errors -------------------------------------------------------------------------------


def translate_error(e: BaseException, what: str, collection: str | None = None) -> ToolError:
    """A qdrant-client exception as a clear, classified ToolError."""
    if isinstance(e, ToolError):
        return e
    where = f"collection {collection!r}" if collection else what
    if isinstance(e, ResponseHandlingException):  # no answer: connection refused, timeout, TLS
        cause = e.source if getattr(e, "source", None) is not None else e
        return ToolError(f"qdrant: server unreachable while {what}: {cause}", kind="qdrant_unavailable", retryable=True,
                         code="unavailable")  # fmt: skip
    if isinstance(e, UnexpectedResponse):
        status = e.status_code
        text = _response_message(e)
        if status == 404:
            return ToolError(f"qdrant: {where} does not exist ({text})", kind="qdrant_not_found", code=404)
        if status in (401, 403):
            return ToolError(f"qdrant: access denied while {what} (HTTP {status}); check the API key", kind="qdrant_auth",
                             code=status)  # fmt: skip
        if "dimension" in text.lower():
            return ToolError(f"qdrant: {where}: {text}", kind="qdrant_dimension", code=status)
        return ToolError(f"qdrant: {what} failed with HTTP {status}: {text}", kind="qdrant_server_error" if status >= 500 else "qdrant_bad_request",
                         retryable=status in _HTTP_RETRYABLE, code=status)  # fmt: skip
    if isinstance(e, RuntimeError) and "already accessed by another instance" in str(e):
        return ToolError(
            f"qdrant: the local storage at {what.removeprefix('opening ')} is open in another process; "
            "local mode allows one client per path — run the steps in one process or use a Qdrant server",
            kind="qdrant_locked",
            retryable=True,
            code="locked",
        )
    msg = str(e)
    low = msg.lower()
    if isinstance(e, (KeyError, ValueError)) and "not found" in low and "collection" in low:
        return ToolError(f"qdrant: {where} does not exist", kind="qdrant_not_found", code=404)
    if "dimension" in low or "not aligned" in low:
        return ToolError(f"qdrant: {where}: {msg}", kind="qdrant_dimension", code=400)
    if isinstance(e, (ValueError, TypeError)):
        return ToolError(f"qdrant: {what}: {msg}", kind="qdrant_bad_request", code=400)
    if isinstance(e, (TimeoutError, ConnectionError, OSError)):
        return ToolError(
            f"qdrant: {what}: {type(e).__name__}: {msg}", kind="qdrant_unavailable", retryable=True
        )
    return ToolError(f"qdrant: {what}: {type(e).__name__}: {msg}", kind="qdrant_error")


def _response_message(e: UnexpectedResponse) -> str:
    try:
        body = json.loads(e.content)
        status = body.get("status") if isinstance(body, dict) else None
        if isinstance(status, dict) and status.get("error"):
            return str(status["error"])
    except Exception:  # noqa: BLE001 - fall back to the raw text
        pass
    return (e.content or b"").decode("utf-8", "replace")[:500] or (e.reason_phrase or "")


# -- collections ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CollectionInfo:
    name: str
    dimension: int
    distance: str
    points_count: int


def parse_distance(value: Any) -> models.Distance:
    if isinstance(value, models.Distance):
        return value
    key = str(value or "cosine").strip().lower()
    if key not in DISTANCES:
        raise ToolError(
            f"qdrant: unknown distance {value!r} (use cosine, dot, euclid or manhattan)", kind="config_error"
        )
    return DISTANCES[key]


def collection_info(shared: SharedClient, collection: str) -> CollectionInfo:
    with shared.lock:
        try:
            info = shared.client.get_collection(collection)
        except Exception as e:  # noqa: BLE001
            shared.dims.pop(collection, None)
            raise translate_error(e, f"reading collection {collection!r}", collection) from None
    vectors = info.config.params.vectors
    if isinstance(vectors, Mapping):  # named vectors: use the only (or first) one
        if not vectors:
            raise ToolError(
                f"qdrant: collection {collection!r} has no dense vectors", kind="qdrant_bad_request"
            )
        vectors = next(iter(vectors.values()))
    if vectors is None:
        raise ToolError(f"qdrant: collection {collection!r} has no dense vectors", kind="qdrant_bad_request")
    shared.dims[collection] = int(vectors.size)
    return CollectionInfo(
        collection, int(vectors.size), str(vectors.distance.value).lower(), int(info.points_count or 0)
    )


def collection_exists(shared: SharedClient, collection: str) -> bool:
    with shared.lock:
        try:
            return bool(shared.client.collection_exists(collection))
        except Exception as e:  # noqa: BLE001
            raise translate_error(e, f"looking up collection {collection!r}", collection) from None


def collection_dimension(shared: SharedClient, collection: str, *, refresh: bool = False) -> int:
    """The vector size of a collection (cached per shared client)."""
    if not refresh:
        dim = shared.dims.get(collection)
        if dim is not None:
            return dim
    return collection_info(shared, collection).dimension


def create_collection(
    shared: SharedClient, collection: str, dimension: int, distance: Any = "cosine", *, if_exists: str = "ok"
) -> tuple[CollectionInfo, bool]:
    """Create a collection; (info, created). ``if_exists``: ok | recreate | error."""
    if not isinstance(dimension, int) or isinstance(dimension, bool) or dimension < 1:
        raise ToolError(
            f"qdrant: dimension must be a positive integer, got {dimension!r}", kind="config_error"
        )
    if if_exists not in ("ok", "recreate", "error"):
        raise ToolError(
            f"qdrant: if_exists must be ok, recreate or error, got {if_exists!r}", kind="config_error"
        )
    dist = parse_distance(distance)
    with shared.lock:
        try:
            exists = shared.client.collection_exists(collection)
            if exists and if_exists == "recreate":
                shared.dims.pop(collection, None)
                shared.client.delete_collection(collection)
                exists = False
            if not exists:
                shared.client.create_collection(
                    collection, vectors_config=models.VectorParams(size=dimension, distance=dist)
                )
                shared.dims[collection] = dimension
                return CollectionInfo(collection, dimension, str(dist.value).lower(), 0), True
        except ToolError:
            raise
        except Exception as e:  # noqa: BLE001
            raise translate_error(e, f"creating collection {collection!r}", collection) from None
    if if_exists == "error":
        raise ToolError(f"qdrant: collection {collection!r} already exists", kind="qdrant_exists", code=409)
    info = collection_info(shared, collection)
    if info.dimension != dimension:
        raise ToolError(
            f"qdrant: collection {collection!r} exists with dimension {info.dimension}, not {dimension} "
            "(use if_exists: recreate to replace it)",
            kind="qdrant_dimension",
        )
    return info, False


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
    ref = ResultRef.from_dict(value["$ref"])
    if ref.format == "arrow":
        import pyarrow as pa

        return pa.ipc.open_file(pa.BufferReader(store.get_verified(ref))).read_all()
    return store.get_json(ref)


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


# -- filters --------------------------------------------------------------------------------------


def build_filter(spec: Any) -> models.Filter | None:
    """Qdrant filter JSON or the shorthand documented in the module docstring."""
    if spec is None or spec == {} or spec == "":
        return None
    if isinstance(spec, models.Filter):
        return spec
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError:
            raise ToolError(
                f"qdrant: filter must be a mapping (or its JSON), got {spec!r}", kind="config_error"
            ) from None
    if not isinstance(spec, Mapping):
        raise ToolError(f"qdrant: filter must be a mapping, got {type(spec).__name__}", kind="config_error")
    try:
        if set(spec) & _NATIVE_FILTER_KEYS:
            return models.Filter.model_validate(dict(spec))
        return models.Filter(must=[_condition(str(k), v) for k, v in spec.items()])
    except ToolError:
        raise
    except Exception as e:  # noqa: BLE001 - pydantic validation
        raise ToolError(
            f"qdrant: invalid filter {json.dumps(spec, default=str)[:300]}: {e}", kind="config_error"
        ) from None


_RANGE_KEYS = {"gt", "gte", "lt", "lte"}


def _condition(key: str, value: Any) -> models.FieldCondition:
    if isinstance(value, bool) or isinstance(value, (int, str)):
        return models.FieldCondition(key=key, match=models.MatchValue(value=value))
    if isinstance(value, (list, tuple)):
        return models.FieldCondition(key=key, match=models.MatchAny(any=list(value)))
    if isinstance(value, Mapping):
        ops = set(value)
        if ops and ops <= _RANGE_KEYS:
            return models.FieldCondition(key=key, range=models.Range(**dict(value)))
        if len(ops) == 1:
            op, arg = next(iter(value.items()))
            if op == "any":
                return models.FieldCondition(key=key, match=models.MatchAny(any=list(arg)))
            if op == "except":
                return models.FieldCondition(key=key, match=models.MatchExcept(**{"except": list(arg)}))
            if op == "text":
                return models.FieldCondition(key=key, match=models.MatchText(text=str(arg)))
            if op == "value":
                return models.FieldCondition(key=key, match=models.MatchValue(value=arg))
    raise ToolError(
        f"qdrant: filter on {key!r}: use a value, a list, {{gt|gte|lt|lte: n}} or {{any|except|text|value: ...}}, got {value!r}",
        kind="config_error",
    )


# -- queries --------------------------------------------------------------------------------------


def _point_out(point: Any, *, score: bool, with_payload: Any, with_vectors: bool) -> dict[str, Any]:
    payload = dict(point.payload or {})
    original = payload.pop(ORIGINAL_ID_KEY, None)
    out: dict[str, Any] = {"id": original if original is not None else point.id}
    if score:
        out["score"] = float(point.score)
    if with_payload is not False:
        out["payload"] = payload
    if with_vectors and point.vector is not None:
        vec = point.vector
        out["vector"] = vec.tolist() if isinstance(vec, np.ndarray) else vec
    return out


def _payload_selector(with_payload: Any) -> Any:
    # the original string id lives in the payload: always fetch it
    if with_payload is False:
        return [ORIGINAL_ID_KEY]
    if isinstance(with_payload, (list, tuple)):
        return [*with_payload, ORIGINAL_ID_KEY]
    return True


def query_points(
    shared: SharedClient, collection: str, vector: Any, *, limit: int = 10, flt: Any = None, with_payload: Any = True,
    with_vectors: bool = False, score_threshold: float | None = None, offset: int | None = None,
    info: CollectionInfo | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    vec = _vector(vector, "query")
    expected = info.dimension if info is not None else collection_dimension(shared, collection)
    if len(vec) != expected and info is None:
        expected = collection_dimension(shared, collection, refresh=True)
    if len(vec) != expected:
        raise ToolError(
            f"qdrant: collection {collection!r} expects query vectors of dimension {expected}, got {len(vec)}",
            kind="qdrant_dimension",
        )
    with shared.lock:
        try:
            res = shared.client.query_points(
                collection,
                query=vec,
                query_filter=build_filter(flt),
                limit=int(limit),
                offset=offset,
                with_payload=_payload_selector(with_payload),
                with_vectors=bool(with_vectors),
                score_threshold=score_threshold,
            )
        except ToolError:
            raise
        except Exception as e:  # noqa: BLE001
            err = translate_error(e, f"querying {collection!r}", collection)
            if err.kind == "qdrant_not_found":
                shared.dims.pop(collection, None)
            raise err from None
    return [
        _point_out(p, score=True, with_payload=with_payload, with_vectors=with_vectors) for p in res.points
    ]


def _ids(value: Any) -> list[int | str]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        value = [value]
    return [point_id(v)[0] for v in value]


# -- the tool -------------------------------------------------------------------------------------


def _client_for(inputs: Mapping[str, Any], ctx: ToolContext) -> SharedClient:
    url = inputs.get("url")
    api_key = inputs.get("api_key")
    timeout = inputs.get("timeout")
    auth = inputs.get("auth") or inputs.get("credential")
    if auth:
        if isinstance(auth, Mapping):
            record = dict(auth)
        else:
            record = lookup_credential(ctx, str(auth), KIND)
        url = url or record.get("url") or record.get("endpoint") or record.get("host")
        api_key = api_key or record.get("api_key") or record.get("key") or record.get("token")
        if not url and record.get("path"):
            return shared_client(path=_resolve_path(record["path"], ctx))
        if not url:
            raise ToolError(f"qdrant: credential {auth!r} has no url (or path)", kind="config_error")
    if isinstance(api_key, str) and api_key:
        ctx.redact(api_key)
    if url:
        return shared_client(url=str(url), api_key=api_key, timeout=int(timeout) if timeout else None)
    return shared_client(path=_resolve_path(inputs.get("path"), ctx))


def data_dir_of(ctx: Any) -> Path:
    explicit = getattr(ctx, "data_dir", None)
    return Path(explicit or os.environ.get("NOETL_DAGSTER_HOME", ".noetl"))


def _resolve_path(path: Any, ctx: ToolContext) -> Path:
    if path in (None, ""):
        return data_dir_of(ctx) / "qdrant"
    p = Path(str(path).removeprefix("file://")).expanduser()
    return p if p.is_absolute() else data_dir_of(ctx) / p


def _source(inputs: Mapping[str, Any]) -> Any:
    for key in ("points", "records", "input", "data"):
        if inputs.get(key) is not None:
            value = inputs[key]
            # a step `input:` mapping that wraps the records
            if (
                key == "input"
                and isinstance(value, Mapping)
                and not {"points", "records", "rows", "$ref"} & set(value)
            ):
                if "data" in value:
                    return value["data"]
            return value
    if inputs.get("vectors") is not None:
        vectors = inputs["vectors"]
        ids = inputs.get("ids")
        if ids is None:
            raise ToolError("qdrant: `vectors` need `ids` (one per vector)", kind="config_error")
        payloads = inputs.get("payloads") or [{} for _ in vectors]
        if not (len(vectors) == len(ids) == len(payloads)):
            raise ToolError(f"qdrant: vectors ({len(vectors)}), ids ({len(ids)}) and payloads ({len(payloads)}) differ in length",
                            kind="config_error")  # fmt: skip
        return [{"id": i, "vector": v, "payload": p} for i, v, p in zip(ids, vectors, payloads, strict=True)]
    return None


def _embedder(inputs: Mapping[str, Any]) -> Any:
    spec = inputs.get("embedding") or inputs.get("embedder")
    if spec is None:
        return None
    from noetl_dagster.tools.embeddings import EmbeddingError, get_embedder

    try:
        return get_embedder(spec)
    except EmbeddingError as e:
        raise ToolError(f"qdrant: {e}", kind="config_error") from None


def _int(inputs: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = inputs.get(key, default)
    if value is None:
        return None
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ToolError(f"qdrant: {key} must be an integer, got {value!r}", kind="config_error") from None
    if out < 0:
        raise ToolError(f"qdrant: {key} must be >= 0, got {out}", kind="config_error")
    return out


def qdrant_tool(inputs: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Vector collections on Qdrant: create | upsert | query | delete (and retrieve, scroll, count, info, drop)."""
    collection = inputs.get("collection") or inputs.get("collection_name")
    if not isinstance(collection, str) or not collection:
        raise ToolError("qdrant: `collection` is required", kind="config_error")
    op = inputs.get("operation") or inputs.get("op")
    if op is None:
        op = "query" if (inputs.get("vector") is not None or inputs.get("text") is not None) else "upsert"
    op = str(op).lower()
    if op not in OPERATIONS:
        raise ToolError(
            f"qdrant: unknown operation {op!r} (use {', '.join(OPERATIONS)})", kind="config_error"
        )
    shared = _client_for(inputs, ctx)
    out: dict[str, Any] = {"collection": collection, "operation": op}

    if op == "create":
        dim = inputs.get("dimension", inputs.get("size", inputs.get("dim")))
        if dim is None and inputs.get("embedding") is not None:
            dim = _embedder(inputs).dim
        if dim is None:
            raise ToolError("qdrant: create needs `dimension` (or `embedding`)", kind="config_error")
        dimension = _int({"dimension": dim}, "dimension", None) or 0
        info, created = create_collection(shared, collection, dimension, inputs.get("distance"),
                                          if_exists=str(inputs.get("if_exists", "ok")))  # fmt: skip
        out.update(created=created, dimension=info.dimension, distance=info.distance, count=info.points_count)
        return out

    if op == "drop":
        with shared.lock:
            try:
                shared.dims.pop(collection, None)
                dropped = bool(shared.client.delete_collection(collection))
            except Exception as e:  # noqa: BLE001
                raise translate_error(e, f"dropping {collection!r}", collection) from None
        out.update(dropped=dropped)
        return out

    if op == "upsert":
        embedder = _embedder(inputs)
        source = _source(inputs)
        if source is None:
            raise ToolError(
                "qdrant: upsert needs points (`points`, `records`, `input` or `data`)", kind="config_error"
            )
        points = to_points(source, ctx=ctx, embedder=embedder, options=inputs)
        info = None
        if inputs.get("create_if_missing"):
            if not collection_exists(shared, collection):
                dim = points.dimension() or (embedder.dim if embedder else None)
                if dim is None:
                    raise ToolError(
                        "qdrant: cannot create a collection from zero points; give `dimension`",
                        kind="config_error",
                    )
                info, _ = create_collection(shared, collection, dim, inputs.get("distance"))
        info = info or collection_info(shared, collection)
        n = upsert_points(
            shared,
            collection,
            points,
            batch_size=_int(inputs, "batch_size", DEFAULT_BATCH) or DEFAULT_BATCH,
            info=info,
        )
        out.update(count=n, points_count=count_points(shared, collection))
        return out

    if op == "query":
        vector = inputs.get("vector", inputs.get("query_vector"))
        if vector is None and inputs.get("text") is not None:
            embedder = _embedder(inputs)
            if embedder is None:
                raise ToolError(
                    "qdrant: query by `text` needs `embedding` (the embedder used for the documents)",
                    kind="config_error",
                )
            vector = embedder.embed([str(inputs["text"])])[0]
        if vector is None:
            raise ToolError("qdrant: query needs `vector` (or `text` with `embedding`)", kind="config_error")
        hits = query_points(
            shared,
            collection,
            vector,
            limit=_int(inputs, "limit", 10) or 10,
            flt=inputs.get("filter"),
            with_payload=inputs.get("with_payload", True),
            with_vectors=bool(inputs.get("with_vectors", False)),
            score_threshold=inputs.get("score_threshold"),
            offset=_int(inputs, "offset", None),
        )
        out.update(hits=hits, count=len(hits))
        return out

    flt = build_filter(inputs.get("filter"))
    if op == "count":
        out.update(count=count_points(shared, collection, flt))
        return out
    if op == "info":
        info = collection_info(shared, collection)
        out.update(dimension=info.dimension, distance=info.distance, count=info.points_count)
        return out

    collection_info(shared, collection)  # a clear "does not exist" before anything else
    if op == "delete":
        ids = _ids(inputs.get("ids", inputs.get("id")))
        if not ids and flt is None:
            raise ToolError("qdrant: delete needs `ids` or a `filter` (use operation: drop to remove the collection)",
                            kind="config_error")  # fmt: skip
        before = count_points(shared, collection)
        with shared.lock:
            try:
                if ids:
                    shared.client.delete(
                        collection, points_selector=models.PointIdsList(points=ids), wait=True
                    )
                if flt is not None:
                    shared.client.delete(
                        collection, points_selector=models.FilterSelector(filter=flt), wait=True
                    )
            except Exception as e:  # noqa: BLE001
                raise translate_error(e, f"deleting from {collection!r}", collection) from None
        after = count_points(shared, collection)
        out.update(count=before - after, points_count=after)
        return out

    with_payload = inputs.get("with_payload", True)
    with_vectors = bool(inputs.get("with_vectors", False))
    with shared.lock:
        try:
            if op == "retrieve":
                pts = shared.client.retrieve(collection, ids=_ids(inputs.get("ids", inputs.get("id"))),
                                             with_payload=_payload_selector(with_payload), with_vectors=with_vectors)  # fmt: skip
                next_offset = None
            else:  # scroll
                pts, next_offset = shared.client.scroll(
                    collection, scroll_filter=flt, limit=_int(inputs, "limit", 10) or 10, offset=inputs.get("offset"),
                    with_payload=_payload_selector(with_payload), with_vectors=with_vectors,
                )  # fmt: skip
        except Exception as e:  # noqa: BLE001
            raise translate_error(e, f"reading points of {collection!r}", collection) from None
    points_out = [
        _point_out(p, score=False, with_payload=with_payload, with_vectors=with_vectors) for p in pts
    ]
    out.update(points=points_out, count=len(points_out))
    if op == "scroll":
        out["next_offset"] = next_offset
    return out


register_tool(
    KIND,
    qdrant_tool,
    description="Vector collections on Qdrant: create | upsert | query | delete; result {points | hits, count}",
)
