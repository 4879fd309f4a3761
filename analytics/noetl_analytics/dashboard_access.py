"""Who sees which cost rows: the interactive dashboard's one tenancy gate.

- :class:`Viewer`: the caller, from a registry API key (``noetl-registry keys create --tenant T
  [--project P]``): one tenant (and one project when the key is project-scoped), or every tenant
  when the key belongs to an admin tenant named by the operator (``--admin-tenant``).
- :class:`KeyAuth`: turns a key into a Viewer through the registry (its database in-process, or
  its HTTP service's ``/v1/whoami``); revocation applies on the next request.
- :class:`TenantScope`: the only way the dashboard reads the facts store. Every query must name
  its tenant columns with ``$scope(tenant_col, project_col)``, which becomes the caller's filter
  (``true`` for an admin); a query without it is refused, so a new endpoint cannot forget the
  filter. The static outputs pass the same gate: the rendered HTML/PNG dashboard reads through a
  TenantScope, and the Grafana JSON's SQL gets the filter inlined (:func:`scoped_sql`). Cluster-wide views (idle, unallocated) need an admin viewer. Executions read from the
  event store (the execution page, issue 36) pass :meth:`TenantScope.execution`: another
  tenant's (or project's) execution reads as unknown (404), never as forbidden.
- :class:`Sessions`: the browser's HttpOnly cookie names a server-side session holding the key,
  which is authenticated again on every request.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from noetl_registry.errors import Forbidden, NotFound, RegistryError, Unauthorized

__all__ = [
    "Forbidden",
    "KeyAuth",
    "NotFound",
    "RegistryUnavailable",
    "Sessions",
    "TenantScope",
    "Unauthorized",
    "Viewer",
    "scoped_sql",
    "viewer_of",
]

_SCOPE = re.compile(r"\$scope\(\s*([\w.]+)\s*,\s*([\w.]+)\s*\)")  # a column, or alias.column
_PRICES = "SELECT any(currency), any(version) FROM $db.price_version"


class RegistryUnavailable(RegistryError):
    status = 503
    code = "registry_unavailable"


@dataclass(frozen=True)
class Viewer:
    """``tenant`` None: every tenant (an admin key, or an operator's export of the whole store)."""

    tenant: str | None
    project: str | None = None
    key_id: str | None = None
    name: str = ""  # who signed in, for the page ("acme", "acme/sales", "platform (admin)")

    @property
    def admin(self) -> bool:
        return self.tenant is None

    @classmethod
    def everyone(cls, name: str = "all tenants") -> Viewer:
        return cls(None, None, None, name)

    @classmethod
    def of_tenant(cls, tenant: str, project: str | None = None, key_id: str | None = None) -> Viewer:
        return cls(tenant, project, key_id, f"{tenant}/{project}" if project else tenant)

    def public(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "project": self.project, "admin": self.admin, "name": self.name}


def scoped_sql(
    sql: str, viewer: Viewer, params: dict[str, Any] | None = None, *, inline: bool = False
) -> tuple[str, dict[str, Any]]:
    """``sql`` with every ``$scope(tenant_col, project_col)`` turned into ``viewer``'s filter, and
    the query parameters it binds (``true`` for an admin). A query without ``$scope`` is refused.
    ``inline``: the names written into the SQL as literals, for SQL that leaves this process
    (the Grafana JSON); only names of the locator's rule (letters, digits, ``_``, ``-``)."""
    if not _SCOPE.search(sql):
        raise RuntimeError("dashboard query without $scope(tenant_col, project_col): refused")
    params = dict(params or {})
    v = viewer
    if v.admin:
        return _SCOPE.sub("true", sql), params
    if inline:
        from noetl_dagster.dsl.locator import check_scope  # noqa: PLC0415

        tenant = f"'{check_scope(v.tenant or '', 'tenant')}'"
        project = f"'{check_scope(v.project, 'project')}'" if v.project is not None else None
    else:
        params["scope_tenant"] = v.tenant
        tenant, project = "{scope_tenant:String}", None
        if v.project is not None:
            params["scope_project"] = v.project
            project = "{scope_project:String}"

    def cond(m: re.Match[str]) -> str:
        out = f"({m.group(1)} = {tenant}"
        if project is not None:
            out += f" AND {m.group(2)} = {project}"
        return out + ")"

    return _SCOPE.sub(cond, sql), params


def viewer_of(tenant: str | None, project: str | None, all_tenants: bool) -> Viewer:
    """The viewer a static export is for: exactly one of a tenant (and project) or all tenants,
    said explicitly; ValueError otherwise (the commands print it as one line)."""
    from noetl_dagster.dsl.locator import InvalidLocator, check_scope  # noqa: PLC0415

    if bool(tenant) == bool(all_tenants):
        raise ValueError("say whose rows to write: --tenant T (one tenant) or --all-tenants")
    if project and not tenant:
        raise ValueError("--project needs --tenant")
    if not tenant:
        return Viewer.everyone()
    try:
        return Viewer.of_tenant(
            check_scope(tenant, "tenant"), check_scope(project, "project") if project else None
        )
    except InvalidLocator as e:
        raise ValueError(str(e)) from None


class TenantScope:
    """The facts store as one viewer may read it."""

    def __init__(self, store: Any, viewer: Viewer):
        self._store = store
        self.viewer = viewer

    def query(self, sql: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[tuple]]:
        """Rows of the viewer's tenant (and project) only: ``$scope(t, p)`` becomes the filter."""
        return self._store.query(*scoped_sql(sql, self.viewer, params))

    def cluster_query(self, sql: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[tuple]]:
        """Cluster-wide rows (idle, unallocated, every tenant's share): admin viewers only."""
        if not self.viewer.admin:
            raise Forbidden("the cluster view (idle, unallocated) is for admin keys only")
        return self._store.query(sql, params)

    def execution(self, execution_id: str, tenant: str | None, project: str | None) -> None:
        """Let the viewer see this execution (its events' tenant and project) or raise NotFound,
        the same answer as for an id that does not exist, so ids of other tenants are not confirmed."""
        v = self.viewer
        if tenant is None or (
            not v.admin and (tenant != v.tenant or (v.project is not None and project != v.project))
        ):
            raise NotFound(f"no execution {execution_id}")

    def prices(self) -> tuple[str, str]:
        """(currency, price version): configuration, the same for every tenant."""
        _, rows = self._store.query(_PRICES)
        return (rows[0][0] or "", rows[0][1] or "") if rows else ("", "")


class KeyAuth:
    """API keys from the registry -> :class:`Viewer`.

    ``registry``: a :class:`noetl_registry.service.Registry`, its database URL or path, or the
    ``http(s)://`` URL of ``noetl-registry serve``; None: ``$NOETL_REGISTRY_URL`` or the embedded
    ``$NOETL_DAGSTER_HOME/registry.db``. Keys of ``admin_tenants`` (not project-scoped) see every
    tenant."""

    def __init__(self, registry: Any = None, *, admin_tenants: Iterable[str] = (), timeout: float = 10.0):
        import os  # noqa: PLC0415

        from noetl_registry.client import URL_ENV, shared_registry  # noqa: PLC0415
        from noetl_registry.service import Registry  # noqa: PLC0415

        if registry is None and os.environ.get(URL_ENV):
            registry = os.environ[URL_ENV]
        self.admin_tenants = frozenset(t for t in admin_tenants if t)
        self._url: str | None = None
        self._registry: Any = None
        self._timeout = timeout
        if isinstance(registry, Registry):
            self._registry = registry
        elif isinstance(registry, str) and registry.startswith(("http://", "https://")):
            self._url = registry.rstrip("/")
        else:
            self._registry = shared_registry(registry)

    def check(self) -> None:
        """Fail now (RegistryUnavailable) when the registry cannot be reached."""
        if self._url is None:
            self._registry.store.schema_version()
            return
        import httpx  # noqa: PLC0415

        try:
            httpx.get(f"{self._url}/healthz", timeout=self._timeout).raise_for_status()
        except httpx.HTTPError as e:
            raise RegistryUnavailable(f"registry {self._url} unreachable: {e}") from None

    def viewer(self, api_key: str | None) -> Viewer:
        """The key's viewer; Unauthorized for a missing, malformed, unknown or revoked key."""
        if not api_key:
            raise Unauthorized("missing API key (Authorization: Bearer <key>, or sign in)")
        if self._url is None:
            p = self._registry.authenticate(api_key)
            tenant, project, key_id = p.tenant, p.project, p.key_id
        else:
            tenant, project, key_id = self._whoami(api_key)
        if tenant in self.admin_tenants and project is None:
            return Viewer(None, None, key_id, f"{tenant} (admin)")
        return Viewer.of_tenant(tenant, project, key_id)

    def _whoami(self, api_key: str) -> tuple[str, str | None, str | None]:
        import httpx  # noqa: PLC0415

        if len(api_key) > 200 or not api_key.isascii() or any(c in api_key for c in "\r\n\x00"):
            raise Unauthorized("malformed API key")
        try:
            r = httpx.get(f"{self._url}/v1/whoami", headers={"Authorization": f"Bearer {api_key}"},
                          timeout=self._timeout)  # fmt: skip
        except httpx.HTTPError as e:
            raise RegistryUnavailable(f"registry {self._url} unreachable: {e}") from None
        if r.status_code in (401, 403):
            try:
                detail = str(r.json().get("detail", "unknown or revoked API key"))
            except ValueError:
                detail = "unknown or revoked API key"
            raise Unauthorized(detail)
        if r.status_code != 200:
            raise RegistryUnavailable(f"registry {self._url} answered {r.status_code}")
        who = r.json()
        return who["tenant"], who.get("project"), who.get("key_id")


class Sessions:
    """Browser sessions: an unguessable id (the cookie) -> the API key it was opened with."""

    def __init__(self, ttl: float = 8 * 3600, max_sessions: int = 10_000):
        self.ttl = ttl
        self.max_sessions = max_sessions
        self._lock = threading.Lock()
        self._by_id: dict[str, tuple[str, float]] = {}

    def open(self, api_key: str) -> str:
        sid = secrets.token_urlsafe(32)
        now = time.monotonic()
        with self._lock:
            if len(self._by_id) >= self.max_sessions:
                self._by_id = {k: v for k, v in self._by_id.items() if v[1] > now}
                while len(self._by_id) >= self.max_sessions:  # still full: the oldest go first
                    self._by_id.pop(next(iter(self._by_id)))
            self._by_id[sid] = (api_key, now + self.ttl)
        return sid

    def key(self, sid: str | None) -> str | None:
        if not sid:
            return None
        with self._lock:
            hit = self._by_id.get(sid)
            if hit is None:
                return None
            if hit[1] <= time.monotonic():
                del self._by_id[sid]
                return None
            return hit[0]

    def close(self, sid: str | None) -> None:
        with self._lock:
            self._by_id.pop(sid or "", None)
