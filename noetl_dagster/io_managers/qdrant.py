"""Qdrant IO manager: an op output of vectors becomes a registered ``index`` resource.

Writing: the output (a list of ``{id, vector, payload}`` records, an Arrow table
with a vector column, or ``{points|records: …}``) is upserted into a collection
named after its ``noetl://<tenant>/<project>/<namespace>/index/<name>@<version>``
URI, and that version is registered in the NoETL registry as an ``index``
resource with ``dimension``, ``distance``, ``points``, ``collection`` and
``location`` (``qdrant+file:///…?collection=…`` or ``qdrant+http(s)://…?collection=…``).

Which URI: ``metadata={"noetl/uri": "noetl://t/p/ns/index/name[@version]"}`` on the
asset or output; else the asset key (``[tenant, project, namespace, *name]`` when
it starts with the registry scope, otherwise ``<namespace>/index/<key joined by '/'>``);
op outputs without an asset key get ``<namespace>/index/runs/<run_id>/<step>/<output>``.
Without a version the registry numbers it (``v1``, ``v2``…) and the collection
gets a fresh id; with a version, re-materialising upserts into the same
collection, so re-sent points replace themselves by id.
``noetl/distance`` (default: the ``distance`` config) and ``noetl/embedding``
(the embedder spec, stored so readers can query by text) are read from the
output metadata.

Reading: the input's URI (``noetl/uri`` on the input, else the upstream output's)
is resolved through the registry — tenancy and grants apply, a cross-tenant read
without a grant is refused — and the op receives an :class:`IndexHandle` for
querying.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import dagster as dg
from pydantic import Field

from noetl_dagster.dsl.locator import InvalidLocator, ResourceLocator, parse_locator
from noetl_dagster.io_managers.base import META_URI, META_VERSION
from noetl_dagster.resources.qdrant import QdrantResource
from noetl_dagster.resources.registry import NoetlRegistryResource
from noetl_dagster.tools import qdrant as q
from noetl_registry.client import RegistryClient
from noetl_registry.models import AccessPlan, Resource

RESOURCE_TYPE = "index"
META_DISTANCE = "noetl/distance"
META_EMBEDDING = "noetl/embedding"
MAX_COLLECTION_NAME = 200

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class IndexError_(RuntimeError):  # noqa: N801 - IndexError is a builtin
    """A registered index cannot be opened (bad location, wrong resource type)."""


def collection_name(loc: ResourceLocator, unique: str | None = None) -> str:
    """A Qdrant collection name for one version of an index (stable for a given version)."""
    version = loc.version or unique
    if not version:
        raise ValueError("a collection name needs a version or a unique suffix")
    parts = [loc.tenant, loc.project, loc.namespace, loc.name.replace("/", "."), version]
    name = "__".join(_UNSAFE.sub("_", p) for p in parts)
    if len(name) > MAX_COLLECTION_NAME:
        import hashlib

        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        name = name[: MAX_COLLECTION_NAME - 18] + "__" + digest
    return name


def parse_location(uri: str) -> tuple[dict[str, str], str]:
    """``qdrant+file:///p?collection=c`` -> ({"path": "/p"}, "c"); ``qdrant+https://h?collection=c`` -> ({"url": ...}, "c")."""
    parts = urlsplit(uri)
    if not parts.scheme.startswith("qdrant+"):
        raise IndexError_(f"{uri!r} is not a Qdrant location (expected qdrant+file:// or qdrant+http(s)://)")
    collection = (parse_qs(parts.query).get("collection") or [""])[0]
    if not collection:
        raise IndexError_(f"Qdrant location {uri!r} names no collection (?collection=…)")
    transport = parts.scheme.removeprefix("qdrant+")
    if transport == "file":
        return {"path": unquote(parts.path)}, collection
    if transport in ("http", "https"):
        return {"url": f"{transport}://{parts.netloc}{parts.path}".rstrip("/")}, collection
    raise IndexError_(f"unknown Qdrant transport {transport!r} in {uri!r}")


@dataclass
class IndexHandle:
    """A registered vector index, opened for querying (what a downstream op receives)."""

    uri: str
    resource_id: str
    collection: str
    dimension: int
    distance: str
    points: int
    location: str
    embedding: Any
    shared: q.SharedClient

    @property
    def client(self) -> Any:
        return self.shared.client

    def _vector(self, vector: Any, text: str | None) -> Any:
        if vector is not None:
            return vector
        if text is None:
            raise ValueError("query needs a vector or a text")
        if self.embedding is None:
            raise ValueError(f"{self.uri} was registered without an embedder; query it with a vector")
        from noetl_dagster.tools.qdrant.embeddings import get_embedder

        return get_embedder(self.embedding).embed([text])[0]

    def query(self, vector: Any = None, *, text: str | None = None, limit: int = 10, filter: Any = None,
              with_payload: Any = True, with_vectors: bool = False,
              score_threshold: float | None = None) -> list[dict[str, Any]]:  # fmt: skip
        """Nearest points: ``[{id, score, payload}]`` (by vector, or by text with the stored embedder)."""
        return q.query_points(
            self.shared, self.collection, self._vector(vector, text), limit=limit, flt=filter,
            with_payload=with_payload, with_vectors=with_vectors, score_threshold=score_threshold,
        )  # fmt: skip

    def count(self, filter: Any = None) -> int:
        return q.count_points(self.shared, self.collection, q.build_filter(filter))

    def retrieve(self, ids: list[Any], *, with_vectors: bool = False) -> list[dict[str, Any]]:
        pids = [q.point_id(i)[0] for i in ids]
        with self.shared.lock:
            pts = self.shared.client.retrieve(
                self.collection, ids=pids, with_payload=True, with_vectors=with_vectors
            )
        return [q._point_out(p, score=False, with_payload=True, with_vectors=with_vectors) for p in pts]


# -- Dagster-free core (also used by the benchmark) ----------------------------------------------


def write_index(
    registry: RegistryClient,
    shared: q.SharedClient,
    uri: str,
    data: Any,
    *,
    distance: str = "cosine",
    embedding: Any = None,
    batch_size: int = q.DEFAULT_BATCH,
    metadata: Mapping[str, Any] | None = None,
    execution_id: str | None = None,
    step: str | None = None,
    task: str | None = None,
    region: str = "local",
) -> tuple[Resource, q.CollectionInfo]:
    """Upsert ``data`` into the collection of ``uri`` and register that version as an index."""
    from noetl_dagster.engine.events import uuid7

    loc = parse_locator(uri, require_version=False)
    if loc.type != RESOURCE_TYPE:
        raise InvalidLocator(
            f"{uri}: the Qdrant IO manager writes resources of type 'index', not {loc.type!r}"
        )
    points = q.to_points(data)
    collection = collection_name(loc, unique=uuid7().replace("-", "")[:20])
    dim = points.dimension()
    if dim is None:  # no points: only an existing version's collection can take them
        if not q.collection_exists(shared, collection):
            raise q.ToolError(f"{uri}: cannot create an index from zero points", kind="config_error")
        info = q.collection_info(shared, collection)
    else:
        info, _ = q.create_collection(shared, collection, dim, distance)
    q.upsert_points(shared, collection, points, batch_size=batch_size, info=info)
    total = q.count_points(shared, collection)
    location = shared.location_uri(collection)
    where = {"path": shared.path} if shared.local else {"url": shared.url}
    meta = {
        "dimension": info.dimension,
        "distance": info.distance,
        "points": total,
        "collection": collection,
        "location": location,
        "store_kind": "qdrant",
        **where,
        **({"embedding": embedding} if embedding is not None else {}),
        **dict(metadata or {}),
    }
    resource = registry.register(
        loc.uri,
        kind=RESOURCE_TYPE,
        locations=[
            {
                "uri": location,
                "storage_type": "qdrant",
                "format": "qdrant",
                "rows": total,
                "region": region,
                "metadata": {
                    "collection": collection,
                    "dimension": info.dimension,
                    "distance": info.distance,
                    **where,
                },
            }
        ],  # fmt: skip
        metadata=meta,
        execution_id=execution_id,
        step=step,
        task=task,
    )
    return resource, q.CollectionInfo(collection, info.dimension, info.distance, total)


def open_index(
    registry: RegistryClient, uri: str, *, qdrant: QdrantResource | None = None, region: str | None = None
) -> IndexHandle:
    """Resolve ``uri`` through the registry (grants apply) and open its collection."""
    plan: AccessPlan = registry.resolve(uri, purpose="read", region=region)
    if plan.kind != RESOURCE_TYPE:
        raise IndexError_(f"{plan.uri} is a {plan.kind!r} resource, not an index")
    if plan.location is None:
        raise IndexError_(f"{plan.uri} has no location")
    where, collection = parse_location(plan.location.uri)
    if "path" in where:
        shared = q.shared_client(path=where["path"])
    else:
        same = qdrant is not None and qdrant.url and qdrant.url.rstrip("/") == where["url"]
        # the reader's own key for the server named by the registry
        shared = q.shared_client(url=where["url"], api_key=qdrant.api_key if same and qdrant else None,
                                 timeout=qdrant.timeout if qdrant else None)  # fmt: skip
    meta = plan.metadata or {}
    return IndexHandle(
        uri=plan.uri,
        resource_id=plan.resource_id,
        collection=collection,
        dimension=int(meta.get("dimension") or q.collection_info(shared, collection).dimension),
        distance=str(meta.get("distance", "")),
        points=int(meta.get("points", plan.rows or 0)),
        location=plan.location.uri,
        embedding=meta.get("embedding"),
        shared=shared,
    )


# -- the IO manager -----------------------------------------------------------------------------


def _safe_segment(text: str) -> str:
    seg = _UNSAFE.sub("_", text).strip("._-") or "x"
    return seg if seg[0].isalnum() else "x" + seg


class QdrantIOManager(dg.ConfigurableIOManager):
    """Stores op outputs of vectors as Qdrant collections registered as ``index`` resources."""

    qdrant: QdrantResource = Field(default_factory=QdrantResource, description="where the collections live")
    registry: NoetlRegistryResource = Field(
        default_factory=NoetlRegistryResource,
        description="the NoETL registry every index version is recorded in",
    )
    namespace: str = Field(
        default="indexes", description="namespace for outputs whose URI/key does not name one"
    )
    distance: str = Field(
        default="cosine", description="cosine | dot | euclid | manhattan, unless noetl/distance says"
    )
    batch_size: int = Field(default=q.DEFAULT_BATCH, description="points per upsert call")
    region: str = Field(default="local", description="region recorded on locations and preferred on reads")

    @staticmethod
    def _meta(context: dg.OutputContext | dg.InputContext, key: str) -> Any:
        for source in (
            getattr(context, "output_metadata", None),
            getattr(context, "definition_metadata", None),
        ):
            if source and key in source:
                value = source[key]
                return getattr(value, "value", value)
        return None

    def _uri_for_key(self, asset_key: dg.AssetKey) -> str:
        tenant, project = self.registry.scope()
        path = list(asset_key.path)
        if len(path) >= 4 and path[0] == tenant and path[1] == project:
            return ResourceLocator(tenant, project, path[2], RESOURCE_TYPE, "/".join(path[3:])).uri
        return ResourceLocator(tenant, project, self.namespace, RESOURCE_TYPE, "/".join(path)).uri

    def output_uri(self, context: dg.OutputContext) -> str:
        explicit = self._meta(context, META_URI)
        if explicit:
            return parse_locator(explicit, require_version=False).uri
        if context.has_asset_key:
            return self._uri_for_key(context.asset_key)
        tenant, project = self.registry.scope()
        name = f"runs/{_safe_segment(context.run_id)}/{_safe_segment(context.step_key)}/{_safe_segment(context.name)}"
        return ResourceLocator(tenant, project, self.namespace, RESOURCE_TYPE, name).uri

    @staticmethod
    def _execution_id(context: dg.OutputContext) -> str | None:
        try:
            run = context.step_context.dagster_run
        except Exception:  # noqa: BLE001 - contexts built outside a run
            return None
        return run.tags.get("noetl/execution_id") or run.run_id

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        if obj is None:
            return
        uri = self.output_uri(context)
        resource, info = write_index(
            self.registry.get_client(),
            self.qdrant.shared(),
            uri,
            obj,
            distance=str(self._meta(context, META_DISTANCE) or self.distance),
            embedding=self._meta(context, META_EMBEDDING),
            batch_size=self.batch_size,
            metadata={"dagster/run_id": context.run_id,
                      "dagster/asset_key": context.asset_key.to_user_string() if context.has_asset_key else None},
            execution_id=self._execution_id(context),
            step=context.step_key,
            task=context.name,
            region=self.region,
        )  # fmt: skip
        context.add_output_metadata({
            "noetl/uri": dg.MetadataValue.text(resource.uri),
            "noetl/urn": dg.MetadataValue.text(resource.urn),
            "noetl/version": dg.MetadataValue.text(resource.version),
            "noetl/resource_id": dg.MetadataValue.text(resource.resource_id),
            "noetl/collection": dg.MetadataValue.text(info.name),
            "noetl/location": dg.MetadataValue.text(resource.metadata.get("location", "")),
            "noetl/dimension": dg.MetadataValue.int(info.dimension),
            "noetl/distance": dg.MetadataValue.text(info.distance),
            "dagster/row_count": dg.MetadataValue.int(info.points_count),
        })  # fmt: skip

    def input_uri(self, context: dg.InputContext) -> str:
        explicit = self._meta(context, META_URI)
        pinned = self._meta(context, META_VERSION)
        if explicit:
            base = explicit
        elif context.upstream_output is not None:
            upstream = (context.upstream_output.definition_metadata or {}).get(META_URI)
            upstream = getattr(upstream, "value", upstream)
            if upstream:
                base = upstream
            elif context.upstream_output.has_asset_key:
                base = self._uri_for_key(context.upstream_output.asset_key)
            else:
                base = self.output_uri(context.upstream_output)
        elif context.has_asset_key:
            base = self._uri_for_key(context.asset_key)
        else:
            raise dg.DagsterInvariantViolationError(
                f"input {context.name}: no upstream output and no '{META_URI}'"
            )
        loc = parse_locator(base, require_version=False)
        if pinned:
            loc = loc.with_version(str(pinned))
        return loc.uri

    def load_input(self, context: dg.InputContext) -> IndexHandle:
        handle = open_index(
            self.registry.get_client(), self.input_uri(context), qdrant=self.qdrant, region=self.region
        )
        context.add_input_metadata({
            "noetl/uri": dg.MetadataValue.text(handle.uri),
            "noetl/collection": dg.MetadataValue.text(handle.collection),
            "dagster/row_count": dg.MetadataValue.int(handle.points),
        })  # fmt: skip
        return handle
