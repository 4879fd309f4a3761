"""The registry's rules, independent of transport.

Tenancy: every call runs as a :class:`Principal` (an API key bound to a tenant
and optionally one project). A principal *owns* the resources of its tenant
(and of its project, when the key is project-scoped); anything else needs a
live grant (not revoked, not expired). Every cross-scope decision, allowed or
not, and every grant and key change is audited. A cross-scope resolve of a
resource that does not exist is refused exactly like one that exists, so the
registry is no oracle.

Every mutation appends a catalog-change event to the outbox table in the same
transaction (``noetl.catalog.resource.registered``, ``…location_added``,
``…replica_available``, ``…grant_created``, ``…grant_revoked``,
``…api_key_created``, ``…api_key_revoked``).

The rules live in two classes by responsibility:
:class:`noetl_registry.access.AccessControl` (keys, grants, decisions, audit) and
:class:`noetl_registry.catalog.Catalog` (resources, versions, locations, lineage,
listing, events); :class:`Registry` is their union over one store.
"""

from __future__ import annotations

import threading

from noetl_registry.catalog import Catalog, CatalogEvents
from noetl_registry.common import (  # noqa: F401 - re-exported names
    EV_GRANT_CREATED,
    EV_GRANT_REVOKED,
    EV_KEY_CREATED,
    EV_KEY_REVOKED,
    EV_LOCATION_ADDED,
    EV_REGISTERED,
    EV_REPLICA_AVAILABLE,
    KEY_PREFIX,
    LATEST,
    MAX_LINEAGE_DEPTH,
    MAX_PAGE,
    Limits,
    choose_location,
    parse_subject,
)
from noetl_registry.ephemeral import EphemeralRows
from noetl_registry.store import RegistryStore, open_store

_choose_location = choose_location  # the former private name


class Registry(Catalog, CatalogEvents, EphemeralRows):
    """The registry over one store. Thread-safe; share one per process.

    ``key_cache_ttl`` bounds how long a validated key is reused; revocation does
    not wait for it (see :mod:`noetl_registry.access`)."""

    def __init__(
        self,
        store: RegistryStore | str | None = None,
        *,
        region: str = "local",
        key_cache_ttl: float = 10.0,
        limits: Limits | None = None,
    ):
        self.store = store if isinstance(store, RegistryStore) else open_store(store)
        self.region = region
        self.limits = limits or Limits.from_env()
        self._key_cache = {}
        self._key_cache_ttl = key_cache_ttl
        self._cache_lock = threading.Lock()

    def close(self) -> None:
        self.store.close()
