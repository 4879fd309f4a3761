"""Who may do what: API keys, grants, authorisation decisions and the audit log.

Revocation takes effect on the next request, in every process sharing the
database: a key's validation is cached together with the value of the ``auth``
counter, which every key revocation increments in its own transaction; each
authentication reads the counter (one primary-key lookup) and drops cached
answers older than it. Grants are never cached.

Grant expiry is compared as an instant (``expires_ts``: timestamptz on
Postgres, epoch microseconds on SQLite), never as text.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any

from noetl_dagster.dsl.locator import InvalidLocator, ResourceLocator, check_scope
from noetl_dagster.engine.events import uuid7
from noetl_registry.common import (
    EV_GRANT_CREATED,
    EV_GRANT_REVOKED,
    EV_KEY_CREATED,
    EV_KEY_REVOKED,
    GRANT_COLS,
    KEY_PREFIX,
    LATEST,
    MAX_CURSOR,
    MAX_PAGE,
    RegistryBase,
    check_int,
    check_json_size,
    check_text,
    from_json,
    hash_secret,
    instant,
    locator,
    parse_subject,
    to_json,
)
from noetl_registry.errors import Forbidden, InvalidRequest, NotFound, Unauthorized
from noetl_registry.models import (
    ApiKeyInfo,
    AuditEntry,
    AuditPage,
    Grant,
    GrantRequest,
    Principal,
    iso,
    utc_now,
)
from noetl_registry.store import Tx

ADMIN = "admin"  # actor key id of key management done in-process (the CLI)
_GRANT_SELECT = (
    f"SELECT {GRANT_COLS}, CASE WHEN revoked_at IS NULL AND (expires_ts IS NULL OR expires_ts > ?)"
    " THEN 1 ELSE 0 END"
)


class AccessControl(RegistryBase):
    """API keys, grants, authorisation and the audit log."""

    _key_cache: dict[str, tuple[int, float, Principal]]
    _key_cache_ttl: float
    _cache_lock: threading.Lock

    # ------------------------------------------------------------------ keys
    def create_api_key(
        self, tenant: str, project: str | None = None, *, label: str | None = None
    ) -> tuple[str, str]:
        """Create a key; returns (key_id, the key text). Only its hash is stored."""
        try:
            check_scope(tenant, "tenant")
            if project is not None:
                check_scope(project, "project")
        except InvalidLocator as e:
            raise InvalidRequest(str(e)) from e
        check_text(label, "label", self.limits.max_text)
        key_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        now = iso(utc_now())
        with self.store.write() as tx:
            tx.exec(
                "INSERT INTO registry_api_key (key_id, secret_hash, tenant_id, project_id, label, created_at)"
                " VALUES (?,?,?,?,?,?)",
                (key_id, hash_secret(secret), tenant, project, label, now),
            )
            self._event(
                tx,
                EV_KEY_CREATED,
                tenant,
                project or "",
                None,
                None,
                key_id,
                {"key_id": key_id, "project": project, "label": label},
            )
            admin = Principal(tenant=tenant, project=project, key_id=ADMIN)
            self._audit(admin, "key:create", True, None, tenant, project, f"key {key_id} created", tx)
        return key_id, f"{KEY_PREFIX}_{key_id}_{secret}"

    def revoke_api_key(self, key_id: str) -> None:
        check_text(key_id, "key_id", self.limits.max_text)
        now = iso(utc_now())
        with self.store.write() as tx:
            row = tx.one("SELECT tenant_id, project_id FROM registry_api_key WHERE key_id = ?", (key_id,))
            if row is not None:
                tx.exec(
                    "UPDATE registry_api_key SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL",
                    (now, key_id),
                )
                tx.next_value("auth")  # every process's key cache is stale from this commit on
                self._event(tx, EV_KEY_REVOKED, row[0], row[1] or "", None, None, key_id, {"key_id": key_id})
                admin = Principal(tenant=row[0], project=row[1], key_id=ADMIN)
                self._audit(admin, "key:revoke", True, None, row[0], row[1], f"key {key_id} revoked", tx)
        if row is None:
            self._audit(
                Principal(tenant="", key_id=ADMIN),
                "key:revoke",
                False,
                None,
                None,
                None,
                f"no api key {key_id!r}",
            )
            raise NotFound(f"no api key {key_id!r}")
        with self._cache_lock:
            self._key_cache.clear()

    def list_api_keys(self, tenant: str | None = None) -> list[ApiKeyInfo]:
        sql = "SELECT key_id, tenant_id, project_id, label, created_at, revoked_at FROM registry_api_key"
        params: list[Any] = []
        if tenant:
            sql += " WHERE tenant_id = ?"
            params.append(check_text(tenant, "tenant", self.limits.max_text))
        with self.store.read() as tx:
            rows = tx.all(sql + " ORDER BY created_at", params)
        return [
            ApiKeyInfo(key_id=r[0], tenant=r[1], project=r[2], label=r[3], created_at=r[4], revoked_at=r[5])
            for r in rows
        ]

    def authenticate(self, api_key: str | None) -> Principal:
        if not api_key:
            raise Unauthorized("missing API key (Authorization: Bearer <key>)")
        if len(api_key) > 200 or not api_key.isascii():
            raise Unauthorized("malformed API key")
        now = time.monotonic()
        with self.store.read() as tx:
            # the epoch first: a revocation committing after this read bumps it past what we cache
            epoch_row = tx.one("SELECT value FROM registry_counter WHERE name = 'auth'")
            epoch = int(epoch_row[0]) if epoch_row else 0
            with self._cache_lock:
                hit = self._key_cache.get(api_key)
            if hit and hit[0] == epoch and hit[1] > now:
                return hit[2]
            prefix, _, rest = api_key.partition("_")
            key_id, _, secret = rest.partition("_")
            if prefix != KEY_PREFIX or not key_id or not secret or "\x00" in api_key:
                raise Unauthorized("malformed API key")
            row = tx.one(
                "SELECT secret_hash, tenant_id, project_id, revoked_at FROM registry_api_key WHERE key_id = ?",
                (key_id,),
            )
        if row is None or row[3] is not None or not hmac.compare_digest(row[0], hash_secret(secret)):
            raise Unauthorized("unknown or revoked API key")
        principal = Principal(tenant=row[1], project=row[2], key_id=key_id)
        with self._cache_lock:
            if len(self._key_cache) > 10_000:
                self._key_cache.clear()
            self._key_cache[api_key] = (epoch, now + self._key_cache_ttl, principal)
        return principal

    # ------------------------------------------------------------ decisions
    def _grant_for(
        self, tx: Tx, p: Principal, series: str, resource_id: str | None, permissions: Sequence[str]
    ) -> str | None:
        """The id of a live grant letting ``p`` act on the resource, or None."""
        sql = (
            "SELECT grant_id FROM registry_grant WHERE series_id = ? AND subject_tenant = ?"
            " AND revoked_at IS NULL AND (expires_ts IS NULL OR expires_ts > ?)"
            f" AND permission IN ({','.join('?' * len(permissions))})"
        )
        params: list[Any] = [series, p.tenant, instant(tx.dialect, utc_now()), *permissions]
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

    def may_read(self, p: Principal, uri: str) -> bool:
        """Whether ``p`` may read every version of ``uri`` (its owner, or a live grant on the
        unversioned URI), registered or not: the payload locator's question for a reference of
        another tenant (noetl_dagster/storage/locator.py). A cross-scope answer is audited."""
        loc = locator(uri, require_version=False, max_len=self.limits.max_uri_length)
        if self._owns(p, loc.tenant, loc.project):
            return True
        with self.store.read() as tx:
            grant_id = self._grant_for(tx, p, loc.series, None, ("read", "write"))
        reason = f"grant {grant_id}" if grant_id else "no live grant"
        self._audit(p, "access:read", grant_id is not None, loc.uri, loc.tenant, loc.project, reason,
                    requested=loc.uri)  # fmt: skip
        return grant_id is not None

    def _can_read(self, tx: Tx, p: Principal, loc: ResourceLocator, resource_id: str) -> bool:
        try:
            self._authorize(tx, p, loc, resource_id, "read")
            return True
        except Forbidden:
            return False

    # ---------------------------------------------------------------- grants
    def grant(self, p: Principal, req: GrantRequest) -> Grant:
        loc = locator(req.resource_uri, require_version=False, max_len=self.limits.max_uri_length)
        if loc.version == LATEST:
            raise InvalidRequest(
                "grant a version (…@v3) or the unversioned URI (every version), not 'latest'"
            )
        subject_tenant, subject_project, subject = parse_subject(req.subject)
        check_text(req.purpose, "purpose", self.limits.max_text)
        check_json_size(req.conditions, "conditions", self.limits.max_metadata_bytes)
        if not self._owns(p, loc.tenant, loc.project):
            self._audit(
                p,
                "grant:create",
                False,
                loc.uri,
                loc.tenant,
                loc.project,
                f"not the owner ({subject})",
                requested=loc.uri,
            )
            raise Forbidden(f"{p.label} may not grant access to {loc.uri}: only its owner can")
        now_dt = utc_now()
        now = iso(now_dt)
        expires = iso(req.expires_at) if req.expires_at else None
        with self.store.write() as tx:
            resource_id = None
            if loc.version is not None:
                row = tx.one("SELECT resource_id FROM registry_resource WHERE uri = ?", (loc.uri,))
                if row is None:
                    raise NotFound(f"{loc.uri} is not registered")
                resource_id = row[0]
            grant_id = "grt_" + uuid7().replace("-", "")
            tx.exec(
                "INSERT INTO registry_grant (grant_id, owner_tenant, owner_project, target_uri, series_id, resource_id,"
                " subject, subject_tenant, subject_project, permission, purpose, conditions, expires_at, expires_ts,"
                " created_at, created_by) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    grant_id,
                    loc.tenant,
                    loc.project,
                    loc.uri,
                    loc.series,
                    resource_id,
                    subject,
                    subject_tenant,
                    subject_project,
                    req.permission,
                    req.purpose,
                    to_json(req.conditions),
                    expires,
                    instant(tx.dialect, req.expires_at) if req.expires_at else None,
                    now,
                    p.key_id,
                ),
            )
            self._event(
                tx,
                EV_GRANT_CREATED,
                loc.tenant,
                loc.project,
                resource_id,
                loc.uri,
                p.key_id,
                {
                    "grant_id": grant_id,
                    "subject": subject,
                    "permission": req.permission,
                    "expires_at": expires,
                },
            )
            self._audit(
                p,
                "grant:create",
                True,
                loc.uri,
                loc.tenant,
                loc.project,
                f"owner; {grant_id} {req.permission} to {subject} until {expires or 'revoked'}",
                tx,
            )
        return Grant(
            grant_id=grant_id,
            resource_uri=loc.uri,
            resource_id=resource_id,
            subject=subject,
            permission=req.permission,
            purpose=req.purpose,
            conditions=req.conditions,
            expires_at=expires,
            created_at=now,
            created_by=p.key_id,
            revoked_at=None,
            active=req.expires_at is None or req.expires_at > now_dt,
        )

    @staticmethod
    def _grant_from_row(r: Sequence[Any]) -> Grant:
        return Grant(
            grant_id=r[0],
            resource_uri=r[1],
            resource_id=r[2],
            subject=r[3],
            permission=r[4],
            purpose=r[5],
            conditions=from_json(r[6]),
            expires_at=r[7],
            created_at=r[8],
            created_by=r[9],
            revoked_at=r[10],
            active=bool(r[11]),
        )

    def revoke(self, p: Principal, grant_id: str) -> Grant:
        check_text(grant_id, "grant_id", self.limits.max_text)
        now = iso(utc_now())
        with self.store.write() as tx:
            row = tx.one(
                f"{_GRANT_SELECT}, owner_tenant, owner_project FROM registry_grant WHERE grant_id = ?",
                (instant(tx.dialect, utc_now()), grant_id),
            )
            if row is not None and self._owns(p, row[12], row[13]):
                if row[10] is None:
                    tx.exec("UPDATE registry_grant SET revoked_at = ? WHERE grant_id = ?", (now, grant_id))
                    tx.next_value("auth")
                    self._event(
                        tx,
                        EV_GRANT_REVOKED,
                        row[12],
                        row[13],
                        row[2],
                        row[1],
                        p.key_id,
                        {"grant_id": grant_id, "subject": row[3]},
                    )
                    row = (*row[:10], now, 0, *row[12:])
                self._audit(
                    p, "grant:revoke", True, row[1], row[12], row[13], f"owner; {grant_id} of {row[3]}", tx
                )
                return self._grant_from_row(row)
        # the same answer for "missing" and "not yours": no probing of other tenants' grant ids;
        # the attempt is audited for the actor and, when the grant exists, for its owner
        reason = f"not the owner of {grant_id}" if row is not None else f"no grant {grant_id}"
        self._audit(
            p,
            "grant:revoke",
            False,
            row[1] if row else None,
            row[12] if row else None,
            row[13] if row else None,
            reason,
            requested=grant_id,
        )
        raise NotFound(f"no grant {grant_id!r}")

    def list_grants(
        self, p: Principal, resource_uri: str | None = None, *, include_inactive: bool = False
    ) -> list[Grant]:
        sql = f"{_GRANT_SELECT} FROM registry_grant WHERE owner_tenant = ?"
        params: list[Any] = [p.tenant]
        if p.project is not None:
            sql += " AND owner_project = ?"
            params.append(p.project)
        if resource_uri:
            loc = locator(resource_uri, require_version=False, max_len=self.limits.max_uri_length)
            sql += " AND series_id = ?"
            params.append(loc.series)
        with self.store.read() as tx:
            rows = tx.all(sql + " ORDER BY created_at, grant_id", [instant(tx.dialect, utc_now()), *params])
        grants = [self._grant_from_row(r) for r in rows]
        return grants if include_inactive else [g for g in grants if g.active]

    # ----------------------------------------------------------------- audit
    def audit(self, p: Principal, after: int = 0, limit: int = 100) -> AuditPage:
        """Audit entries where the caller's tenant is the actor or the owner, as far as it may know them:
        entries about its own tenant's resources in full; its own attempts on other tenants' resources
        in full when they were allowed (it saw the resource then), and when denied only what it asked
        for — never the resource found (its version, its URI behind an id), its owner or the reason,
        which would tell whether it exists."""
        after = check_int(after, "after", 0, MAX_CURSOR)
        limit = max(1, min(check_int(limit, "limit", -MAX_CURSOR, MAX_CURSOR), MAX_PAGE))
        sql = (
            "SELECT seq, ts, action, allowed, reason, uri, actor_key_id, actor_tenant, actor_project, owner_tenant,"
            " owner_project, requested FROM registry_audit WHERE seq > ? AND (actor_tenant = ? OR owner_tenant = ?)"
            " ORDER BY seq LIMIT ?"
        )
        with self.store.read() as tx:
            rows = tx.all(sql, (after, p.tenant, p.tenant, limit))
        entries = [_audit_entry(r, full=r[9] == p.tenant or bool(r[3])) for r in rows]
        return AuditPage(entries=entries, next_after=entries[-1].seq if entries else after)


def _audit_entry(r: Sequence[Any], *, full: bool) -> AuditEntry:
    """One audit row as a caller sees it (see ``AccessControl.audit``)."""
    if full:
        return AuditEntry(
            seq=int(r[0]),
            ts=r[1],
            action=r[2],
            allowed=bool(r[3]),
            reason=r[4],
            uri=r[5],
            actor_key_id=r[6],
            actor_tenant=r[7],
            actor_project=r[8],
            owner_tenant=r[9],
            owner_project=r[10],
        )
    asked = r[11]
    named = asked if asked and asked.startswith(("noetl://", "urn:noetl:")) else None
    reason = "denied" if named or not asked else f"denied: {asked}"  # a call by id names its id
    return AuditEntry(
        seq=int(r[0]),
        ts=r[1],
        action=r[2],
        allowed=False,
        reason=reason,
        uri=named,
        actor_key_id=r[6],
        actor_tenant=r[7],
        actor_project=r[8],
    )
