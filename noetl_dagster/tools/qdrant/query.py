"""Filters (Qdrant JSON or the shorthand) and nearest-neighbour queries."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
from qdrant_client import models

from noetl_dagster.tools.qdrant.client import (
    _NATIVE_FILTER_KEYS,
    ORIGINAL_ID_KEY,
    SharedClient,
    translate_error,
)
from noetl_dagster.tools.qdrant.collection import CollectionInfo, collection_dimension
from noetl_dagster.tools.qdrant.points import _vector, point_id
from noetl_dagster.tools.registry import ToolError

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
