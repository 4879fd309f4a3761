"""Payload stores on Google Cloud Storage (gcsfs) and Azure Blob / ADLS Gen2 (adlfs).

Both are :class:`~noetl_dagster.storage.object_stores.ObjectPayloadStore` adapters, registered by URL
scheme in :data:`~noetl_dagster.storage.payload.PAYLOAD_ADAPTERS` and opened with
:func:`~noetl_dagster.storage.payload.open_payload_store`:

- ``gs://bucket[/prefix]?endpoint_url=…&project=…&region=…&credential=NAME&create_bucket=true``;
  ``$STORAGE_EMULATOR_HOST`` points it at an emulator (anonymous, JSON API only).
- ``azure://container[/prefix]`` (also ``abfs://``, ``az://``)``?account_name=…&account_host=…&
  credential=NAME&region=…&create_container=true``; ``$AZURE_STORAGE_CONNECTION_STRING`` (e.g.
  Azurite's) is honoured, as are adlfs's ``AZURE_STORAGE_*`` variables.

``credential`` names a keychain record (env / credentials file / plug-ins): GCS reads
``service_account_json`` or ``token``; Azure reads ``connection_string``, ``account_key``,
``sas_token`` and ``account_name``. Network bytes go into the running task's usage as the S3
adapter's do (storage/objstore_usage.py).
"""

from __future__ import annotations

import json
import os
from typing import Any

from fsspec.asyn import sync

from noetl_dagster.storage.object_stores import ObjectPayloadStore, _credential_record, _flag, _locality
from noetl_dagster.storage.objstore_usage import aiohttp_trace_config, azure_response_hook
from noetl_dagster.storage.payload import PayloadStore


class GCSPayloadStore(ObjectPayloadStore):
    """A Google Cloud Storage bucket through gcsfs (JSON API)."""

    name = "gcs"
    scheme = "gs"
    aliases = ("gcs",)

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        project: str | None = None,
        token: Any = None,
        region: str | None = None,
        storage_class: str | None = None,
        create_bucket: bool = False,
        **storage_options: Any,
    ):
        try:
            import gcsfs.core  # noqa: PLC0415 - optional
        except ImportError:
            raise ValueError("gs:// payload stores need gcsfs: pip install 'noetl-dagster[gcs]'") from None
        self._locate(bucket, prefix)
        self._options = dict(endpoint_url=endpoint_url, project=project, token=token, region=region,
                             storage_class=storage_class, **storage_options)  # fmt: skip
        endpoint = endpoint_url or os.environ.get("STORAGE_EMULATOR_HOST") or None
        if endpoint and "://" not in endpoint:
            endpoint = "http://" + endpoint
        self.endpoint_url = endpoint
        self.region = region
        self.storage_class = storage_class
        kw = dict(storage_options)
        kw["session_kwargs"] = {"trace_configs": [aiohttp_trace_config()], **kw.get("session_kwargs", {})}
        if project:
            kw["project"] = project
        if token is not None:
            kw["token"] = token
        if endpoint:
            kw["endpoint_url"] = endpoint
            kw.setdefault("token", "anon")
            # an emulator serves the JSON API only: the core class, without the experimental
            # zonal/HNS one that probes each bucket's type over gRPC (60 s of retries per call)
            cls: Any = gcsfs.core.GCSFileSystem
        else:
            import gcsfs as _gcsfs  # noqa: PLC0415

            cls = _gcsfs.GCSFileSystem
        self.fs = cls(**kw)
        if create_bucket and not self.fs.exists(self.bucket):
            self.fs.mkdir(self.bucket, **({"location": region} if region else {}))

    def locality(self) -> str | None:
        return _locality(self.endpoint_url)

    def _discard(self, fh: Any) -> None:
        # an unfinalized resumable upload shows no object and expires on its own (a week); its
        # DELETE is retried for ~30 s where unsupported (emulators), so it is not sent
        fh.location = None


class AzurePayloadStore(ObjectPayloadStore):
    """An Azure Blob Storage container (or ADLS Gen2 file system) through adlfs."""

    name = "azure"
    scheme = "azure"
    aliases = ("abfs", "abfss", "az")

    def __init__(
        self,
        container: str,
        prefix: str = "",
        *,
        connection_string: str | None = None,
        account_name: str | None = None,
        account_key: str | None = None,
        sas_token: str | None = None,
        account_host: str | None = None,
        region: str | None = None,
        storage_class: str | None = None,
        create_container: bool = False,
        retry_total: int | None = None,
        **storage_options: Any,
    ):
        try:
            import adlfs  # noqa: PLC0415 - optional
            from azure.storage.blob.aio import BlobServiceClient  # noqa: PLC0415
        except ImportError:
            raise ValueError(
                "azure:// payload stores need adlfs: pip install 'noetl-dagster[azure]'"
            ) from None
        self._locate(container, prefix)
        self._options = dict(connection_string=connection_string, account_name=account_name, account_key=account_key,
                             sas_token=sas_token, account_host=account_host, region=region,
                             storage_class=storage_class, retry_total=retry_total, **storage_options)  # fmt: skip
        conn = connection_string or (
            None if account_name else os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
        )
        self.region = region
        self.storage_class = storage_class
        kw = dict(storage_options)
        for k, v in (("account_name", account_name), ("account_key", account_key), ("sas_token", sas_token),
                     ("account_host", account_host)):  # fmt: skip
            if v:
                kw[k] = v
        self.fs = adlfs.AzureBlobFileSystem(connection_string=conn, **kw)
        # the service client again, with the byte-counting hook (and a retry bound): adlfs builds
        # one without a hook, and every blob and container operation goes through fs.service_client
        client_kw: dict[str, Any] = {"raw_response_hook": azure_response_hook}
        if retry_total is not None:
            client_kw["retry_total"] = retry_total
        # fsspec hands out one cached filesystem per set of arguments: build (and swap in) the client
        # once per connection, closing the one it replaces so that no aiohttp session is left open
        mine = (conn, account_key, sas_token, retry_total)
        if getattr(self.fs, "_noetl_client", None) != mine:
            if conn:
                client = BlobServiceClient.from_connection_string(conn, **client_kw)
            else:
                client = BlobServiceClient(
                    self.fs.account_url, credential=account_key or sas_token or None, **client_kw
                )
            old, self.fs.service_client = self.fs.service_client, client
            self.fs._noetl_client = mine
            try:
                sync(self.fs.loop, old.close)
            except Exception:  # noqa: BLE001 - closing a client that never connected: nothing to release
                pass
        client = self.fs.service_client
        self.endpoint_url = client.url
        if create_container and not self.fs.exists(self.bucket):
            self.fs.mkdir(self.bucket)

    def locality(self) -> str | None:
        return _locality(self.endpoint_url)


def _common(query: dict[str, str]) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    for k in ("region", "storage_class"):
        if k in query:
            opts[k] = query.pop(k)
    return opts


def open_gcs(parts: Any, query: dict[str, str], options: dict[str, Any]) -> PayloadStore:
    opts = _common(query)
    for k in ("endpoint_url", "project"):
        if k in query:
            opts[k] = query.pop(k)
    if "create_bucket" in query:
        opts["create_bucket"] = _flag(query.pop("create_bucket"))
    if "credential" in query:
        rec = _credential_record(query.pop("credential"))
        sa = rec.get("service_account_json") or rec.get("service_account")
        if sa:
            opts["token"] = json.loads(sa) if isinstance(sa, str) else dict(sa)
        elif rec.get("token"):
            opts["token"] = str(rec["token"])
        if rec.get("project_id"):
            opts.setdefault("project", rec["project_id"])
    if query:
        raise ValueError(f"unknown gs store parameters: {sorted(query)}")
    opts.update(options)
    return GCSPayloadStore(parts.netloc, parts.path.strip("/"), **opts)


def open_azure(parts: Any, query: dict[str, str], options: dict[str, Any]) -> PayloadStore:
    opts = _common(query)
    container, _, account = parts.netloc.partition("@")  # abfs://container@account.dfs.core.windows.net/…
    if account:
        opts["account_name"] = account.split(".", 1)[0]
    for k in ("account_name", "account_host"):
        if k in query:
            opts[k] = query.pop(k)
    if "create_container" in query:
        opts["create_container"] = _flag(query.pop("create_container"))
    if "credential" in query:
        rec = _credential_record(query.pop("credential"))
        for k in ("connection_string", "account_key", "sas_token", "account_name", "account_host"):
            if rec.get(k):
                opts.setdefault(k, rec[k])
    if query:
        raise ValueError(f"unknown azure store parameters: {sorted(query)}")
    opts.update(options)
    return AzurePayloadStore(container, parts.path.strip("/"), **opts)
