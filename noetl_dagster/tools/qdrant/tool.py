"""The ``kind: qdrant`` tool: operations dispatched on one shared client."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qdrant_client import models

from noetl_dagster.tools.configs import QdrantConfig
from noetl_dagster.tools.credentials import lookup_credential
from noetl_dagster.tools.qdrant.client import (
    DEFAULT_BATCH,
    KIND,
    OPERATIONS,
    SharedClient,
    shared_client,
    translate_error,
)
from noetl_dagster.tools.qdrant.collection import collection_exists, collection_info, create_collection
from noetl_dagster.tools.qdrant.points import count_points, to_points, upsert_points
from noetl_dagster.tools.qdrant.query import _ids, _payload_selector, _point_out, build_filter, query_points
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool

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
    from noetl_dagster.tools.qdrant.embeddings import EmbeddingError, get_embedder

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
    config=QdrantConfig,
    description="Vector collections on Qdrant: create | upsert | query | delete; result {points | hits, count}",
)
