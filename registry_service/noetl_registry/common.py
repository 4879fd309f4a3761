"""Shared pieces of the registry's rules: names, limits, row mapping, instants, and the
base class holding the store, the outbox writer and the audit writer."""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from noetl_dagster.dsl.locator import InvalidLocator, ResourceLocator, check_scope, parse_locator
from noetl_dagster.engine.events import uuid7
from noetl_registry.errors import InvalidRequest
from noetl_registry.models import Location, Principal, Resource, iso, utc_now
from noetl_registry.store import RegistryStore, Tx, instant  # noqa: F401 - instant: re-exported

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
MAX_CURSOR = 2**63 - 1  # sequence numbers are BIGINT

RESOURCE_COLS = (
    "resource_id, uri, series_id, tenant_id, project_id, namespace, resource_type, name, version, seq, kind,"
    " status, home_shard, metadata, created_at, created_by, execution_id, step, task"
)
LOCATION_COLS = (
    "location_id, resource_id, storage_uri, storage_type, region, shard_id, storage_class, role, status,"
    " checksum, size_bytes, format, row_count, schema_fingerprint, metadata, created_at"
)
GRANT_COLS = (
    "grant_id, target_uri, resource_id, subject, permission, purpose, conditions, expires_at, created_at,"
    " created_by, revoked_at"
)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


@dataclass(frozen=True)
class Limits:
    """Size limits of one registry (``NOETL_REGISTRY_<FIELD>`` overrides each default)."""

    max_body_bytes: int = 1 << 20  # HTTP request body; 413 above
    max_metadata_bytes: int = 64 << 10  # resource/location metadata and grant conditions, as compact JSON
    max_uri_length: int = 1024  # noetl:// / urn:noetl URIs
    max_locations: int = 64  # locations in one register call
    max_inputs: int = 256  # lineage inputs in one register call
    max_offset: int = 1_000_000  # list offset
    max_text: int = 256  # ids, filters, purposes, regions

    @classmethod
    def from_env(cls) -> Limits:
        return cls(
            **{f: _env_int(f"NOETL_REGISTRY_{f.upper()}", getattr(cls, f)) for f in cls.__dataclass_fields__}
        )


def to_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)


def from_json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_text(value: str | None, what: str, max_len: int) -> str | None:
    """Refuse text no store keeps intact: too long, NUL, lone surrogates (422, never a 500)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"{what}: expected text")
    if len(value) > max_len:
        raise InvalidRequest(f"{what}: longer than {max_len} characters")
    if "\x00" in value:
        raise InvalidRequest(f"{what}: contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(f"{what}: not valid Unicode (lone surrogate)") from None
    return value


def check_int(value: Any, what: str, lo: int, hi: int) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError, OverflowError):
        raise InvalidRequest(f"{what}: expected an integer") from None
    if not lo <= n <= hi:
        raise InvalidRequest(f"{what}: must be between {lo} and {hi}")
    return n


def check_json_size(value: Any, what: str, max_bytes: int) -> None:
    try:
        size = len(json.dumps(value, separators=(",", ":"), allow_nan=False).encode())
    except (ValueError, TypeError, RecursionError) as e:
        raise InvalidRequest(f"{what}: not storable JSON ({e})") from None
    if size > max_bytes:
        raise InvalidRequest(f"{what}: {size} bytes of JSON, more than the limit of {max_bytes}")


def parse_subject(subject: str) -> tuple[str, str | None, str]:
    """``tenant:<t>`` / ``tenant://<t>`` / ``project:<t>/<p>`` / ``project://<t>/<p>``
    -> (tenant, project or None, canonical spelling)."""
    kind, sep, rest = subject.partition(":")
    if not sep:
        raise InvalidRequest(f"grant subject {subject!r}: use tenant:<t> or project:<t>/<p>")
    rest = rest[2:] if rest.startswith("//") else rest
    try:
        if kind == "tenant":
            tenant = check_scope(rest, "tenant")
            return tenant, None, f"tenant:{tenant}"
        if kind == "project":
            tenant, slash, project = rest.partition("/")
            if not slash:
                raise InvalidRequest(
                    f"grant subject {subject!r}: project subjects are project:<tenant>/<project>"
                )
            check_scope(tenant, "tenant")
            check_scope(project, "project")
            return tenant, project, f"project:{tenant}/{project}"
    except InvalidLocator as e:
        raise InvalidRequest(f"grant subject {subject!r}: {e}") from e
    raise InvalidRequest(f"grant subject {subject!r}: the kind must be 'tenant' or 'project'")


def locator(uri: str, *, require_version: bool, max_len: int = 1024) -> ResourceLocator:
    check_text(uri, "uri", max_len)
    try:
        return parse_locator(uri, require_version=require_version)
    except InvalidLocator as e:
        raise InvalidRequest(str(e)) from e


def resource_from_row(row: Sequence[Any], locations: list[Location]) -> Resource:
    loc = ResourceLocator(row[3], row[4], row[5], row[6], row[7], row[8])
    return Resource(
        resource_id=row[0],
        uri=row[1],
        urn=loc.urn,
        series=row[2],
        tenant=row[3],
        project=row[4],
        namespace=row[5],
        type=row[6],
        name=row[7],
        version=row[8],
        seq=int(row[9]),
        kind=row[10],
        status=row[11],
        home_shard=row[12],
        metadata=from_json(row[13]),
        locations=locations,
        created_at=row[14],
        created_by=row[15],
        execution_id=row[16],
        step=row[17],
        task=row[18],
    )


def location_from_row(r: Sequence[Any]) -> Location:
    return Location(
        location_id=r[0],
        resource_id=r[1],
        uri=r[2],
        storage_type=r[3],
        region=r[4],
        shard=r[5],
        storage_class=r[6],
        role=r[7],
        status=r[8],
        checksum=r[9],
        size_bytes=r[10],
        format=r[11],
        rows=r[12],
        schema_fingerprint=r[13],
        metadata=from_json(r[14]),
        created_at=r[15],
    )


def choose_location(locations: list[Location], region: str | None) -> Location | None:
    """Available before degraded, the caller's region first, then the primary, then the oldest."""
    if not locations:
        return None

    def rank(lc: Location) -> tuple[int, int, int]:
        return (lc.status != "available", lc.region != region, lc.role != "primary")

    return min(locations, key=rank)


def finite_json(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite_json(v) for v in value.values())
    if isinstance(value, list):
        return all(finite_json(v) for v in value)
    return True


AuditRow = tuple[Principal, str, bool, str | None, str | None, str | None, str]


class RegistryBase:
    """The store, limits, and the two append-only writers (outbox events, audit entries)."""

    store: RegistryStore
    region: str
    limits: Limits

    @staticmethod
    def _owns(p: Principal, tenant: str, project: str) -> bool:
        return p.tenant == tenant and (p.project is None or p.project == project)

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
            (seq, uuid7(), name, tenant, project, resource_id, uri, actor, iso(utc_now()), to_json(data)),
        )
        return seq

    def _audit(
        self,
        p: Principal,
        action: str,
        allowed: bool,
        uri: str | None,
        owner_tenant: str | None,
        owner_project: str | None,
        reason: str,
        tx: Tx | None = None,
        *,
        requested: str | None = None,
    ) -> None:
        """One audit entry; inside ``tx`` (atomic with the change it records) or in its own transaction.
        ``requested``: what the actor named (a URI as asked, or an id) — all a denied actor may see of it."""
        self._audit_many(
            [(p, action, allowed, uri, owner_tenant, owner_project, reason)], tx, requested=requested
        )

    def _audit_many(
        self, entries: Sequence[AuditRow], tx: Tx | None = None, *, requested: str | None = None
    ) -> None:
        if not entries:
            return
        if tx is None:
            with self.store.write() as own:
                self._audit_many(entries, own, requested=requested)
            return
        now = iso(utc_now())
        for p, action, allowed, uri, owner_tenant, owner_project, reason in entries:
            seq = tx.next_value("audit")
            tx.exec(
                "INSERT INTO registry_audit (seq, ts, action, allowed, reason, uri, actor_key_id, actor_tenant,"
                " actor_project, owner_tenant, owner_project, requested) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    seq,
                    now,
                    action,
                    bool(allowed) if tx.dialect == "postgres" else int(allowed),
                    reason,
                    uri,
                    p.key_id,
                    p.tenant,
                    p.project,
                    owner_tenant,
                    owner_project,
                    requested,
                ),
            )
