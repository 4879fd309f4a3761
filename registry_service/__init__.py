"""NoETL Resource Registry: resources, locations, grants, lineage and catalog-change events.

- :mod:`registry_service.service` — the rules (tenancy, grants, versions), store-agnostic: the union of
  :mod:`registry_service.access` (keys, grants, decisions, audit) and :mod:`registry_service.catalog`
  (resources, versions, locations, lineage, events)
- :mod:`registry_service.store` — SQL store on SQLite (embedded) or Postgres, with migrations
- :mod:`registry_service.app` — the FastAPI HTTP surface
- :mod:`registry_service.client` — one client interface, in-process or over HTTP (``open_registry``)
"""

from registry_service.errors import (
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    RegistryError,
    Unauthorized,
)

__all__ = [
    "Conflict",
    "Forbidden",
    "InvalidRequest",
    "NotFound",
    "PayloadTooLarge",
    "RegistryError",
    "Unauthorized",
]
