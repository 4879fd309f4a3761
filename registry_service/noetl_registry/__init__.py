"""NoETL Resource Registry: resources, locations, grants, lineage and catalog-change events.

- :mod:`noetl_registry.service` — the rules (tenancy, grants, versions), store-agnostic: the union of
  :mod:`noetl_registry.access` (keys, grants, decisions, audit) and :mod:`noetl_registry.catalog`
  (resources, versions, locations, lineage, events)
- :mod:`noetl_registry.store` — SQL store on SQLite (embedded) or Postgres, with migrations
- :mod:`noetl_registry.app` — the FastAPI HTTP surface
- :mod:`noetl_registry.client` — one client interface, in-process or over HTTP (``open_registry``)
"""

from noetl_registry.errors import (
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
