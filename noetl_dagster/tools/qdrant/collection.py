"""Collections: create, inspect, count."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qdrant_client import models

from noetl_dagster.tools.qdrant.client import DISTANCES, SharedClient, translate_error
from noetl_dagster.tools.registry import ToolError

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
