"""The NoETL engine services as a Dagster resource.

    defs = build_playbook_definitions("playbooks/", resource=NoetlResource(data_dir="/var/noetl"))

One resource per code location: the EventStore every op, region and the
token-routing sensor share (an execution's state is the fold of its events in
that store), the payload store for big results, and the tenant/project every
run is tagged with. Services are opened once per process and per
configuration, so the ops of an in-process run share one SQLite connection.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from noetl_dagster.engine.control import Services
from noetl_dagster.resources.runtime import dagster_log_listener, forget_engines
from noetl_dagster.runners.local import build_services, default_data_dir

_lock = threading.Lock()
_SERVICES: dict[tuple[Any, ...], Services] = {}


class NoetlResource(dg.ConfigurableResource):
    """Where NoETL executions run by Dagster keep their event log and payloads."""

    event_store_url: str | None = Field(
        default=None,
        description="EventStore URL (sqlite:///path or postgresql://...); default $NOETL_EVENT_STORE_URL, "
        "else <data_dir>/events.db",
    )
    data_dir: str | None = Field(
        default=None,
        description="payloads, locks and the default event log; default $NOETL_DAGSTER_HOME or ./.noetl",
    )
    tenant: str = Field(default="default", description="tenant recorded on every event and run tag")
    project: str = Field(default="default", description="project recorded on every event and run tag")
    catalog_dirs: list[str] = Field(
        default_factory=list, description="extra directories searched for sub-playbooks by metadata.path"
    )

    def resolved_data_dir(self) -> Path:
        return Path(self.data_dir).expanduser().resolve() if self.data_dir else default_data_dir().resolve()

    def services(self) -> Services:
        """This process's engine services for this configuration (opened once)."""
        key = (
            self.event_store_url,
            str(self.resolved_data_dir()),
            self.tenant,
            self.project,
            tuple(self.catalog_dirs),
        )
        with _lock:
            svc = _SERVICES.get(key)
            if svc is None:
                svc = build_services(
                    event_store=self.event_store_url,
                    data_dir=self.resolved_data_dir(),
                    catalog_dirs=self.catalog_dirs,
                    tenant=self.tenant,
                    project=self.project,
                    listeners=[dagster_log_listener],
                )
                _SERVICES[key] = svc
            return svc

    def registry(self, tenant: str, project: str) -> Any:
        """A registry client for one scope: the one the storage tool kinds write to
        (``$NOETL_REGISTRY_URL``, else ``<data_dir>/registry.db``), for asset metadata and checks."""
        from noetl_registry.client import open_registry  # noqa: PLC0415 - only asset code reads it

        url = os.environ.get("NOETL_REGISTRY_URL") or str(self.resolved_data_dir() / "registry.db")
        return open_registry(
            url, os.environ.get("NOETL_REGISTRY_API_KEY") or None, tenant=tenant, project=project
        )

    def locks_dir(self) -> Path:
        d = self.resolved_data_dir() / "locks"
        d.mkdir(parents=True, exist_ok=True)
        return d


def close_all_services() -> None:
    """Close every cached event store (tests and the demo call this before removing a data dir)."""
    forget_engines()
    with _lock:
        for svc in _SERVICES.values():
            try:
                svc.event_store.close()
            except Exception:  # noqa: BLE001
                pass
        _SERVICES.clear()


def resource_from_env() -> NoetlResource:
    """A resource from the environment (docs/configuration.md): ``NOETL_EVENT_STORE_URL``,
    ``NOETL_DAGSTER_HOME``, ``NOETL_TENANT`` and ``NOETL_PROJECT``."""
    return NoetlResource(
        event_store_url=os.environ.get("NOETL_EVENT_STORE_URL") or None,
        data_dir=os.environ.get("NOETL_DAGSTER_HOME") or None,
        tenant=os.environ.get("NOETL_TENANT", "default"),
        project=os.environ.get("NOETL_PROJECT", "default"),
    )
