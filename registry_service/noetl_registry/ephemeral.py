"""Ephemeral catalog rows: generated playbooks (``kind: ephemeral_playbook``, issue 21).

A generated child's row carries its definition (canonical YAML), its content id and the generating
execution (``parent_execution_id``). Once that parent execution is archived (an ``execution_archive``
resource for it exists in the same tenant and project), the row may be deleted: it becomes a
tombstone — status ``deleted``, the definition dropped, a pointer to the archive added — so the URI
and ``playbook_id`` the events hold keep resolving to something that says where the definition went.
"""

from __future__ import annotations

from typing import Any

from noetl_dagster.dsl.locator import ResourceLocator
from noetl_registry.common import RESOURCE_COLS, from_json, resource_from_row, to_json
from noetl_registry.errors import Conflict, Forbidden, NotFound
from noetl_registry.models import Principal, Resource, iso, utc_now
from noetl_registry.store import Tx

EPHEMERAL_KIND = "ephemeral_playbook"
EV_EPHEMERAL_DELETED = "noetl.catalog.resource.ephemeral_deleted"


class EphemeralRows:
    """Mixed into :class:`noetl_registry.service.Registry` (uses its store, authorisation and events)."""

    def delete_ephemeral(self, p: Principal, resource_id: str) -> Resource:
        with self.store.write() as tx:  # type: ignore[attr-defined]
            row = tx.one(
                f"SELECT {RESOURCE_COLS} FROM registry_resource WHERE resource_id = ?", (resource_id,)
            )
            if row is None:
                raise NotFound(f"no resource {resource_id!r}")
            loc = ResourceLocator(row[3], row[4], row[5], row[6], row[7], row[8])
            try:
                self._authorize(tx, p, loc, row[0], "write")  # type: ignore[attr-defined]
            except Forbidden:  # asked by id: the refusal names the id, never the URI behind it
                raise Forbidden(f"{p.label} may not write resource {resource_id}: no live grant") from None
            if row[10] != EPHEMERAL_KIND:
                raise Conflict(
                    f"{row[1]} is a {row[10]!r} resource; only {EPHEMERAL_KIND} rows can be deleted"
                )
            meta: dict[str, Any] = from_json(row[13]) or {}
            if row[11] == "deleted":
                return resource_from_row(row, [])
            parent = meta.get("parent_execution_id")
            archive = _archive_of(tx, loc.tenant, loc.project, parent)
            if archive is None:
                raise Conflict(f"{row[1]}: the generating execution {parent} is not archived yet; "
                               "archive it first (noetl-dagster archive), then delete the row")  # fmt: skip
            tomb = {k: v for k, v in meta.items() if k != "definition"}
            tomb.update(
                {"deleted_at": iso(utc_now()), "archive": archive, "definition_in": "archive bundle events"}
            )
            tx.exec("UPDATE registry_resource SET status = ?, metadata = ? WHERE resource_id = ?",
                    ("deleted", to_json(tomb), row[0]))  # fmt: skip
            self._event(tx, EV_EPHEMERAL_DELETED, loc.tenant, loc.project, row[0], row[1], p.key_id,  # type: ignore[attr-defined]
                        {"playbook_id": meta.get("playbook_id"), "parent_execution_id": parent, "archive": archive})  # fmt: skip
            new = tx.one(
                f"SELECT {RESOURCE_COLS} FROM registry_resource WHERE resource_id = ?", (resource_id,)
            )
            return resource_from_row(new, [])


def _archive_of(tx: Tx, tenant: str, project: str, execution_id: Any) -> str | None:
    if not execution_id:
        return None
    row = tx.one("SELECT uri FROM registry_resource WHERE tenant_id = ? AND project_id = ? AND kind = ? AND execution_id = ?"
                 " ORDER BY seq DESC LIMIT 1", (tenant, project, "execution_archive", str(execution_id)))  # fmt: skip
    return row[0] if row else None
