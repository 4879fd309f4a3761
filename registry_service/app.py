"""The registry's HTTP surface (FastAPI; OpenAPI at /docs and /openapi.json).

Every /v1 call needs ``Authorization: Bearer <key>``; keys come from
``noetl-registry keys create``. Errors are ``{"detail": ..., "code": ...}`` with
401 (no/bad key), 403 (tenant policy), 404, 409 (version conflict), 422.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from registry_service.errors import RegistryError, Unauthorized
from registry_service.models import (
    AccessPlan,
    AuditPage,
    EventPage,
    Grant,
    GrantRequest,
    Lineage,
    Location,
    LocationIn,
    Principal,
    RegisterRequest,
    Resource,
    ResourcePage,
    WhoAmI,
)
from registry_service.service import Registry

_bearer = HTTPBearer(auto_error=False, description="an API key from `noetl-registry keys create`")


async def _principal(
    request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    # async: a cached key check is microseconds, not worth a thread-pool hop per request
    if creds is None or creds.scheme.lower() != "bearer":
        raise Unauthorized("missing API key (Authorization: Bearer <key>)")
    return request.app.state.registry.authenticate(creds.credentials)


# module level: FastAPI resolves these (string) annotations in the module's namespace
Caller = Annotated[Principal, Depends(_principal)]


def create_app(registry: Registry | str | None = None) -> FastAPI:
    """An app over a :class:`Registry` (or a database URL; None: the embedded SQLite default)."""
    reg = registry if isinstance(registry, Registry) else Registry(registry)
    app = FastAPI(
        title="NoETL Resource Registry",
        version="1",
        description=(
            "Resolves noetl:// and urn:noetl resources to access plans; keeps resources, locations, grants, "
            "lineage and an outbox of catalog-change events. Every call is scoped by an API key's tenant/project."
        ),
    )
    app.state.registry = reg
    # The SQLite store is one connection behind a lock: worker threads add no concurrency, only a
    # thread hop per request (milliseconds on a busy machine), so its calls run on the event loop.
    # Postgres calls go to the thread pool so that one slow query does not stall other requests.
    inline = reg.store.dialect == "sqlite"

    async def run(fn, *args, **kw):
        return fn(*args, **kw) if inline else await run_in_threadpool(fn, *args, **kw)

    @app.exception_handler(RegistryError)
    async def _registry_error(_: Request, exc: RegistryError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
        return JSONResponse({"detail": exc.message, "code": exc.code}, status_code=exc.status, headers=headers)

    @app.get("/healthz", tags=["meta"])
    async def healthz() -> dict[str, object]:
        return {"ok": True, "dialect": reg.store.dialect}

    @app.get("/readyz", tags=["meta"])
    def readyz() -> dict[str, object]:
        """Ready when the database answers; reports the schema version."""
        return {"ok": True, "schema_version": reg.store.schema_version(), "dialect": reg.store.dialect}

    @app.get("/v1/whoami", tags=["meta"])
    async def whoami(p: Caller) -> WhoAmI:
        return WhoAmI(key_id=p.key_id, tenant=p.tenant, project=p.project)

    @app.post("/v1/resources", status_code=201, tags=["resources"])
    async def register(body: RegisterRequest, p: Caller) -> Resource:
        """Register a resource version (the next v<N> when the URI has no version)."""
        return await run(reg.register, p, body)

    @app.get("/v1/resources/resolve", tags=["resources"])
    async def resolve(
        p: Caller,
        uri: Annotated[str, Query(description="noetl:// or urn:noetl; no version or @latest: the newest")],
        purpose: str = "read",
        region: str | None = None,
    ) -> AccessPlan:
        """The access plan for a resource: allowed, chosen location, expected checksum."""
        return await run(reg.resolve, p, uri, purpose=purpose, region=region)

    @app.get("/v1/resources", tags=["resources"])
    async def list_resources(
        p: Caller,
        tenant: str | None = None,
        project: str | None = None,
        namespace: str | None = None,
        type: str | None = None,
        q: str | None = None,
        latest: bool = False,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> ResourcePage:
        """Resources visible to the caller (own scope and live grants), filtered."""
        resources = await run(
            reg.list_resources, p, tenant=tenant, project=project, namespace=namespace, type=type, q=q,
            latest_only=latest, limit=limit, offset=offset,
        )
        return ResourcePage(resources=resources)

    @app.get("/v1/resources/{resource_id}", tags=["resources"])
    async def get_resource(resource_id: str, p: Caller) -> Resource:
        return await run(reg.get, p, resource_id)

    @app.post("/v1/resources/{resource_id}/locations", status_code=201, tags=["resources"])
    async def add_location(resource_id: str, body: LocationIn, p: Caller) -> Location:
        return await run(reg.add_location, p, resource_id, body)

    @app.get("/v1/resources/{resource_id}/lineage", tags=["lineage"])
    async def lineage(
        resource_id: str,
        p: Caller,
        direction: Literal["up", "down"] = "up",
        depth: Annotated[int, Query(ge=1, le=10)] = 1,
    ) -> Lineage:
        return await run(reg.lineage, p, resource_id, direction, depth)

    @app.post("/v1/grants", status_code=201, tags=["grants"])
    async def create_grant(body: GrantRequest, p: Caller) -> Grant:
        return await run(reg.grant, p, body)

    @app.get("/v1/grants", tags=["grants"])
    async def list_grants(p: Caller, resource_uri: str | None = None, include_inactive: bool = False) -> list[Grant]:
        return await run(reg.list_grants, p, resource_uri, include_inactive=include_inactive)

    @app.delete("/v1/grants/{grant_id}", tags=["grants"])
    async def revoke_grant(grant_id: str, p: Caller) -> Grant:
        return await run(reg.revoke, p, grant_id)

    @app.get("/v1/events", tags=["events"])
    async def events(
        p: Caller, after: Annotated[int, Query(ge=0)] = 0, limit: Annotated[int, Query(ge=1, le=1000)] = 100
    ) -> EventPage:
        """Catalog-change events of the caller's scope after a cursor (``next_after``)."""
        return await run(reg.events, p, after, limit)

    @app.get("/v1/audit", tags=["events"])
    async def audit(
        p: Caller, after: Annotated[int, Query(ge=0)] = 0, limit: Annotated[int, Query(ge=1, le=1000)] = 100
    ) -> AuditPage:
        """Cross-scope access decisions where the caller's tenant is the actor or the owner."""
        return await run(reg.audit, p, after, limit)

    return app
