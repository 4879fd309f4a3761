"""Typed records of the registry: the HTTP bodies and what both clients return."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

_CHECKSUM_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_PHYSICAL_URI_RE = re.compile(r"^[a-z][a-z0-9+.-]{0,31}://[^\s\x00-\x1f]{1,4000}$")
_REGION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

Permission = Literal["read", "write"]
LocationRole = Literal["primary", "replica"]
LocationStatus = Literal["available", "degraded"]


@dataclass(frozen=True)
class Principal:
    """Who is calling: an API key bound to a tenant and, optionally, one project."""

    tenant: str
    project: str | None = None
    key_id: str | None = None

    @property
    def label(self) -> str:
        scope = f"{self.tenant}/{self.project}" if self.project else self.tenant
        return f"{self.key_id or 'in-process'}@{scope}"


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso(ts: datetime) -> str:
    """One fixed-width UTC text form, so stored timestamps compare as strings."""
    if ts.tzinfo is None:
        raise ValueError("timestamps must carry a timezone")
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LocationIn(_Model):
    """A physical copy of a resource."""

    uri: str = Field(description="physical address: file://, s3://, iceberg://, gs://, ...")
    storage_type: str | None = Field(None, description="defaults to the URI scheme")
    region: str = "local"
    storage_class: str = "standard"
    role: LocationRole | None = Field(None, description="primary or replica; the first location is primary")
    checksum: str | None = Field(None, description="sha256:<hex> of the stored bytes")
    size_bytes: int | None = Field(None, ge=0)
    format: str | None = None
    rows: int | None = Field(None, ge=0)
    schema_fingerprint: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        if not _PHYSICAL_URI_RE.match(v) or v.startswith("noetl://"):
            raise ValueError("location uri must be a physical '<scheme>://...' address without whitespace")
        return v

    @field_validator("checksum")
    @classmethod
    def _checksum(cls, v: str | None) -> str | None:
        if v is not None and not _CHECKSUM_RE.match(v):
            raise ValueError("checksum must be 'sha256:' followed by 64 lowercase hex digits")
        return v

    @field_validator("region", "storage_class")
    @classmethod
    def _simple(cls, v: str) -> str:
        if not _REGION_RE.match(v):
            raise ValueError("letters, digits, '_', '-', '.' only")
        return v


class Location(LocationIn):
    location_id: str
    resource_id: str
    storage_type: str  # type: ignore[assignment]
    role: LocationRole  # type: ignore[assignment]
    status: LocationStatus = "available"
    shard: str | None = None
    created_at: str


class RegisterRequest(_Model):
    uri: str = Field(description="noetl:// or urn:noetl; without a version the registry assigns the next v<N>")
    kind: str | None = Field(None, description="defaults to the resource type of the URI")
    locations: list[LocationIn] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    inputs: list[str] = Field(default_factory=list, description="noetl:// URIs this resource was derived from")
    execution_id: str | None = None
    step: str | None = None
    task: str | None = None


class Resource(_Model):
    resource_id: str
    uri: str
    urn: str
    series: str = Field(description="the unversioned URI shared by every version")
    tenant: str
    project: str
    namespace: str
    type: str
    name: str
    version: str
    seq: int = Field(description="1, 2, 3... in registration order within the series")
    kind: str
    status: str
    home_shard: str
    metadata: dict[str, Any]
    locations: list[Location] = Field(default_factory=list)
    created_at: str
    created_by: str | None = None
    execution_id: str | None = None
    step: str | None = None
    task: str | None = None

    def primary(self) -> Location | None:
        return next((loc for loc in self.locations if loc.role == "primary"), None)


class AccessPlan(_Model):
    """The answer to resolve: may the caller read it, where, and what to expect."""

    allowed: bool
    resource_id: str
    uri: str
    urn: str
    version: str
    kind: str
    status: str
    location: Location | None = Field(None, description="the chosen physical location")
    locations: list[Location] = Field(default_factory=list)
    expected_checksum: str | None = None
    size_bytes: int | None = None
    format: str | None = None
    rows: int | None = None
    schema_fingerprint: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    credential_mode: str = "none"
    via_grant: str | None = Field(None, description="the grant that allowed a cross-scope read")


class GrantRequest(_Model):
    resource_uri: str = Field(description="a version (noetl://...@v3) or, unversioned, every version")
    subject: str = Field(description="tenant:<t>, tenant://<t>, project:<t>/<p> or project://<t>/<p>")
    permission: Permission = "read"
    expires_at: datetime | None = None
    purpose: str | None = None
    conditions: dict[str, Any] = Field(default_factory=dict)

    @field_validator("expires_at")
    @classmethod
    def _tz(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is None:
            raise ValueError("expires_at needs a timezone (e.g. 2026-12-31T23:59:59Z)")
        return v


class Grant(_Model):
    grant_id: str
    resource_uri: str
    resource_id: str | None
    subject: str
    permission: Permission
    purpose: str | None = None
    conditions: dict[str, Any] = Field(default_factory=dict)
    expires_at: str | None = None
    created_at: str
    created_by: str | None = None
    revoked_at: str | None = None
    active: bool


class ResourceSummary(_Model):
    resource_id: str
    uri: str
    version: str
    kind: str


class LineageEdge(_Model):
    resource: ResourceSummary
    depth: int
    relationship: str
    execution_id: str | None = None
    step: str | None = None
    task: str | None = None


class Lineage(_Model):
    resource_id: str
    uri: str
    direction: Literal["up", "down"]
    edges: list[LineageEdge]
    hidden: int = Field(0, description="neighbours the caller may not see")


class CatalogEvent(_Model):
    seq: int
    event_id: str
    name: str
    tenant: str
    project: str
    resource_id: str | None = None
    uri: str | None = None
    actor: str | None = None
    ts: str
    data: dict[str, Any]


class EventPage(_Model):
    events: list[CatalogEvent]
    next_after: int


class AuditEntry(_Model):
    seq: int
    ts: str
    action: str
    allowed: bool
    reason: str | None = None
    uri: str | None = None
    actor_key_id: str | None = None
    actor_tenant: str
    actor_project: str | None = None
    owner_tenant: str | None = None
    owner_project: str | None = None


class AuditPage(_Model):
    entries: list[AuditEntry]
    next_after: int


class ResourcePage(_Model):
    resources: list[Resource]


class ApiKeyInfo(_Model):
    key_id: str
    tenant: str
    project: str | None = None
    label: str | None = None
    created_at: str
    revoked_at: str | None = None


class WhoAmI(_Model):
    key_id: str | None
    tenant: str
    project: str | None
