"""Reading the catalog: one resource by id, its lineage, and listing and search.

Every cross-scope read decision (allowed through a grant, or denied) is written to the audit log.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from noetl_dagster.dsl.locator import ResourceLocator
from noetl_registry.access import AccessControl
from noetl_registry.common import (
    LOCATION_COLS,
    MAX_CURSOR,
    MAX_LINEAGE_DEPTH,
    MAX_PAGE,
    RESOURCE_COLS,
    AuditRow,
    check_int,
    check_text,
    instant,
    location_from_row,
    resource_from_row,
)
from noetl_registry.errors import Forbidden, InvalidRequest, NotFound
from noetl_registry.models import (
    Lineage,
    LineageEdge,
    Location,
    Principal,
    Resource,
    ResourceSummary,
    utc_now,
)
from noetl_registry.store import Tx


class CatalogReads(AccessControl):
    """Get, lineage and list: the read side of the catalog."""

    def _locations(self, tx: Tx, resource_ids: Sequence[str]) -> dict[str, list[Location]]:
        out: dict[str, list[Location]] = {rid: [] for rid in resource_ids}
        for i in range(0, len(resource_ids), 500):
            chunk = list(resource_ids[i : i + 500])
            rows = tx.all(
                f"SELECT {LOCATION_COLS} FROM registry_location WHERE resource_id IN ({','.join('?' * len(chunk))})"
                " ORDER BY created_at, location_id",
                chunk,
            )
            for r in rows:
                out[r[1]].append(location_from_row(r))
        return out

    # --------------------------------------------------------------- reading
    def get(self, p: Principal, resource_id: str, *, _action: str = "get") -> Resource:
        check_text(resource_id, "resource_id", self.limits.max_text)
        with self.store.read() as tx:
            row = tx.one(
                f"SELECT {RESOURCE_COLS} FROM registry_resource WHERE resource_id = ?", (resource_id,)
            )
            if row is None:  # ids are random, so "not found" reveals no names
                raise NotFound(f"no resource {resource_id!r}")
            loc = ResourceLocator(row[3], row[4], row[5], row[6], row[7], row[8])
            owned = self._owns(p, loc.tenant, loc.project)
            grant_id = None if owned else self._grant_for(tx, p, loc.series, row[0], ("read", "write"))
            if owned or grant_id is not None:
                resource = resource_from_row(row, self._locations(tx, [row[0]])[row[0]])
        if owned:
            return resource
        if grant_id is not None:
            self._audit(p, _action, True, row[1], loc.tenant, loc.project, f"grant {grant_id}")
            return resource
        self._audit(
            p, _action, False, row[1], loc.tenant, loc.project, "no live grant", requested=resource_id
        )
        raise Forbidden(f"{p.label} may not read resource {resource_id}: no live grant")

    # --------------------------------------------------------------- lineage
    def lineage(self, p: Principal, resource_id: str, direction: str = "up", depth: int = 1) -> Lineage:
        if direction not in ("up", "down"):
            raise InvalidRequest("direction must be 'up' or 'down'")
        depth = max(1, min(check_int(depth, "depth", -MAX_CURSOR, MAX_CURSOR), MAX_LINEAGE_DEPTH))
        me = self.get(p, resource_id, _action="lineage")  # checks access (and audits a cross-scope decision)
        near, far = (
            ("output_resource_id", "input_resource_id")
            if direction == "up"
            else ("input_resource_id", "output_resource_id")
        )
        edges: list[LineageEdge] = []
        audits: list[AuditRow] = []
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
                    if not self._owns(p, loc.tenant, loc.project):
                        grant_id = self._grant_for(tx, p, loc.series, r[0], ("read", "write"))
                        audits.append(
                            (
                                p,
                                "lineage:neighbour",
                                grant_id is not None,
                                r[1],
                                loc.tenant,
                                loc.project,
                                f"grant {grant_id}" if grant_id else "no live grant (hidden)",
                            )
                        )
                        if grant_id is None:
                            hidden += 1
                            continue
                    frontier.append(r[0])
                    edges.append(
                        LineageEdge(
                            resource=ResourceSummary(resource_id=r[0], uri=r[1], version=r[7], kind=r[8]),
                            depth=level,
                            relationship=r[9],
                            execution_id=r[10],
                            step=r[11],
                            task=r[12],
                        )
                    )
        self._audit_many(audits)
        return Lineage(
            resource_id=resource_id,
            uri=me.uri,
            direction=direction,
            edges=edges,  # type: ignore[arg-type]
            hidden=hidden,
        )

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
        """Resources the caller may read: its own scope plus what live grants share with it.
        Each cross-scope resource returned is an audited 'list' decision."""
        limit = max(1, min(check_int(limit, "limit", -MAX_CURSOR, MAX_CURSOR), MAX_PAGE))
        offset = max(0, check_int(offset, "offset", -MAX_CURSOR, self.limits.max_offset))
        for name, value in (
            ("tenant", tenant),
            ("project", project),
            ("namespace", namespace),
            ("type", type),
            ("q", q),
        ):
            check_text(value, name, self.limits.max_text)
        own = "(r.tenant_id = ?" + (" AND r.project_id = ?)" if p.project else ")")
        own_params: list[Any] = [p.tenant] + ([p.project] if p.project else [])
        shared = (
            "EXISTS (SELECT 1 FROM registry_grant g WHERE g.series_id = r.series_id"
            " AND (g.resource_id IS NULL OR g.resource_id = r.resource_id) AND g.subject_tenant = ?"
            " AND g.revoked_at IS NULL AND (g.expires_ts IS NULL OR g.expires_ts > ?)"
            + (" AND (g.subject_project IS NULL OR g.subject_project = ?)" if p.project else "")
            + ")"
        )
        sql = (
            f"SELECT {', '.join('r.' + c.strip() for c in RESOURCE_COLS.split(','))} FROM registry_resource r"
        )
        sql += f" WHERE ({own} OR {shared})"
        filters: list[Any] = []
        for col, value in (
            ("tenant_id", tenant),
            ("project_id", project),
            ("namespace", namespace),
            ("resource_type", type),
        ):
            if value:
                sql += f" AND r.{col} = ?"
                filters.append(value)
        if q:
            sql += " AND (r.uri LIKE ? ESCAPE '\\' OR r.kind = ?)"
            escaped = q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            filters += [f"%{escaped}%", q]
        if latest_only:
            sql += " AND r.seq = (SELECT s.last_seq FROM registry_series s WHERE s.series_id = r.series_id)"
        sql += " ORDER BY r.series_id, r.seq LIMIT ? OFFSET ?"
        with self.store.read() as tx:
            shared_params: list[Any] = [p.tenant, instant(tx.dialect, utc_now())] + (
                [p.project] if p.project else []
            )
            rows = tx.all(sql, own_params + shared_params + filters + [limit, offset])
            locations = self._locations(tx, [r[0] for r in rows])
        self._audit_many(
            [(p, "list", True, r[1], r[3], r[4], "live grant") for r in rows if not self._owns(p, r[3], r[4])]
        )
        return [resource_from_row(r, locations[r[0]]) for r in rows]
