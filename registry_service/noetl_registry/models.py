"""Typed records of the registry: the HTTP bodies and what both clients return."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

_CHECKSUM_RE = re.compile(r"^(sha256|blake3):[0-9a-f]{64}$")
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
    """One fixed-width UTC text form (the year zero-padded to four digits: ``strftime('%Y')``
    writes year 999 as ``999``, which sorts after ``2026``)."""
    if ts.tzinfo is None:
        raise ValueError("timestamps must carry a timezone")
    u = ts.astimezone(UTC)
    return f"{u.year:04d}-{u.month:02d}-{u.day:02d}T{u.hour:02d}:{u.minute:02d}:{u.second:02d}.{u.microsecond:06d}Z"


MAX_INT64 = 2**63 - 1
MAX_JSON_DEPTH = 32


def _clean_text(v: str) -> str:
    """No text a store cannot keep intact: NUL (Postgres refuses it) or lone surrogates (not UTF-8)."""
    if "\x00" in v:
        raise ValueError("must not contain NUL characters")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("is not valid Unicode (lone surrogate)") from None
    return v


def _clean_json(v: Any, depth: int = 0) -> Any:
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(v, str):
        _clean_text(v)
    elif isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError("numbers must be finite")
    elif isinstance(v, dict):
        for k, item in v.items():
            _clean_text(str(k))
            _clean_json(item, depth + 1)
    elif isinstance(v, list):
        for item in v:
            _clean_json(item, depth + 1)
    return v


Text = Annotated[str, Field(max_length=1024), AfterValidator(_clean_text)]
ShortText = Annotated[str, Field(max_length=256), AfterValidator(_clean_text)]
JsonObject = Annotated[dict[str, Any], AfterValidator(_clean_json)]
Count = Annotated[int, Field(ge=0, le=MAX_INT64)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LocationIn(_Model):
    """A physical copy of a resource."""

    uri: str = Field(description="physical address: file://, s3://, iceberg://, gs://, ...")
    storage_type: ShortText | None = Field(None, description="defaults to the URI scheme")
    region: str = "local"
    storage_class: str = "standard"
    role: LocationRole | None = Field(None, description="primary or replica; the first location is primary")
    checksum: str | None = Field(None, description="sha256:<hex> or blake3:<hex> of the stored bytes")
    size_bytes: Count | None = None
    format: ShortText | None = None
    rows: Count | None = None
    schema_fingerprint: ShortText | None = None
    metadata: JsonObject = Field(default_factory=dict)

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        if not _PHYSICAL_URI_RE.match(v) or v.startswith("noetl://"):
            raise ValueError("location uri must be a physical '<scheme>://...' address without whitespace")
        return _clean_text(v)

    @field_validator("checksum")
    @classmethod
    def _checksum(cls, v: str | None) -> str | None:
        if v is not None and not _CHECKSUM_RE.match(v):
            raise ValueError("checksum must be 'sha256:' or 'blake3:' followed by 64 lowercase hex digits")
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
    uri: Text = Field(
        description="noetl:// or urn:noetl; without a version the registry assigns the next v<N>"
    )
    kind: ShortText | None = Field(None, description="defaults to the resource type of the URI")
    locations: list[LocationIn] = Field(default_factory=list, max_length=1000)
    metadata: JsonObject = Field(default_factory=dict)
    inputs: list[Text] = Field(
        default_factory=list, max_length=10_000, description="noetl:// URIs this resource was derived from"
    )
    execution_id: ShortText | None = None
    step: ShortText | None = None
    task: ShortText | None = None


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
    resource_uri: Text = Field(description="a version (noetl://...@v3) or, unversioned, every version")
    subject: ShortText = Field(description="tenant:<t>, tenant://<t>, project:<t>/<p> or project://<t>/<p>")
    permission: Permission = "read"
    expires_at: datetime | None = Field(
        None, description="RFC 3339 with an offset, years 0001-9999 in UTC; no leap second (':60')"
    )
    purpose: ShortText | None = None
    conditions: JsonObject = Field(default_factory=dict)

    @field_validator("expires_at")
    @classmethod
    def _tz(cls, v: datetime | None) -> datetime | None:
        if v is None:
            return None
        if v.tzinfo is None:
            raise ValueError("expires_at needs a timezone (e.g. 2026-12-31T23:59:59Z)")
        try:
            return v.astimezone(UTC)  # an offset can push 9999-12-31 or 0001-01-01 out of range
        except (OverflowError, ValueError):
            raise ValueError("expires_at is out of range once converted to UTC (years 0001-9999)") from None


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
