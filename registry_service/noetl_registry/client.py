"""One client interface, two transports.

:class:`InProcessRegistryClient` calls a :class:`~noetl_registry.service.Registry`
directly (embedded SQLite or a Postgres URL); :class:`HttpRegistryClient` calls
the HTTP service with httpx. Both return the same typed records and raise the
same :mod:`noetl_registry.errors`. Use :func:`open_registry` to get either.
"""

from __future__ import annotations

import json
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from noetl_registry.errors import ERRORS_BY_STATUS, InvalidRequest, RegistryError
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

API_KEY_ENV = "NOETL_REGISTRY_API_KEY"
URL_ENV = "NOETL_REGISTRY_URL"
_M = TypeVar("_M", bound=BaseModel)
_GRANT_LIST = TypeAdapter(list[Grant])


def _build(model: type[_M], **fields: Any) -> _M:
    """A request body, or InvalidRequest: both transports reject bad input the same way."""
    try:
        return model.model_validate(fields)
    except ValidationError as e:
        raise InvalidRequest(_validation_message(e)) from None


def _validation_message(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())


def _location(spec: LocationIn | Mapping[str, Any]) -> LocationIn:
    return spec if isinstance(spec, LocationIn) else _build(LocationIn, **dict(spec))


class RegistryClient(ABC):
    """What the IO managers, tools and resources use."""

    tenant: str
    project: str | None

    @abstractmethod
    def register(
        self,
        uri: str,
        *,
        kind: str | None = None,
        locations: Iterable[LocationIn | Mapping[str, Any]] = (),
        metadata: Mapping[str, Any] | None = None,
        inputs: Iterable[str] = (),
        execution_id: str | None = None,
        step: str | None = None,
        task: str | None = None,
    ) -> Resource: ...

    @abstractmethod
    def resolve(self, uri: str, *, purpose: str = "read", region: str | None = None) -> AccessPlan: ...

    @abstractmethod
    def get(self, resource_id: str) -> Resource: ...

    def may_read(self, uri: str) -> bool:
        """Whether this client's principal may read every version of ``uri`` (owner or live grant)."""
        raise NotImplementedError

    @abstractmethod
    def add_location(self, resource_id: str, location: LocationIn | Mapping[str, Any]) -> Location: ...

    @abstractmethod
    def grant(
        self,
        resource_uri: str,
        subject: str,
        *,
        permission: str = "read",
        expires_at: datetime | None = None,
        purpose: str | None = None,
    ) -> Grant: ...

    @abstractmethod
    def revoke(self, grant_id: str) -> Grant: ...

    @abstractmethod
    def grants(self, resource_uri: str | None = None, *, include_inactive: bool = False) -> list[Grant]: ...

    @abstractmethod
    def lineage(self, resource_id: str, direction: str = "up", depth: int = 1) -> Lineage: ...

    @abstractmethod
    def list(
        self,
        *,
        tenant: str | None = None,
        project: str | None = None,
        namespace: str | None = None,
        type: str | None = None,
        q: str | None = None,
        latest: bool = False,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Resource]: ...

    @abstractmethod
    def events(self, after: int = 0, limit: int = 100) -> EventPage: ...

    @abstractmethod
    def audit(self, after: int = 0, limit: int = 100) -> AuditPage: ...

    @abstractmethod
    def whoami(self) -> WhoAmI: ...

    def close(self) -> None:  # noqa: B027 - optional hook: in-process clients hold nothing to close
        return None

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class InProcessRegistryClient(RegistryClient):
    """Calls a :class:`Registry` directly. Given the ``api_key`` the principal came from, every
    call re-authenticates it (a cache hit unless a key was revoked), so a revoked key stops
    working on its next call here too."""

    def __init__(
        self,
        registry: Registry,
        principal: Principal,
        *,
        owns_registry: bool = False,
        api_key: str | None = None,
    ):
        self.registry = registry
        self._principal = principal
        self._api_key = api_key
        self.tenant = principal.tenant
        self.project = principal.project
        self._owns = owns_registry

    @property
    def principal(self) -> Principal:
        if self._api_key is not None:
            self._principal = self.registry.authenticate(self._api_key)
        return self._principal

    def register(
        self,
        uri,
        *,
        kind=None,
        locations=(),
        metadata=None,
        inputs=(),
        execution_id=None,
        step=None,
        task=None,
    ) -> Resource:  # noqa: D102
        req = _build(
            RegisterRequest,
            uri=uri,
            kind=kind,
            locations=[_location(lc) for lc in locations],
            metadata=dict(metadata or {}),
            inputs=list(inputs),
            execution_id=execution_id,
            step=step,
            task=task,
        )
        return self.registry.register(self.principal, req)

    def resolve(self, uri, *, purpose="read", region=None) -> AccessPlan:
        return self.registry.resolve(self.principal, uri, purpose=purpose, region=region)

    def may_read(self, uri) -> bool:
        return self.registry.may_read(self.principal, uri)

    def delete_ephemeral(self, resource_id) -> Resource:
        """Tombstone a generated playbook's row once its parent execution is archived (registry_service/noetl_registry/ephemeral.py)."""
        return self.registry.delete_ephemeral(self.principal, resource_id)

    def get(self, resource_id) -> Resource:
        return self.registry.get(self.principal, resource_id)

    def add_location(self, resource_id, location) -> Location:
        return self.registry.add_location(self.principal, resource_id, _location(location))

    def grant(self, resource_uri, subject, *, permission="read", expires_at=None, purpose=None) -> Grant:
        req = _build(
            GrantRequest,
            resource_uri=resource_uri,
            subject=subject,
            permission=permission,  # type: ignore[arg-type]
            expires_at=expires_at,
            purpose=purpose,
        )
        return self.registry.grant(self.principal, req)

    def revoke(self, grant_id) -> Grant:
        return self.registry.revoke(self.principal, grant_id)

    def grants(self, resource_uri=None, *, include_inactive=False) -> list[Grant]:
        return self.registry.list_grants(self.principal, resource_uri, include_inactive=include_inactive)

    def lineage(self, resource_id, direction="up", depth=1) -> Lineage:
        return self.registry.lineage(self.principal, resource_id, direction, depth)

    def list(
        self,
        *,
        tenant=None,
        project=None,
        namespace=None,
        type=None,
        q=None,
        latest=False,
        limit=100,
        offset=0,
    ) -> list[Resource]:
        return self.registry.list_resources(
            self.principal,
            tenant=tenant,
            project=project,
            namespace=namespace,
            type=type,
            q=q,
            latest_only=latest,
            limit=limit,
            offset=offset,
        )

    def events(self, after=0, limit=100) -> EventPage:
        return self.registry.events(self.principal, after, limit)

    def audit(self, after=0, limit=100) -> AuditPage:
        return self.registry.audit(self.principal, after, limit)

    def whoami(self) -> WhoAmI:
        return WhoAmI(key_id=self.principal.key_id, tenant=self.tenant, project=self.project)

    def close(self) -> None:
        if self._owns:
            self.registry.close()


class HttpRegistryClient(RegistryClient):
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ):
        if not api_key:
            raise ValueError(f"an API key is required for {base_url} (pass api_key or set ${API_KEY_ENV})")
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
            transport=transport,
        )
        self._who: WhoAmI | None = None

    @property
    def tenant(self) -> str:  # type: ignore[override]
        return self.whoami().tenant

    @property
    def project(self) -> str | None:  # type: ignore[override]
        return self.whoami().project

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        r = self._http.request(method, path, **kw)
        if r.status_code >= 400:
            try:
                body = r.json()
                detail = body.get("detail", r.text)
            except ValueError:
                detail = r.text
            if not isinstance(detail, str):  # FastAPI validation errors are a list
                detail = str(detail)
            cls = ERRORS_BY_STATUS.get(r.status_code, RegistryError)
            err = cls(detail)
            if cls is RegistryError:
                err.status = r.status_code
            raise err
        return r.content

    def register(
        self,
        uri,
        *,
        kind=None,
        locations=(),
        metadata=None,
        inputs=(),
        execution_id=None,
        step=None,
        task=None,
    ) -> Resource:
        req = _build(
            RegisterRequest,
            uri=uri,
            kind=kind,
            locations=[_location(lc) for lc in locations],
            metadata=dict(metadata or {}),
            inputs=list(inputs),
            execution_id=execution_id,
            step=step,
            task=task,
        )
        return Resource.model_validate_json(
            self._call(
                "POST",
                "/v1/resources",
                content=req.model_dump_json(),
                headers={"content-type": "application/json"},
            )
        )

    def resolve(self, uri, *, purpose="read", region=None) -> AccessPlan:
        params = {"uri": uri, "purpose": purpose}
        if region:
            params["region"] = region
        return AccessPlan.model_validate_json(self._call("GET", "/v1/resources/resolve", params=params))

    def may_read(self, uri) -> bool:
        return bool(json.loads(self._call("GET", "/v1/access", params={"uri": uri})).get("allowed"))

    def get(self, resource_id) -> Resource:
        return Resource.model_validate_json(self._call("GET", f"/v1/resources/{_seg(resource_id)}"))

    def delete_ephemeral(self, resource_id) -> Resource:
        """DELETE /v1/ephemeral-playbooks/{id}: Conflict (409) before the parent is archived or for other kinds."""
        return Resource.model_validate_json(
            self._call("DELETE", f"/v1/ephemeral-playbooks/{_seg(resource_id)}")
        )

    def add_location(self, resource_id, location) -> Location:
        body = _location(location).model_dump_json()
        return Location.model_validate_json(
            self._call(
                "POST",
                f"/v1/resources/{_seg(resource_id)}/locations",
                content=body,
                headers={"content-type": "application/json"},
            )
        )

    def grant(self, resource_uri, subject, *, permission="read", expires_at=None, purpose=None) -> Grant:
        req = _build(
            GrantRequest,
            resource_uri=resource_uri,
            subject=subject,
            permission=permission,  # type: ignore[arg-type]
            expires_at=expires_at,
            purpose=purpose,
        )
        return Grant.model_validate_json(
            self._call(
                "POST",
                "/v1/grants",
                content=req.model_dump_json(),
                headers={"content-type": "application/json"},
            )
        )

    def revoke(self, grant_id) -> Grant:
        return Grant.model_validate_json(self._call("DELETE", f"/v1/grants/{_seg(grant_id)}"))

    def grants(self, resource_uri=None, *, include_inactive=False) -> list[Grant]:
        params: dict[str, Any] = {"include_inactive": include_inactive}
        if resource_uri:
            params["resource_uri"] = resource_uri
        return _GRANT_LIST.validate_json(self._call("GET", "/v1/grants", params=params))

    def lineage(self, resource_id, direction="up", depth=1) -> Lineage:
        return Lineage.model_validate_json(
            self._call(
                "GET",
                f"/v1/resources/{_seg(resource_id)}/lineage",
                params={"direction": direction, "depth": depth},
            )
        )

    def list(
        self,
        *,
        tenant=None,
        project=None,
        namespace=None,
        type=None,
        q=None,
        latest=False,
        limit=100,
        offset=0,
    ) -> list[Resource]:
        params = {
            k: v
            for k, v in {
                "tenant": tenant,
                "project": project,
                "namespace": namespace,
                "type": type,
                "q": q,
            }.items()
            if v
        }
        params.update(latest=latest, limit=limit, offset=offset)
        return ResourcePage.model_validate_json(self._call("GET", "/v1/resources", params=params)).resources

    def events(self, after=0, limit=100) -> EventPage:
        return EventPage.model_validate_json(
            self._call("GET", "/v1/events", params={"after": after, "limit": limit})
        )

    def audit(self, after=0, limit=100) -> AuditPage:
        return AuditPage.model_validate_json(
            self._call("GET", "/v1/audit", params={"after": after, "limit": limit})
        )

    def whoami(self) -> WhoAmI:
        if self._who is None:
            self._who = WhoAmI.model_validate_json(self._call("GET", "/v1/whoami"))
        return self._who

    def close(self) -> None:
        self._http.close()


def _seg(value: str) -> str:
    """A path segment: ids never contain '/', and refusing it keeps callers from steering the URL."""
    if not value or "/" in value or "?" in value or "#" in value or value in (".", ".."):
        raise ValueError(f"invalid id: {value!r}")
    return value


_SHARED: dict[str, Registry] = {}
_SHARED_LOCK = threading.Lock()


def shared_registry(db_url: str | None = None) -> Registry:
    """One :class:`Registry` per database URL per process (connections are reused)."""
    from noetl_registry.store import default_db_path  # noqa: PLC0415

    key = str(db_url) if db_url else str(default_db_path().resolve())
    with _SHARED_LOCK:
        reg = _SHARED.get(key)
        if reg is None:
            reg = Registry(db_url or None)
            _SHARED[key] = reg
        return reg


def open_registry(
    url_or_db: str | Registry | None = None,
    api_key: str | None = None,
    *,
    tenant: str = "default",
    project: str | None = "default",
) -> RegistryClient:
    """A registry client.

    - ``http://`` / ``https://``: the HTTP service; ``api_key`` (or ``$NOETL_REGISTRY_API_KEY``) names the caller.
    - a database URL (``sqlite:///…``, a path, ``postgresql://…``): in-process. With ``api_key`` the
      key's tenant/project apply; without, ``tenant``/``project`` (``project=None``: the whole tenant).
    - None: ``$NOETL_REGISTRY_URL`` if set, else ``$NOETL_DAGSTER_HOME/registry.db`` in-process.
    """
    if url_or_db is None and os.environ.get(URL_ENV):
        url_or_db = os.environ[URL_ENV]
    if isinstance(url_or_db, Registry):
        reg = url_or_db
    elif isinstance(url_or_db, str) and url_or_db.startswith(("http://", "https://")):
        return HttpRegistryClient(url_or_db, api_key or os.environ.get(API_KEY_ENV, ""))
    else:
        reg = shared_registry(url_or_db)
    principal = reg.authenticate(api_key) if api_key else Principal(tenant=tenant, project=project)
    if not api_key:
        from noetl_dagster.dsl.locator import check_scope  # noqa: PLC0415 - the locator's rule for the scope

        check_scope(tenant, "tenant")
        if project is not None:
            check_scope(project, "project")
    return InProcessRegistryClient(reg, principal, api_key=api_key or None)
