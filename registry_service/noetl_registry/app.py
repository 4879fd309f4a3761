"""The registry's HTTP surface (FastAPI; OpenAPI at /docs and /openapi.json).

Every /v1 call needs ``Authorization: Bearer <key>``; keys come from
``noetl-registry keys create``. Errors are ``{"detail": ..., "code": ...}`` with
401 (no/bad key), 403 (tenant policy), 404, 409 (version conflict; an ephemeral row deleted
before its parent is archived, or a non-ephemeral one), 413 (body
over the limit), 422 (bad input, out-of-range numbers and dates).
"""

from __future__ import annotations

import logging
from typing import Annotated, Literal

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from noetl_registry.common import MAX_CURSOR, Limits
from noetl_registry.errors import RegistryError, Unauthorized
from noetl_registry.models import (
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
from noetl_registry.service import Registry

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
Id = Annotated[str, Path(max_length=256)]
Filter = Annotated[str | None, Query(max_length=256)]
UriParam = Annotated[
    str, Query(max_length=4096, description="noetl:// or urn:noetl; no version or @latest: the newest")
]
Cursor = Annotated[int, Query(ge=0, le=MAX_CURSOR)]
PageSize = Annotated[int, Query(ge=1, le=1000)]
_log = logging.getLogger(__name__)


def _error(status: int, detail: str, code: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail, "code": code}, status_code=status, headers=headers)


class _Guard:
    """Pure ASGI middleware: a request body over ``max_body`` bytes is a 413 (by its
    Content-Length, or counted while it streams in); a NUL (``%00``) in the path or the
    query string is a 422 before any handler sees it."""

    def __init__(self, app, max_body: int):
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        raw = (
            (scope.get("raw_path") or scope.get("path", "").encode()) + b"?" + scope.get("query_string", b"")
        )
        if b"%00" in raw or b"\x00" in raw:
            return await _error(
                422, "NUL characters are not allowed in the path or query", "invalid_request"
            )(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > self.max_body
            except ValueError:
                return await _error(400, "bad Content-Length", "invalid_request")(scope, receive, send)
            if too_big:
                return await self._too_large(scope, receive, send)
        seen = 0
        state = {"started": False, "refused": False}

        async def counted_receive():
            nonlocal seen
            if state["refused"]:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body and not state["started"]:
                    # answer 413 now; the handler sees a disconnected client and its answer is dropped
                    state["refused"] = True
                    await self._too_large(scope, receive, send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message):
            if state["refused"]:
                return
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        await self.app(scope, counted_receive, guarded_send)

    async def _too_large(self, scope, receive, send):
        await _error(413, f"request body over {self.max_body} bytes", "payload_too_large")(
            scope, receive, send
        )


def create_app(registry: Registry | str | None = None, *, limits: Limits | None = None) -> FastAPI:
    """An app over a :class:`Registry` (or a database URL; None: the embedded SQLite default).
    ``limits`` (default: the registry's) sets the request body limit among others."""
    reg = registry if isinstance(registry, Registry) else Registry(registry, limits=limits)
    limits = limits or reg.limits
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

    app.add_middleware(_Guard, max_body=limits.max_body_bytes)

    @app.exception_handler(RegistryError)
    async def _registry_error(_: Request, exc: RegistryError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
        return _error(exc.status, exc.message, exc.code, headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors[:20]
        )
        return _error(422, detail or "invalid request", "invalid_request")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail), "http_error", getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # a defect, not a client error: logged with its traceback, answered as JSON without internals
        _log.exception("registry: unhandled error on %s %s", request.method, request.url.path)
        return _error(500, "internal error", "internal")

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
        uri: UriParam,
        purpose: Annotated[str, Query(max_length=256)] = "read",
        region: Filter = None,
    ) -> AccessPlan:
        """The access plan for a resource: allowed, chosen location, expected checksum."""
        return await run(reg.resolve, p, uri, purpose=purpose, region=region)

    @app.get("/v1/access", tags=["grants"])
    async def access(p: Caller, uri: UriParam) -> dict[str, bool]:
        """Whether the caller may read every version of ``uri`` (owner, or a live grant), registered or not."""
        return {"allowed": await run(reg.may_read, p, uri)}

    @app.get("/v1/resources", tags=["resources"])
    async def list_resources(
        p: Caller,
        tenant: Filter = None,
        project: Filter = None,
        namespace: Filter = None,
        type: Filter = None,
        q: Filter = None,
        latest: bool = False,
        limit: PageSize = 100,
        offset: Cursor = 0,
    ) -> ResourcePage:
        """Resources visible to the caller (own scope and live grants), filtered."""
        resources = await run(
            reg.list_resources,
            p,
            tenant=tenant,
            project=project,
            namespace=namespace,
            type=type,
            q=q,
            latest_only=latest,
            limit=limit,
            offset=offset,
        )
        return ResourcePage(resources=resources)

    @app.get("/v1/resources/{resource_id}", tags=["resources"])
    async def get_resource(resource_id: Id, p: Caller) -> Resource:
        return await run(reg.get, p, resource_id)

    @app.post("/v1/resources/{resource_id}/locations", status_code=201, tags=["resources"])
    async def add_location(resource_id: Id, body: LocationIn, p: Caller) -> Location:
        return await run(reg.add_location, p, resource_id, body)

    @app.delete("/v1/ephemeral-playbooks/{resource_id}", tags=["resources"])
    async def delete_ephemeral(resource_id: Id, p: Caller) -> Resource:
        """Tombstone a generated playbook's row (kind ephemeral_playbook) once its generating execution is
        archived: 409 before that, or for any other kind; repeating it answers the same tombstone."""
        return await run(reg.delete_ephemeral, p, resource_id)

    @app.get("/v1/resources/{resource_id}/lineage", tags=["lineage"])
    async def lineage(
        resource_id: Id,
        p: Caller,
        direction: Literal["up", "down"] = "up",
        depth: Annotated[int, Query(ge=1, le=10)] = 1,
    ) -> Lineage:
        return await run(reg.lineage, p, resource_id, direction, depth)

    @app.post("/v1/grants", status_code=201, tags=["grants"])
    async def create_grant(body: GrantRequest, p: Caller) -> Grant:
        return await run(reg.grant, p, body)

    @app.get("/v1/grants", tags=["grants"])
    async def list_grants(
        p: Caller,
        resource_uri: Annotated[str | None, Query(max_length=4096)] = None,
        include_inactive: bool = False,
    ) -> list[Grant]:
        return await run(reg.list_grants, p, resource_uri, include_inactive=include_inactive)

    @app.delete("/v1/grants/{grant_id}", tags=["grants"])
    async def revoke_grant(grant_id: Id, p: Caller) -> Grant:
        return await run(reg.revoke, p, grant_id)

    @app.get("/v1/events", tags=["events"])
    async def events(p: Caller, after: Cursor = 0, limit: PageSize = 100) -> EventPage:
        """Catalog-change events of the caller's scope after a cursor (``next_after``)."""
        return await run(reg.events, p, after, limit)

    @app.get("/v1/audit", tags=["events"])
    async def audit(p: Caller, after: Cursor = 0, limit: PageSize = 100) -> AuditPage:
        """Cross-scope access decisions where the caller's tenant is the actor or the owner."""
        return await run(reg.audit, p, after, limit)

    return app
