"""The NoETL Resource Registry as a Dagster resource.

    defs = dg.Definitions(resources={"registry": NoetlRegistryResource(tenant="acme", project="lab")})

``url`` is the HTTP service (``http://127.0.0.1:8780``, with ``api_key``) or a
registry database (``sqlite:///…``, ``postgresql://…``) used in-process; left
empty it is ``$NOETL_DAGSTER_HOME/registry.db``. Use ``dg.EnvVar`` for the key.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr

from noetl_registry.client import RegistryClient, open_registry
from noetl_registry.models import AccessPlan, Lineage, Resource


class NoetlRegistryResource(dg.ConfigurableResource):
    """A client of the NoETL Resource Registry (in-process or HTTP, one interface)."""

    url: str | None = Field(
        default=None,
        description="http(s):// registry service, or a database URL for in-process use "
        "(default: $NOETL_DAGSTER_HOME/registry.db)",
    )
    api_key: str | None = Field(default=None, description="API key; required for the HTTP service")
    tenant: str = Field(default="default", description="tenant for in-process use without an API key")
    project: str = Field(default="default", description="project for in-process use without an API key")

    _client: RegistryClient | None = PrivateAttr(default=None)

    def get_client(self) -> RegistryClient:
        if self._client is None:
            self._client = open_registry(self.url, self.api_key, tenant=self.tenant, project=self.project)
        return self._client

    def scope(self) -> tuple[str, str]:
        """(tenant, project) the client acts for; a tenant-wide key writes to project 'default'."""
        client = self.get_client()
        return client.tenant, client.project or self.project

    def resolve(self, uri: str, **kw: Any) -> AccessPlan:
        return self.get_client().resolve(uri, **kw)

    def register(self, uri: str, **kw: Any) -> Resource:
        return self.get_client().register(uri, **kw)

    def lineage(self, resource_id: str, direction: str = "up", depth: int = 1) -> Lineage:
        return self.get_client().lineage(resource_id, direction, depth)

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
