"""The registry and table storage of an execution, as the table tools reach them: ``kind: parquet`` /
``arrow`` / ``iceberg`` (tools/storage.py) and ``kind: ducklake``'s ``register:`` (tools/ducklake.py).
One module both import, so neither imports the other's (a ducklake version read with ``op: read``
goes from tools/storage.py to tools/ducklake.py only)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from noetl_dagster.dsl.locator import InvalidLocator, ResourceLocator
from noetl_dagster.storage.tables import IcebergTables, TableStorage
from noetl_dagster.tools.registry import ToolContext, ToolError

REGISTRY_URL_ENV = "NOETL_REGISTRY_URL"
REGISTRY_KEY_ENV = "NOETL_REGISTRY_API_KEY"


def _data_dir(ctx: ToolContext) -> Path:
    explicit = getattr(ctx, "data_dir", None)
    return Path(explicit or os.environ.get("NOETL_DAGSTER_HOME", ".noetl"))


def _scope(ctx: ToolContext) -> tuple[str, str]:
    return getattr(ctx, "tenant", None) or "default", getattr(ctx, "project", None) or "default"


def _storage(inputs: Mapping[str, Any], ctx: ToolContext) -> TableStorage:
    from noetl_registry.client import open_registry  # noqa: PLC0415

    data_dir = _data_dir(ctx)
    registry_url = inputs.get("registry") or os.environ.get(REGISTRY_URL_ENV) or str(data_dir / "registry.db")
    api_key = inputs.get("api_key") or os.environ.get(REGISTRY_KEY_ENV) or None
    store_url = inputs.get("store") or None
    catalog = inputs.get("catalog") or None
    catalog_name = inputs.get("catalog_name") or "noetl"
    if catalog is not None and not isinstance(catalog, Mapping):
        raise ToolError("catalog must be a mapping of pyiceberg catalog properties", kind="config_error")
    tenant, project = _scope(ctx)
    if api_key:
        ctx.redact(str(api_key))
    key = "noetl.tables:" + repr(
        (registry_url, api_key, tenant, project, store_url, catalog_name, sorted((catalog or {}).items()))
    )

    def build() -> TableStorage:
        client = open_registry(registry_url, api_key, tenant=tenant, project=project)
        iceberg = IcebergTables(catalog_name, catalog, data_dir=data_dir)
        return TableStorage(client, store_url, iceberg=iceberg, data_dir=data_dir)

    return ctx.resource(key, build)


def _target_uri(inputs: Mapping[str, Any], ctx: ToolContext, storage: TableStorage) -> str:
    uri = inputs.get("uri")
    if uri:
        return str(uri)
    name = inputs.get("resource")
    if not name:
        raise ToolError(
            "give the target as uri: noetl://… or as resource: <name> (with optional namespace, type)",
            kind="config_error",
        )
    client = storage.registry
    tenant, project = client.tenant, client.project or _scope(ctx)[1]
    version = inputs.get("version")
    try:
        return ResourceLocator(
            tenant,
            project,
            str(inputs.get("namespace") or "default"),
            str(inputs.get("type") or "dataset"),
            str(name),
            str(version) if version else None,
        ).uri
    except InvalidLocator as e:
        raise ToolError(str(e), kind="config_error") from None
