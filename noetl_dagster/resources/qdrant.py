"""Qdrant as a Dagster resource, sharing the process-wide client of ``kind: qdrant``.

    defs = dg.Definitions(resources={"qdrant": QdrantResource(path="/data/qdrant")})
    defs = dg.Definitions(resources={"qdrant": QdrantResource(url="https://…:6333", api_key=dg.EnvVar("QDRANT_KEY"))})

qdrant-client's local mode lets one client open a storage path at a time — a
second ``QdrantClient(path=...)`` on the same path fails even inside one
process. So this resource never owns a client: it borrows the one that
:func:`noetl_dagster.tools.qdrant.shared_client` keeps per path (or per server
URL + key) for the whole process, the same one the playbook tool and the Qdrant
IO manager use. Ops of one run share it; runs in separate processes (the
multiprocess executor, a run launcher) cannot open the same local path at the
same time — use the in-process executor with local mode, or a Qdrant server.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field
from qdrant_client import QdrantClient

from noetl_dagster.tools import qdrant as q


def default_qdrant_path() -> Path:
    return Path(os.environ.get("NOETL_DAGSTER_HOME", ".noetl")) / "qdrant"


class QdrantResource(dg.ConfigurableResource):
    """A Qdrant location: a local storage path (embedded) or a server URL."""

    path: str | None = Field(
        default=None, description="local-mode storage directory (default: $NOETL_DAGSTER_HOME/qdrant)"
    )
    url: str | None = Field(default=None, description="Qdrant server URL; when set, `path` is ignored")
    api_key: str | None = Field(default=None, description="server API key (use dg.EnvVar)")
    timeout: int | None = Field(default=None, description="server request timeout in seconds")

    def shared(self) -> q.SharedClient:
        if self.url:
            return q.shared_client(url=self.url, api_key=self.api_key, timeout=self.timeout)
        return q.shared_client(path=self.path or default_qdrant_path())

    def get_client(self) -> QdrantClient:
        """The process-wide client (do not close it; see :meth:`release`)."""
        return self.shared().client

    def release(self) -> bool:
        """Close the shared client so another process may open the local path."""
        if self.url:
            return q.release_client(url=self.url, api_key=self.api_key)
        return q.release_client(path=self.path or default_qdrant_path())

    # the tool's operations, for ops that talk to Qdrant directly
    def create_collection(
        self, collection: str, dimension: int, distance: str = "cosine", *, if_exists: str = "ok"
    ) -> q.CollectionInfo:
        return q.create_collection(self.shared(), collection, dimension, distance, if_exists=if_exists)[0]

    def upsert(
        self, collection: str, points: Any, *, batch_size: int = q.DEFAULT_BATCH, **options: Any
    ) -> int:
        """Upsert records / an Arrow table / a PointSet (the tool's input shapes)."""
        return q.upsert_points(
            self.shared(), collection, q.to_points(points, options=options), batch_size=batch_size
        )

    def query(self, collection: str, vector: Any, *, limit: int = 10, filter: Any = None, with_payload: Any = True,
              with_vectors: bool = False, score_threshold: float | None = None) -> list[dict[str, Any]]:  # fmt: skip
        return q.query_points(self.shared(), collection, vector, limit=limit, flt=filter, with_payload=with_payload,
                              with_vectors=with_vectors, score_threshold=score_threshold)  # fmt: skip

    def count(self, collection: str, filter: Any = None) -> int:
        return q.count_points(self.shared(), collection, q.build_filter(filter))

    def info(self, collection: str) -> q.CollectionInfo:
        return q.collection_info(self.shared(), collection)
