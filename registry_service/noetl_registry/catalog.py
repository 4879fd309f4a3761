"""What exists and where: registering resources and locations, resolving URIs, and the outbox.

Every cross-scope decision taken here (allowed through a grant, or denied) is
written to the audit log; allowed writes are audited in their own transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from noetl_dagster.dsl.locator import ResourceLocator, shard_key
from noetl_dagster.engine.events import uuid7
from noetl_registry.catalog_reads import CatalogReads
from noetl_registry.common import (
    EV_LOCATION_ADDED,
    EV_REGISTERED,
    EV_REPLICA_AVAILABLE,
    LATEST,
    LOCATION_COLS,
    MAX_CURSOR,
    MAX_PAGE,
    RESOURCE_COLS,
    AuditRow,
    RegistryBase,
    check_int,
    check_json_size,
    check_text,
    choose_location,
    from_json,
    location_from_row,
    locator,
    resource_from_row,
    to_json,
)
from noetl_registry.errors import Conflict, Forbidden, InvalidRequest, NotFound
from noetl_registry.models import (
    AccessPlan,
    CatalogEvent,
    EventPage,
    Location,
    LocationIn,
    Principal,
    RegisterRequest,
    Resource,
    iso,
    utc_now,
)
from noetl_registry.store import Tx

_N_RESOURCE_COLS = len(RESOURCE_COLS.split(","))
_EVENT_COLS = "seq, event_id, name, tenant_id, project_id, resource_id, uri, actor, ts, data"


def _denied(message: str, loc: ResourceLocator, requested: str) -> Forbidden:
    """A Forbidden that remembers whose resource it was about and what the caller named, for the audit entry."""
    err = Forbidden(message)
    err.audit_uri, err.audit_owner = loc.uri, (loc.tenant, loc.project)  # type: ignore[attr-defined]
    err.audit_requested = requested  # type: ignore[attr-defined]
    return err


def _events(rows: Sequence[Sequence[Any]], after: int) -> EventPage:
    events = [
        CatalogEvent(
            seq=int(r[0]),
            event_id=r[1],
            name=r[2],
            tenant=r[3],
            project=r[4],
            resource_id=r[5],
            uri=r[6],
            actor=r[7],
            ts=r[8],
            data=from_json(r[9]),
        )
        for r in rows
    ]
    return EventPage(events=events, next_after=events[-1].seq if events else after)


class Catalog(CatalogReads):
    """Registering resources, resolving a URI to a location, adding locations; reads are in CatalogReads."""

    def _check_location(self, spec: LocationIn) -> None:
        check_json_size(spec.metadata, "location metadata", self.limits.max_metadata_bytes)

    def _check_register(self, req: RegisterRequest) -> None:
        lim = self.limits
        if len(req.locations) > lim.max_locations:
            raise InvalidRequest(f"locations: at most {lim.max_locations} per call")
        if len(req.inputs) > lim.max_inputs:
            raise InvalidRequest(f"inputs: at most {lim.max_inputs} per call")
        check_json_size(req.metadata, "metadata", lim.max_metadata_bytes)
        for spec in req.locations:
            self._check_location(spec)
        for name in ("kind", "execution_id", "step", "task"):
            check_text(getattr(req, name), name, lim.max_text)

    def _find(self, tx: Tx, loc: ResourceLocator) -> tuple[Any, ...] | None:
        if loc.version is None or loc.version == LATEST:
            return tx.one(
                f"SELECT {RESOURCE_COLS} FROM registry_resource WHERE series_id = ? AND status = 'active'"
                " ORDER BY seq DESC LIMIT 1",
                (loc.series,),
            )
        return tx.one(f"SELECT {RESOURCE_COLS} FROM registry_resource WHERE uri = ?", (loc.uri,))

    def _find_with_locations(
        self, tx: Tx, loc: ResourceLocator
    ) -> tuple[tuple[Any, ...] | None, list[Location]]:
        """The resource and its locations in one round trip (resolve is the hot path)."""
        cols = (
            ", ".join("r." + c.strip() for c in RESOURCE_COLS.split(","))
            + ", "
            + ", ".join("l." + c.strip() for c in LOCATION_COLS.split(","))
        )
        sql = f"SELECT {cols} FROM registry_resource r LEFT JOIN registry_location l ON l.resource_id = r.resource_id"
        if loc.version is None or loc.version == LATEST:
            sql += (
                " WHERE r.resource_id = (SELECT resource_id FROM registry_resource WHERE series_id = ?"
                " AND status = 'active' ORDER BY seq DESC LIMIT 1)"
            )
            key = loc.series
        else:
            sql += " WHERE r.uri = ?"
            key = loc.uri
        rows = tx.all(sql + " ORDER BY l.created_at, l.location_id", (key,))
        if not rows:
            return None, []
        n = _N_RESOURCE_COLS
        locations = [location_from_row(r[n:]) for r in rows if r[n] is not None]
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
            f"INSERT INTO registry_location ({LOCATION_COLS}) VALUES ({','.join('?' * 16)})",
            (
                location.location_id,
                resource_id,
                location.uri,
                location.storage_type,
                location.region,
                location.shard,
                location.storage_class,
                location.role,
                location.status,
                location.checksum,
                location.size_bytes,
                location.format,
                location.rows,
                location.schema_fingerprint,
                to_json(location.metadata),
                now,
            ),
        )
        return location

    def _audit_denial(
        self, p: Principal, action: str, e: Forbidden, uri: str | None, owner: ResourceLocator | None
    ) -> None:
        requested = getattr(e, "audit_requested", uri)
        uri = getattr(e, "audit_uri", uri)
        tenant, project = getattr(e, "audit_owner", (owner.tenant, owner.project) if owner else (None, None))
        self._audit(p, action, False, uri, tenant, project, e.message, requested=requested)

    # -------------------------------------------------------------- register
    def register(self, p: Principal, req: RegisterRequest) -> Resource:
        loc = locator(req.uri, require_version=False, max_len=self.limits.max_uri_length)
        if loc.version == LATEST:
            raise InvalidRequest(
                "'latest' is an alias for resolving; register without a version or with a new one"
            )
        self._check_register(req)
        kind = req.kind or loc.type
        primaries = [spec for spec in req.locations if spec.role == "primary"]
        if len(primaries) > 1:
            raise InvalidRequest("at most one primary location")
        now = iso(utc_now())
        try:
            return self._register(p, req, loc, kind, primaries, now)
        except Forbidden as e:
            self._audit_denial(p, "register", e, loc.uri, loc)
            raise

    def _register(
        self,
        p: Principal,
        req: RegisterRequest,
        loc: ResourceLocator,
        kind: str,
        primaries: list[LocationIn],
        now: str,
    ) -> Resource:
        with self.store.write() as tx:
            audits: list[AuditRow] = []
            grant_id = self._authorize(tx, p, loc, None, "write")
            if grant_id is not None:
                audits.append((p, "register", True, loc.uri, loc.tenant, loc.project, f"grant {grant_id}"))
            if loc.version is not None:
                existing = self._find(tx, loc)
                if existing is not None:
                    self._audit_many(audits, tx)
                    return self._idempotent_or_conflict(tx, existing, req)
            inputs: list[tuple[str, str]] = []
            for text in req.inputs:
                in_loc = locator(text, require_version=False, max_len=self.limits.max_uri_length)
                row = self._find(tx, in_loc)
                if row is None:
                    if self._owns(p, in_loc.tenant, in_loc.project):
                        raise NotFound(f"input {text} is not registered")
                    # the same answer as for an input that exists: no probing of other tenants' names
                    raise _denied(f"{p.label} may not read {in_loc.uri}: no live grant", in_loc, in_loc.uri)
                try:
                    in_grant = self._authorize(tx, p, in_loc, row[0], "read")
                except Forbidden as e:
                    raise _denied(e.message, in_loc, in_loc.uri) from None
                if in_grant is not None:
                    audits.append(
                        (
                            p,
                            "register:input",
                            True,
                            row[1],
                            in_loc.tenant,
                            in_loc.project,
                            f"grant {in_grant}",
                        )
                    )
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
                f"INSERT INTO registry_resource ({RESOURCE_COLS}) VALUES ({','.join('?' * 19)})",
                (
                    resource_id,
                    full.uri,
                    loc.series,
                    loc.tenant,
                    loc.project,
                    loc.namespace,
                    loc.type,
                    loc.name,
                    version,
                    seq,
                    kind,
                    "active",
                    shard,
                    to_json(req.metadata),
                    now,
                    p.key_id,
                    req.execution_id,
                    req.step,
                    req.task,
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
                    (
                        "lin_" + uuid7().replace("-", ""),
                        resource_id,
                        input_id,
                        "derived_from",
                        req.execution_id,
                        req.step,
                        req.task,
                        now,
                    ),
                )
            self._event(
                tx,
                EV_REGISTERED,
                loc.tenant,
                loc.project,
                resource_id,
                full.uri,
                p.key_id,
                {
                    "urn": full.urn,
                    "version": version,
                    "seq": seq,
                    "kind": kind,
                    "locations": [
                        {"uri": lc.uri, "role": lc.role, "checksum": lc.checksum} for lc in locations
                    ],
                    "inputs": [u for _, u in inputs],
                    "execution_id": req.execution_id,
                    "step": req.step,
                },
            )
            self._audit_many(audits, tx)
        return Resource(
            resource_id=resource_id,
            uri=full.uri,
            urn=full.urn,
            series=loc.series,
            tenant=loc.tenant,
            project=loc.project,
            namespace=loc.namespace,
            type=loc.type,
            name=loc.name,
            version=version,
            seq=seq,
            kind=kind,
            status="active",
            home_shard=shard,
            metadata=req.metadata,
            locations=locations,
            created_at=now,
            created_by=p.key_id,
            execution_id=req.execution_id,
            step=req.step,
            task=req.task,
        )

    def _idempotent_or_conflict(self, tx: Tx, row: Sequence[Any], req: RegisterRequest) -> Resource:
        locations = self._locations(tx, [row[0]])[row[0]]
        same = {(lc.uri, lc.checksum) for lc in locations} == {(s.uri, s.checksum) for s in req.locations}
        if not same:
            raise Conflict(f"{row[1]} is already registered with other locations")
        return resource_from_row(row, locations)

    def resolve(
        self, p: Principal, uri: str, *, purpose: str = "read", region: str | None = None
    ) -> AccessPlan:
        loc = locator(uri, require_version=False, max_len=self.limits.max_uri_length)
        check_text(purpose, "purpose", self.limits.max_text)
        check_text(region, "region", self.limits.max_text)
        owned = self._owns(p, loc.tenant, loc.project)
        with self.store.read() as tx:
            row, locations = self._find_with_locations(tx, loc)
            grant_id = None
            if not owned:
                grant_id = self._grant_for(tx, p, loc.series, row[0] if row else None, ("read", "write"))
        if not owned:
            allowed = row is not None and grant_id is not None
            reason = f"grant {grant_id}" if allowed else "no live grant"
            self._audit(
                p,
                f"resolve:{purpose}",
                allowed,
                row[1] if row else loc.uri,
                loc.tenant,
                loc.project,
                reason,
                requested=loc.uri,
            )
            if not allowed:
                raise Forbidden(f"{p.label} may not read {loc.uri}: no live grant")
        if row is None:
            raise NotFound(f"{loc.uri} is not registered")
        chosen = choose_location(locations, region or self.region)
        return AccessPlan(
            allowed=True,
            resource_id=row[0],
            uri=row[1],
            urn=ResourceLocator(row[3], row[4], row[5], row[6], row[7], row[8]).urn,
            version=row[8],
            kind=row[10],
            status=row[11],
            location=chosen,
            locations=locations,
            expected_checksum=chosen.checksum if chosen else None,
            size_bytes=chosen.size_bytes if chosen else None,
            format=chosen.format if chosen else None,
            rows=chosen.rows if chosen else None,
            schema_fingerprint=chosen.schema_fingerprint if chosen else None,
            metadata=from_json(row[13]),
            via_grant=grant_id,
        )

    def add_location(self, p: Principal, resource_id: str, spec: LocationIn) -> Location:
        check_text(resource_id, "resource_id", self.limits.max_text)
        self._check_location(spec)
        try:
            return self._add_location(p, resource_id, spec)
        except Forbidden as e:
            self._audit_denial(p, "add_location", e, resource_id, None)
            raise

    def _add_location(self, p: Principal, resource_id: str, spec: LocationIn) -> Location:
        now = iso(utc_now())
        with self.store.write() as tx:
            row = tx.one(
                f"SELECT {RESOURCE_COLS} FROM registry_resource WHERE resource_id = ?", (resource_id,)
            )
            if row is None:
                raise NotFound(f"no resource {resource_id!r}")
            loc = ResourceLocator(row[3], row[4], row[5], row[6], row[7], row[8])
            try:
                grant_id = self._authorize(tx, p, loc, resource_id, "write")
            except Forbidden:  # by id: the answer names the id, not the resource behind it
                raise _denied(
                    f"{p.label} may not write resource {resource_id}: no live grant", loc, resource_id
                ) from None
            has_primary = tx.one(
                "SELECT 1 FROM registry_location WHERE resource_id = ? AND role = 'primary'", (resource_id,)
            )
            role = spec.role or ("replica" if has_primary else "primary")
            if role == "primary" and has_primary:
                raise InvalidRequest(f"{row[1]} already has a primary location; add a replica")
            location = self._insert_location(tx, resource_id, loc, spec, role, now)
            name = EV_REPLICA_AVAILABLE if role == "replica" else EV_LOCATION_ADDED
            self._event(
                tx,
                name,
                loc.tenant,
                loc.project,
                resource_id,
                row[1],
                p.key_id,
                {
                    "location_id": location.location_id,
                    "uri": location.uri,
                    "role": role,
                    "region": location.region,
                    "checksum": location.checksum,
                },
            )
            if grant_id is not None:
                self._audit(p, "add_location", True, row[1], loc.tenant, loc.project, f"grant {grant_id}", tx)
        return location


class CatalogEvents(RegistryBase):
    """The outbox of catalog-change events, read by a cursor."""

    def events(self, p: Principal, after: int = 0, limit: int = 100) -> EventPage:
        after = check_int(after, "after", 0, MAX_CURSOR)
        limit = max(1, min(check_int(limit, "limit", -MAX_CURSOR, MAX_CURSOR), MAX_PAGE))
        sql = f"SELECT {_EVENT_COLS} FROM registry_event WHERE tenant_id = ? AND seq > ?"
        params: list[Any] = [p.tenant, after]
        if p.project is not None:
            sql += " AND project_id = ?"
            params.append(p.project)
        with self.store.read() as tx:
            rows = tx.all(sql + " ORDER BY seq LIMIT ?", [*params, limit])
        return _events(rows, after)

    def all_events(self, after: int = 0, limit: int = 1000) -> EventPage:
        """Every tenant's events: for trusted in-process consumers (replicators, exporters)."""
        after = check_int(after, "after", 0, MAX_CURSOR)
        limit = max(1, min(check_int(limit, "limit", -MAX_CURSOR, MAX_CURSOR), 10_000))
        with self.store.read() as tx:
            rows = tx.all(
                f"SELECT {_EVENT_COLS} FROM registry_event WHERE seq > ? ORDER BY seq LIMIT ?", (after, limit)
            )
        return _events(rows, after)
