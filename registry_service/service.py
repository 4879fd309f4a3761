"""The registry's rules, independent of transport.

Tenancy: every call runs as a :class:`Principal` (an API key bound to a tenant
and optionally one project). A principal *owns* the resources of its tenant
(and of its project, when the key is project-scoped); anything else needs a
live grant (not revoked, not expired). Reads outside the owner scope are
audited, allowed or not. A cross-scope resolve of a resource that does not
exist is refused exactly like one that exists, so the registry is no oracle.

Every mutation appends a catalog-change event to the outbox table in the same
transaction (``noetl.catalog.resource.registered``, ``…location_added``,
``…replica_available``, ``…grant_created``, ``…grant_revoked``,
``…api_key_created``, ``…api_key_revoked``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any

from noetl_dagster.engine.events import uuid7
from noetl_dagster.storage.locator import (
    InvalidLocator,
    ResourceLocator,
    parse_locator,
    shard_key,
)
from registry_service.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unauthorized
from registry_service.models import (
    AccessPlan,
    ApiKeyInfo,
    AuditEntry,
    AuditPage,
    CatalogEvent,
    EventPage,
    Grant,
    GrantRequest,
    Lineage,
    LineageEdge,
    Location,
    LocationIn,
    Principal,
    RegisterRequest,
    Resource,
    ResourceSummary,
    iso,
    utc_now,
)
from registry_service.store import RegistryStore, Tx, open_store

EV_REGISTERED = "noetl.catalog.resource.registered"
EV_LOCATION_ADDED = "noetl.catalog.resource.location_added"
EV_REPLICA_AVAILABLE = "noetl.catalog.resource.replica_available"
EV_GRANT_CREATED = "noetl.catalog.resource.grant_created"
EV_GRANT_REVOKED = "noetl.catalog.resource.grant_revoked"
EV_KEY_CREATED = "noetl.catalog.api_key.created"
EV_KEY_REVOKED = "noetl.catalog.api_key.revoked"

LATEST = "latest"
KEY_PREFIX = "nrk"
MAX_LINEAGE_DEPTH = 10
MAX_PAGE = 1000

_RESOURCE_COLS = (
    "resource_id, uri, series_id, tenant_id, project_id, namespace, resource_type, name, version, seq, kind,"
    " status, home_shard, metadata, created_at, created_by, execution_id, step, task"
)
_LOCATION_COLS = (
    "location_id, resource_id, storage_uri, storage_type, region, shard_id, storage_class, role, status,"
    " checksum, size_bytes, format, row_count, schema_fingerprint, metadata, created_at"
)
_GRANT_COLS = (
    "grant_id, target_uri, resource_id, subject, permission, purpose, conditions, expires_at, created_at,"
    " created_by, revoked_at"
)


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)


def _unjson(value: Any) -> Any:
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def _hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_subject(subject: str) -> tuple[str, str | None, str]:
    """``tenant:<t>`` / ``tenant://<t>`` / ``project:<t>/<p>`` / ``project://<t>/<p>``
    -> (tenant, project or None, canonical spelling)."""
    kind, sep, rest = subject.partition(":")
    if not sep:
        raise InvalidRequest(f"grant subject {subject!r}: use tenant:<t> or project:<t>/<p>")
    rest = rest[2:] if rest.startswith("//") else rest
    try:
        if kind == "tenant":
            probe = ResourceLocator(rest, "x", "x", "x", "x")
            return probe.tenant, None, f"tenant:{probe.tenant}"
        if kind == "project":
            tenant, slash, project = rest.partition("/")
            if not slash:
                raise InvalidRequest(f"grant subject {subject!r}: project subjects are project:<tenant>/<project>")
            probe = ResourceLocator(tenant, project, "x", "x", "x")
            return probe.tenant, probe.project, f"project:{probe.tenant}/{probe.project}"
    except InvalidLocator as e:
        raise InvalidRequest(f"grant subject {subject!r}: {e}") from e
    raise InvalidRequest(f"grant subject {subject!r}: the kind must be 'tenant' or 'project'")


def _locator(uri: str, *, require_version: bool) -> ResourceLocator:
    try:
        return parse_locator(uri, require_version=require_version)
    except InvalidLocator as e:
        raise InvalidRequest(str(e)) from e


class Registry:
    """The registry over one store. Thread-safe; share one per process."""

    def __init__(self, store: RegistryStore | str | None = None, *, region: str = "local", key_cache_ttl: float = 10.0):
        self.store = store if isinstance(store, RegistryStore) else open_store(store)
        self.region = region
        self._key_cache: dict[str, tuple[float, Principal]] = {}
        self._key_cache_ttl = key_cache_ttl
        self._cache_lock = threading.Lock()

    def close(self) -> None:
        self.store.close()

    # ------------------------------------------------------------------ keys
    def create_api_key(self, tenant: str, project: str | None = None, *, label: str | None = None) -> tuple[str, str]:
        """Create a key; returns (key_id, the key text). Only its hash is stored."""
        try:
            ResourceLocator(tenant, project or "x", "x", "x", "x")
        except InvalidLocator as e:
            raise InvalidRequest(str(e)) from e
        key_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        now = iso(utc_now())
        with self.store.write() as tx:
            tx.exec(
                "INSERT INTO registry_api_key (key_id, secret_hash, tenant_id, project_id, label, created_at)"
                " VALUES (?,?,?,?,?,?)",
                (key_id, _hash_secret(secret), tenant, project, label, now),
            )
            self._event(tx, EV_KEY_CREATED, tenant, project or "", None, None, key_id,
                        {"key_id": key_id, "project": project, "label": label})
        return key_id, f"{KEY_PREFIX}_{key_id}_{secret}"

    def revoke_api_key(self, key_id: str) -> None:
        now = iso(utc_now())
        with self.store.write() as tx:
            row = tx.one("SELECT tenant_id, project_id FROM registry_api_key WHERE key_id = ?", (key_id,))
            if row is None:
                raise NotFound(f"no api key {key_id!r}")
            tx.exec("UPDATE registry_api_key SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL", (now, key_id))
            self._event(tx, EV_KEY_REVOKED, row[0], row[1] or "", None, None, key_id, {"key_id": key_id})
        with self._cache_lock:
            self._key_cache.clear()

    def list_api_keys(self, tenant: str | None = None) -> list[ApiKeyInfo]:
        sql = "SELECT key_id, tenant_id, project_id, label, created_at, revoked_at FROM registry_api_key"
        params: list[Any] = []
        if tenant:
            sql += " WHERE tenant_id = ?"
            params.append(tenant)
        with self.store.read() as tx:
            rows = tx.all(sql + " ORDER BY created_at", params)
        return [ApiKeyInfo(key_id=r[0], tenant=r[1], project=r[2], label=r[3], created_at=r[4], revoked_at=r[5])
                for r in rows]

    def authenticate(self, api_key: str | None) -> Principal:
        if not api_key:
            raise Unauthorized("missing API key (Authorization: Bearer <key>)")
        now = time.monotonic()
        with self._cache_lock:
            hit = self._key_cache.get(api_key)
        if hit and hit[0] > now:
            return hit[1]
        prefix, _, rest = api_key.partition("_")
        key_id, _, secret = rest.partition("_")
        if prefix != KEY_PREFIX or not key_id or not secret:
            raise Unauthorized("malformed API key")
        with self.store.read() as tx:
            row = tx.one(
                "SELECT secret_hash, tenant_id, project_id, revoked_at FROM registry_api_key WHERE key_id = ?",
                (key_id,),
            )
        if row is None or row[3] is not None or not hmac.compare_digest(row[0], _hash_secret(secret)):
            raise Unauthorized("unknown or revoked API key")
        principal = Principal(tenant=row[1], project=row[2], key_id=key_id)
        with self._cache_lock:
            if len(self._key_cache) > 10_000:
                self._key_cache.clear()
            self._key_cache[api_key] = (now + self._key_cache_ttl, principal)
        return principal

    # -------------------------------------------------------------- helpers
    @staticmethod
    def _owns(p: Principal, tenant: str, project: str) -> bool:
        return p.tenant == tenant and (p.project is None or p.project == project)

    def _grant_for(
        self, tx: Tx, p: Principal, series: str, resource_id: str | None, permissions: Sequence[str]
    ) -> str | None:
        """The id of a live grant letting ``p`` act on the resource, or None."""
        sql = (
            "SELECT grant_id FROM registry_grant WHERE series_id = ? AND subject_tenant = ?"
            " AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ?)"
            f" AND permission IN ({','.join('?' * len(permissions))})"
        )
        params: list[Any] = [series, p.tenant, iso(utc_now()), *permissions]
        if resource_id is None:
            sql += " AND resource_id IS NULL"
        else:
            sql += " AND (resource_id IS NULL OR resource_id = ?)"
            params.append(resource_id)
        if p.project is not None:
            sql += " AND (subject_project IS NULL OR subject_project = ?)"
            params.append(p.project)
        row = tx.one(sql + " LIMIT 1", params)
        return row[0] if row else None

    def _authorize(
        self, tx: Tx, p: Principal, loc: ResourceLocator, resource_id: str | None, permission: str
    ) -> str | None:
        """None when ``p`` owns the resource, else the allowing grant id; raises Forbidden."""
        if self._owns(p, loc.tenant, loc.project):
            return None
        perms = ("read", "write") if permission == "read" else ("write",)
        grant_id = self._grant_for(tx, p, loc.series, resource_id, perms)
        if grant_id is None:
            raise Forbidden(f"{p.label} may not {permission} {loc.uri}: no live grant")
        return grant_id

    def _event(
        self,
        tx: Tx,
        name: str,
        tenant: str,
        project: str,
        resource_id: str | None,
        uri: str | None,
        actor: str | None,
        data: dict[str, Any],
    ) -> int:
        seq = tx.next_value("event")
        tx.exec(
            "INSERT INTO registry_event (seq, event_id, name, tenant_id, project_id, resource_id, uri, actor, ts, data)"
            " VALUES (?,?,?,?,?,?,?,?,?,?)",
            (seq, uuid7(), name, tenant, project, resource_id, uri, actor, iso(utc_now()), _json(data)),
        )
        return seq

    def _audit(
        self, p: Principal, action: str, allowed: bool, uri: str | None, owner: ResourceLocator | None, reason: str
    ) -> None:
        with self.store.write() as tx:
            seq = tx.next_value("audit")
            tx.exec(
                "INSERT INTO registry_audit (seq, ts, action, allowed, reason, uri, actor_key_id, actor_tenant,"
                " actor_project, owner_tenant, owner_project) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    seq, iso(utc_now()), action, bool(allowed) if tx.dialect == "postgres" else int(allowed),
                    reason, uri, p.key_id, p.tenant, p.project,
                    owner.tenant if owner else None, owner.project if owner else None,
                ),
            )

    @staticmethod
    def _resource_from_row(row: Sequence[Any], locations: list[Location]) -> Resource:
        loc = ResourceLocator(row[3], row[4], row[5], row[6], row[7], row[8])
        return Resource(
            resource_id=row[0], uri=row[1], urn=loc.urn, series=row[2], tenant=row[3], project=row[4],
            namespace=row[5], type=row[6], name=row[7], version=row[8], seq=int(row[9]), kind=row[10],
            status=row[11], home_shard=row[12], metadata=_unjson(row[13]), locations=locations,
            created_at=row[14], created_by=row[15], execution_id=row[16], step=row[17], task=row[18],
        )

    @staticmethod
    def _location_from_row(r: Sequence[Any]) -> Location:
        return Location(
            location_id=r[0], resource_id=r[1], uri=r[2], storage_type=r[3], region=r[4], shard=r[5],
            storage_class=r[6], role=r[7], status=r[8], checksum=r[9], size_bytes=r[10], format=r[11],
            rows=r[12], schema_fingerprint=r[13], metadata=_unjson(r[14]), created_at=r[15],
        )

    def _locations(self, tx: Tx, resource_ids: Sequence[str]) -> dict[str, list[Location]]:
        out: dict[str, list[Location]] = {rid: [] for rid in resource_ids}
        if not resource_ids:
            return out
        for i in range(0, len(resource_ids), 500):
            chunk = list(resource_ids[i : i + 500])
            rows = tx.all(
                f"SELECT {_LOCATION_COLS} FROM registry_location WHERE resource_id IN ({','.join('?' * len(chunk))})"
                " ORDER BY created_at, location_id",
                chunk,
            )
            for r in rows:
                out[r[1]].append(self._location_from_row(r))
        return out

    def _find(self, tx: Tx, loc: ResourceLocator) -> tuple[Any, ...] | None:
        if loc.version is None or loc.version == LATEST:
            return tx.one(
                f"SELECT {_RESOURCE_COLS} FROM registry_resource WHERE series_id = ? AND status = 'active'"
                " ORDER BY seq DESC LIMIT 1",
                (loc.series,),
            )
        return tx.one(f"SELECT {_RESOURCE_COLS} FROM registry_resource WHERE uri = ?", (loc.uri,))

    def _find_with_locations(self, tx: Tx, loc: ResourceLocator) -> tuple[tuple[Any, ...] | None, list[Location]]:
        """The resource and its locations in one round trip (resolve is the hot path)."""
        cols = ", ".join("r." + c.strip() for c in _RESOURCE_COLS.split(",")) + ", " + ", ".join(
            "l." + c.strip() for c in _LOCATION_COLS.split(","))
        sql = f"SELECT {cols} FROM registry_resource r LEFT JOIN registry_location l ON l.resource_id = r.resource_id"
        if loc.version is None or loc.version == LATEST:
            sql += (" WHERE r.resource_id = (SELECT resource_id FROM registry_resource WHERE series_id = ?"
                    " AND status = 'active' ORDER BY seq DESC LIMIT 1)")
            key = loc.series
        else:
            sql += " WHERE r.uri = ?"
            key = loc.uri
        rows = tx.all(sql + " ORDER BY l.created_at, l.location_id", (key,))
        if not rows:
            return None, []
        n = len(_RESOURCE_COLS.split(","))
        locations = [self._location_from_row(r[n:]) for r in rows if r[n] is not None]
        return rows[0][:n], locations

    def _insert_location(
        self, tx: Tx, resource_id: str, loc: ResourceLocator, spec: LocationIn, role: str, now: str
    ) -> Location:
        location = Location(
            **spec.model_dump(exclude={"storage_type", "role"}),
            storage_type=spec.storage_type or spec.uri.split("://", 1)[0],
            role=role,  # type: ignore[arg-type]
            location_id="loc_" + uuid7().replace("-", ""),
            resource_id=resource_id,
            shard=shard_key(loc.tenant, loc.project),
            created_at=now,
        )
        tx.exec(
            f"INSERT INTO registry_location ({_LOCATION_COLS}) VALUES ({','.join('?' * 16)})",
            (
                location.location_id, resource_id, location.uri, location.storage_type, location.region,
                location.shard, location.storage_class, location.role, location.status, location.checksum,
                location.size_bytes, location.format, location.rows, location.schema_fingerprint,
                _json(location.metadata), now,
            ),
        )
        return location

    # -------------------------------------------------------------- register
    def register(self, p: Principal, req: RegisterRequest) -> Resource:
        loc = _locator(req.uri, require_version=False)
        if loc.version == LATEST:
            raise InvalidRequest("'latest' is an alias for resolving; register without a version or with a new one")
        kind = req.kind or loc.type
        primaries = [spec for spec in req.locations if spec.role == "primary"]
        if len(primaries) > 1:
            raise InvalidRequest("at most one primary location")
        now = iso(utc_now())
        try:
            return self._register(p, req, loc, kind, primaries, now)
        except Forbidden as e:
            self._audit(p, "register", False, loc.uri, loc, e.message)
            raise

    def _register(
        self, p: Principal, req: RegisterRequest, loc: ResourceLocator, kind: str, primaries: list[LocationIn], now: str
    ) -> Resource:
        with self.store.write() as tx:
            self._authorize(tx, p, loc, None, "write")
            if loc.version is not None:
                existing = self._find(tx, loc)
                if existing is not None:
                    return self._idempotent_or_conflict(tx, existing, req)
            inputs: list[tuple[str, str]] = []
            for text in req.inputs:
                in_loc = _locator(text, require_version=False)
                row = self._find(tx, in_loc)
                if row is None:
                    if self._owns(p, in_loc.tenant, in_loc.project):
                        raise NotFound(f"input {text} is not registered")
                    raise Forbidden(f"{p.label} may not read input {in_loc.uri}")
                self._authorize(tx, p, in_loc, row[0], "read")
                inputs.append((row[0], row[1]))
            seq_row = tx.one(
                "INSERT INTO registry_series (series_id, tenant_id, project_id, namespace, resource_type, name,"
                " last_seq, created_at) VALUES (?,?,?,?,?,?,1,?)"
                " ON CONFLICT (series_id) DO UPDATE SET last_seq = registry_series.last_seq + 1 RETURNING last_seq",
                (loc.series, loc.tenant, loc.project, loc.namespace, loc.type, loc.name, now),
            )
            assert seq_row is not None
            seq = int(seq_row[0])
            version = loc.version or f"v{seq}"
            full = loc.with_version(version)
            resource_id = "res_" + uuid7().replace("-", "")
            shard = shard_key(loc.tenant, loc.project)
            tx.exec(
                f"INSERT INTO registry_resource ({_RESOURCE_COLS}) VALUES ({','.join('?' * 19)})",
                (
                    resource_id, full.uri, loc.series, loc.tenant, loc.project, loc.namespace, loc.type, loc.name,
                    version, seq, kind, "active", shard, _json(req.metadata), now, p.key_id, req.execution_id,
                    req.step, req.task,
                ),
            )
            locations = []
            for i, spec in enumerate(req.locations):
                role = spec.role or ("primary" if (not primaries and i == 0) else "replica")
                locations.append(self._insert_location(tx, resource_id, full, spec, role, now))
            for input_id, _ in inputs:
                tx.exec(
                    "INSERT INTO registry_lineage (lineage_id, output_resource_id, input_resource_id, relationship,"
                    " execution_id, step, task, created_at) VALUES (?,?,?,?,?,?,?,?)"
                    " ON CONFLICT (output_resource_id, input_resource_id) DO NOTHING",
                    ("lin_" + uuid7().replace("-", ""), resource_id, input_id, "derived_from", req.execution_id,
                     req.step, req.task, now),
                )
            self._event(
                tx, EV_REGISTERED, loc.tenant, loc.project, resource_id, full.uri, p.key_id,
                {
                    "urn": full.urn, "version": version, "seq": seq, "kind": kind,
                    "locations": [{"uri": lc.uri, "role": lc.role, "checksum": lc.checksum} for lc in locations],
                    "inputs": [u for _, u in inputs], "execution_id": req.execution_id, "step": req.step,
                },
            )
        return Resource(
            resource_id=resource_id, uri=full.uri, urn=full.urn, series=loc.series, tenant=loc.tenant,
            project=loc.project, namespace=loc.namespace, type=loc.type, name=loc.name, version=version, seq=seq,
            kind=kind, status="active", home_shard=shard, metadata=req.metadata, locations=locations,
            created_at=now, created_by=p.key_id, execution_id=req.execution_id, step=req.step, task=req.task,
        )

    def _idempotent_or_conflict(self, tx: Tx, row: Sequence[Any], req: RegisterRequest) -> Resource:
        locations = self._locations(tx, [row[0]])[row[0]]
        same = {(lc.uri, lc.checksum) for lc in locations} == {(s.uri, s.checksum) for s in req.locations}
        if not same:
            raise Conflict(f"{row[1]} is already registered with other locations")
        return self._resource_from_row(row, locations)

    # --------------------------------------------------------------- reading
    def get(self, p: Principal, resource_id: str) -> Resource:
        with self.store.read() as tx:
            row = tx.one(f"SELECT {_RESOURCE_COLS} FROM registry_resource WHERE resource_id = ?", (resource_id,))
            if row is None:  # ids are random, so "not found" reveals no names
                raise NotFound(f"no resource {resource_id!r}")
            loc = ResourceLocator(row[3], row[4], row[5], row[6], row[7], row[8])
            if self._can_read(tx, p, loc, row[0]):
                return self._resource_from_row(row, self._locations(tx, [row[0]])[row[0]])
        self._audit(p, "get", False, row[1], loc, "no live grant")
        raise Forbidden(f"{p.label} may not read {row[1]}")

    def _can_read(self, tx: Tx, p: Principal, loc: ResourceLocator, resource_id: str) -> bool:
        try:
            self._authorize(tx, p, loc, resource_id, "read")
            return True
        except Forbidden:
            return False

    def resolve(
        self, p: Principal, uri: str, *, purpose: str = "read", region: str | None = None
    ) -> AccessPlan:
        loc = _locator(uri, require_version=False)
        owned = self._owns(p, loc.tenant, loc.project)
        with self.store.read() as tx:
            row, locations = self._find_with_locations(tx, loc)
            grant_id = None
            if not owned:
                grant_id = self._grant_for(tx, p, loc.series, row[0] if row else None, ("read", "write"))
        if not owned:
            allowed = row is not None and grant_id is not None
            reason = f"grant {grant_id}" if allowed else "no live grant"
            self._audit(p, f"resolve:{purpose}", allowed, row[1] if row else loc.uri, loc, reason)
            if not allowed:
                raise Forbidden(f"{p.label} may not read {loc.uri}: no live grant")
        if row is None:
            raise NotFound(f"{loc.uri} is not registered")
        chosen = _choose_location(locations, region or self.region)
        return AccessPlan(
            allowed=True, resource_id=row[0], uri=row[1],
            urn=ResourceLocator(row[3], row[4], row[5], row[6], row[7], row[8]).urn, version=row[8], kind=row[10],
            status=row[11], location=chosen, locations=locations,
            expected_checksum=chosen.checksum if chosen else None, size_bytes=chosen.size_bytes if chosen else None,
            format=chosen.format if chosen else None, rows=chosen.rows if chosen else None,
            schema_fingerprint=chosen.schema_fingerprint if chosen else None, metadata=_unjson(row[13]),
            via_grant=grant_id,
        )

    def add_location(self, p: Principal, resource_id: str, spec: LocationIn) -> Location:
        try:
            return self._add_location(p, resource_id, spec)
        except Forbidden as e:
            self._audit(p, "add_location", False, resource_id, None, e.message)
            raise

    def _add_location(self, p: Principal, resource_id: str, spec: LocationIn) -> Location:
        now = iso(utc_now())
        with self.store.write() as tx:
            row = tx.one(f"SELECT {_RESOURCE_COLS} FROM registry_resource WHERE resource_id = ?", (resource_id,))
            if row is None:
                raise NotFound(f"no resource {resource_id!r}")
            loc = ResourceLocator(row[3], row[4], row[5], row[6], row[7], row[8])
            self._authorize(tx, p, loc, resource_id, "write")
            has_primary = tx.one(
                "SELECT 1 FROM registry_location WHERE resource_id = ? AND role = 'primary'", (resource_id,)
            )
            role = spec.role or ("replica" if has_primary else "primary")
            if role == "primary" and has_primary:
                raise InvalidRequest(f"{row[1]} already has a primary location; add a replica")
            location = self._insert_location(tx, resource_id, loc, spec, role, now)
            name = EV_REPLICA_AVAILABLE if role == "replica" else EV_LOCATION_ADDED
            self._event(
                tx, name, loc.tenant, loc.project, resource_id, row[1], p.key_id,
                {"location_id": location.location_id, "uri": location.uri, "role": role, "region": location.region,
                 "checksum": location.checksum},
            )
        return location

    # ---------------------------------------------------------------- grants
    def grant(self, p: Principal, req: GrantRequest) -> Grant:
        loc = _locator(req.resource_uri, require_version=False)
        if loc.version == LATEST:
            raise InvalidRequest("grant a version (…@v3) or the unversioned URI (every version), not 'latest'")
        subject_tenant, subject_project, subject = parse_subject(req.subject)
        if not self._owns(p, loc.tenant, loc.project):
            self._audit(p, "grant", False, loc.uri, loc, "not the owner")
            raise Forbidden(f"{p.label} may not grant access to {loc.uri}: only its owner can")
        now = iso(utc_now())
        expires = iso(req.expires_at) if req.expires_at else None
        with self.store.write() as tx:
            resource_id = None
            if loc.version is not None:
                row = self._find(tx, loc)
                if row is None:
                    raise NotFound(f"{loc.uri} is not registered")
                resource_id = row[0]
            grant_id = "grt_" + uuid7().replace("-", "")
            tx.exec(
                "INSERT INTO registry_grant (grant_id, owner_tenant, owner_project, target_uri, series_id, resource_id,"
                " subject, subject_tenant, subject_project, permission, purpose, conditions, expires_at, created_at,"
                " created_by) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (grant_id, loc.tenant, loc.project, loc.uri, loc.series, resource_id, subject, subject_tenant,
                 subject_project, req.permission, req.purpose, _json(req.conditions), expires, now, p.key_id),
            )
            self._event(
                tx, EV_GRANT_CREATED, loc.tenant, loc.project, resource_id, loc.uri, p.key_id,
                {"grant_id": grant_id, "subject": subject, "permission": req.permission, "expires_at": expires},
            )
        return Grant(
            grant_id=grant_id, resource_uri=loc.uri, resource_id=resource_id, subject=subject,
            permission=req.permission, purpose=req.purpose, conditions=req.conditions, expires_at=expires,
            created_at=now, created_by=p.key_id, revoked_at=None, active=expires is None or expires > now,
        )

    def _grant_from_row(self, r: Sequence[Any]) -> Grant:
        now = iso(utc_now())
        return Grant(
            grant_id=r[0], resource_uri=r[1], resource_id=r[2], subject=r[3], permission=r[4], purpose=r[5],
            conditions=_unjson(r[6]), expires_at=r[7], created_at=r[8], created_by=r[9], revoked_at=r[10],
            active=r[10] is None and (r[7] is None or r[7] > now),
        )

    def revoke(self, p: Principal, grant_id: str) -> Grant:
        now = iso(utc_now())
        with self.store.write() as tx:
            row = tx.one(
                f"SELECT {_GRANT_COLS}, owner_tenant, owner_project, series_id FROM registry_grant WHERE grant_id = ?",
                (grant_id,),
            )
            if row is None or not self._owns(p, row[11], row[12]):
                # the same answer for "missing" and "not yours": no probing of other tenants' grant ids
                raise NotFound(f"no grant {grant_id!r}")
            if row[10] is None:
                tx.exec("UPDATE registry_grant SET revoked_at = ? WHERE grant_id = ?", (now, grant_id))
                self._event(
                    tx, EV_GRANT_REVOKED, row[11], row[12], row[2], row[1], p.key_id,
                    {"grant_id": grant_id, "subject": row[3]},
                )
                row = (*row[:10], now, *row[11:])
        return self._grant_from_row(row)

    def list_grants(self, p: Principal, resource_uri: str | None = None, *, include_inactive: bool = False) -> list[Grant]:
        sql = f"SELECT {_GRANT_COLS} FROM registry_grant WHERE owner_tenant = ?"
        params: list[Any] = [p.tenant]
        if p.project is not None:
            sql += " AND owner_project = ?"
            params.append(p.project)
        if resource_uri:
            loc = _locator(resource_uri, require_version=False)
            sql += " AND series_id = ?"
            params.append(loc.series)
        with self.store.read() as tx:
            rows = tx.all(sql + " ORDER BY created_at, grant_id", params)
        grants = [self._grant_from_row(r) for r in rows]
        return grants if include_inactive else [g for g in grants if g.active]

    # --------------------------------------------------------------- lineage
    def lineage(self, p: Principal, resource_id: str, direction: str = "up", depth: int = 1) -> Lineage:
        if direction not in ("up", "down"):
            raise InvalidRequest("direction must be 'up' or 'down'")
        depth = max(1, min(int(depth), MAX_LINEAGE_DEPTH))
        me = self.get(p, resource_id)  # checks access (and audits a denial)
        near, far = ("output_resource_id", "input_resource_id") if direction == "up" else (
            "input_resource_id", "output_resource_id")
        edges: list[LineageEdge] = []
        hidden = 0
        seen = {resource_id}
        frontier = [resource_id]
        with self.store.read() as tx:
            for level in range(1, depth + 1):
                if not frontier:
                    break
                rows = tx.all(
                    f"SELECT r.resource_id, r.uri, r.tenant_id, r.project_id, r.namespace, r.resource_type, r.name,"
                    f" r.version, r.kind, l.relationship, l.execution_id, l.step, l.task"
                    f" FROM registry_lineage l JOIN registry_resource r ON r.resource_id = l.{far}"
                    f" WHERE l.{near} IN ({','.join('?' * len(frontier))}) ORDER BY l.created_at, r.resource_id",
                    frontier,
                )
                frontier = []
                for r in rows:
                    if r[0] in seen:
                        continue
                    seen.add(r[0])
                    loc = ResourceLocator(r[2], r[3], r[4], r[5], r[6], r[7])
                    if not self._can_read(tx, p, loc, r[0]):
                        hidden += 1
                        continue
                    frontier.append(r[0])
                    edges.append(LineageEdge(
                        resource=ResourceSummary(resource_id=r[0], uri=r[1], version=r[7], kind=r[8]),
                        depth=level, relationship=r[9], execution_id=r[10], step=r[11], task=r[12],
                    ))
        return Lineage(resource_id=resource_id, uri=me.uri, direction=direction, edges=edges,  # type: ignore[arg-type]
                       hidden=hidden)

    # ------------------------------------------------------------ list/search
    def list_resources(
        self,
        p: Principal,
        *,
        tenant: str | None = None,
        project: str | None = None,
        namespace: str | None = None,
        type: str | None = None,
        q: str | None = None,
        latest_only: bool = False,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Resource]:
        """Resources the caller may read: its own scope plus what live grants share with it."""
        limit = max(1, min(int(limit), MAX_PAGE))
        now = iso(utc_now())
        own = "(r.tenant_id = ?" + (" AND r.project_id = ?)" if p.project else ")")
        own_params: list[Any] = [p.tenant] + ([p.project] if p.project else [])
        shared = (
            "EXISTS (SELECT 1 FROM registry_grant g WHERE g.series_id = r.series_id"
            " AND (g.resource_id IS NULL OR g.resource_id = r.resource_id) AND g.subject_tenant = ?"
            " AND g.revoked_at IS NULL AND (g.expires_at IS NULL OR g.expires_at > ?)"
            + (" AND (g.subject_project IS NULL OR g.subject_project = ?)" if p.project else "")
            + ")"
        )
        shared_params: list[Any] = [p.tenant, now] + ([p.project] if p.project else [])
        sql = f"SELECT {', '.join('r.' + c.strip() for c in _RESOURCE_COLS.split(','))} FROM registry_resource r"
        sql += f" WHERE ({own} OR {shared})"
        params = own_params + shared_params
        for col, value in (("tenant_id", tenant), ("project_id", project), ("namespace", namespace),
                           ("resource_type", type)):
            if value:
                sql += f" AND r.{col} = ?"
                params.append(value)
        if q:
            sql += " AND (r.uri LIKE ? ESCAPE '\\' OR r.kind = ?)"
            escaped = q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            params += [f"%{escaped}%", q]
        if latest_only:
            sql += " AND r.seq = (SELECT s.last_seq FROM registry_series s WHERE s.series_id = r.series_id)"
        sql += " ORDER BY r.series_id, r.seq LIMIT ? OFFSET ?"
        params += [limit, max(0, int(offset))]
        with self.store.read() as tx:
            rows = tx.all(sql, params)
            locations = self._locations(tx, [r[0] for r in rows])
        return [self._resource_from_row(r, locations[r[0]]) for r in rows]

    # ---------------------------------------------------------------- events
    def events(self, p: Principal, after: int = 0, limit: int = 100) -> EventPage:
        limit = max(1, min(int(limit), MAX_PAGE))
        sql = "SELECT seq, event_id, name, tenant_id, project_id, resource_id, uri, actor, ts, data FROM registry_event"
        sql += " WHERE tenant_id = ? AND seq > ?"
        params: list[Any] = [p.tenant, int(after)]
        if p.project is not None:
            sql += " AND project_id = ?"
            params.append(p.project)
        with self.store.read() as tx:
            rows = tx.all(sql + " ORDER BY seq LIMIT ?", [*params, limit])
        events = [
            CatalogEvent(seq=int(r[0]), event_id=r[1], name=r[2], tenant=r[3], project=r[4], resource_id=r[5],
                         uri=r[6], actor=r[7], ts=r[8], data=_unjson(r[9]))
            for r in rows
        ]
        return EventPage(events=events, next_after=events[-1].seq if events else int(after))

    def all_events(self, after: int = 0, limit: int = 1000) -> EventPage:
        """Every tenant's events: for trusted in-process consumers (replicators, exporters)."""
        with self.store.read() as tx:
            rows = tx.all(
                "SELECT seq, event_id, name, tenant_id, project_id, resource_id, uri, actor, ts, data"
                " FROM registry_event WHERE seq > ? ORDER BY seq LIMIT ?",
                (int(after), max(1, min(int(limit), 10_000))),
            )
        events = [
            CatalogEvent(seq=int(r[0]), event_id=r[1], name=r[2], tenant=r[3], project=r[4], resource_id=r[5],
                         uri=r[6], actor=r[7], ts=r[8], data=_unjson(r[9]))
            for r in rows
        ]
        return EventPage(events=events, next_after=events[-1].seq if events else int(after))

    def audit(self, p: Principal, after: int = 0, limit: int = 100) -> AuditPage:
        """Audit entries where the caller's tenant is the actor or the owner."""
        sql = (
            "SELECT seq, ts, action, allowed, reason, uri, actor_key_id, actor_tenant, actor_project, owner_tenant,"
            " owner_project FROM registry_audit WHERE seq > ? AND (actor_tenant = ? OR owner_tenant = ?)"
            " ORDER BY seq LIMIT ?"
        )
        with self.store.read() as tx:
            rows = tx.all(sql, (int(after), p.tenant, p.tenant, max(1, min(int(limit), MAX_PAGE))))
        entries = [
            AuditEntry(seq=int(r[0]), ts=r[1], action=r[2], allowed=bool(r[3]), reason=r[4], uri=r[5],
                       actor_key_id=r[6], actor_tenant=r[7], actor_project=r[8], owner_tenant=r[9],
                       owner_project=r[10])
            for r in rows
        ]
        return AuditPage(entries=entries, next_after=entries[-1].seq if entries else int(after))


def _choose_location(locations: list[Location], region: str | None) -> Location | None:
    """Available before degraded, the caller's region first, then the primary, then the oldest."""
    if not locations:
        return None

    def rank(lc: Location) -> tuple[int, int, int]:
        return (lc.status != "available", lc.region != region, lc.role != "primary")

    return min(locations, key=rank)
