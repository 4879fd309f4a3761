"""The object-store payload adapters' shared base (bucket + prefix through an fsspec filesystem)
and the S3-compatible adapter; GCS and Azure are in storage/cloud_stores.py. Registered by scheme
in :data:`~noetl_dagster.storage.payload.PAYLOAD_ADAPTERS`."""

from __future__ import annotations

import os
from typing import IO, Any
from urllib.parse import urlsplit

from noetl_dagster.storage.objstore_usage import s3_config_kwargs
from noetl_dagster.storage.payload import (
    SIDECAR_SUFFIX,
    PayloadNotFound,
    PayloadStore,
    PayloadWriter,
    _check_key,
)


class ObjectPayloadStore(PayloadStore):
    """A bucket (S3, GCS) or container (Azure) with an optional key prefix, through an fsspec
    filesystem ``self.fs``. Subclasses build ``fs``; everything else is shared, so that every
    object-store adapter behaves alike (the compliance suite, tests/storage/test_payload_compliance.py).

    URIs are ``<scheme>://<bucket>/<prefix>/<key>``; ``aliases`` are other schemes naming the same
    objects (``gcs://`` for ``gs://``, ``abfs://`` / ``az://`` for ``azure://``), accepted on read."""

    scheme = ""
    aliases: tuple[str, ...] = ()
    fs: Any
    _options: dict[str, Any]  # the connection options, for sibling()

    def scheme_names(self) -> tuple[str, ...]:
        return (self.scheme, *self.aliases)

    def sibling(self, bucket: str) -> PayloadStore:
        return type(self)(bucket, "", **self._options)

    def _locate(self, bucket: str, prefix: str) -> None:
        if not bucket or "/" in bucket:
            raise ValueError(f"invalid bucket name: {bucket!r}")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if self.prefix:
            _check_key(self.prefix)

    def _full(self, key: str, *, prefix: bool = False) -> str:
        _check_key(key, prefix=prefix)
        return f"{self.bucket}/{self.prefix}/{key}" if self.prefix else f"{self.bucket}/{key}"

    def _path_of(self, uri: str) -> str:
        scheme, sep, path = uri.partition("://")
        if not sep or (scheme != self.scheme and scheme not in self.aliases):
            raise ValueError(f"not a {self.scheme}:// uri: {uri}")
        bucket, _, key = path.partition("/")
        if bucket != self.bucket:
            raise ValueError(f"payload uri outside bucket {self.bucket!r}: {uri}")
        _check_key(key)
        if self.prefix and not key.startswith(self.prefix + "/"):
            raise ValueError(f"payload uri outside prefix {self.prefix!r}: {uri}")
        return path

    def _uri(self, path: str) -> str:
        return f"{self.scheme}://{path}"

    def uri_for(self, key: str) -> str:
        return self._uri(self._full(key, prefix=True))

    def put_bytes(self, key: str, data: bytes) -> str:
        path = self._full(key)
        self.fs.pipe_file(path, data)  # one request: the object appears whole or not at all
        self._forget(path)
        return self._uri(path)

    def get_bytes(self, uri: str) -> bytes:
        try:
            return self.fs.cat_file(self._path_of(uri))
        except FileNotFoundError as e:
            raise PayloadNotFound(f"no payload at {uri}") from e

    def writer(self, key: str, algorithm: str | None = None) -> PayloadWriter:
        path = self._full(key)
        fh = self.fs.open(path, "wb")

        def commit() -> None:
            fh.close()
            self._forget(path)

        def abort() -> None:
            try:
                self._discard(fh)
            finally:
                fh.closed = True  # so that garbage collection does not try to finish it

        # the object becomes visible only when the upload completes on close
        return PayloadWriter(fh, self._uri(path), commit, abort, algorithm)

    def _discard(self, fh: Any) -> None:
        fh.discard()  # aborts the multipart upload (its parts would be billed until a lifecycle rule)

    def open_read(self, uri: str) -> IO[bytes]:
        try:
            return self.fs.open(self._path_of(uri), "rb")
        except FileNotFoundError as e:
            raise PayloadNotFound(f"no payload at {uri}") from e

    def _forget(self, path: str) -> None:
        """Drop fsspec's cached listing of the object's parents (another writer may change them)."""
        self.fs.invalidate_cache(path)

    def exists(self, uri: str) -> bool:
        path = self._path_of(uri)
        self._forget(path)
        return bool(self.fs.exists(path))

    def size(self, uri: str) -> int:
        path = self._path_of(uri)
        self._forget(path)
        try:
            return int(self.fs.size(path))
        except FileNotFoundError as e:
            raise PayloadNotFound(f"no payload at {uri}") from e

    def delete(self, uri: str) -> None:
        path = self._path_of(uri)
        self._forget(path)
        if self.fs.exists(path):
            self.fs.rm_file(path)
        self._forget(path)

    def list(self, prefix: str = "") -> list[str]:
        base = f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket
        want = f"{base}/{prefix}" if prefix else base
        self.fs.invalidate_cache()
        try:
            found = self.fs.find(base)
        except FileNotFoundError:
            return []
        return sorted(self._uri(p) for p in found if p.startswith(want) and not p.endswith(SIDECAR_SUFFIX))

    def owns(self, uri: str) -> bool:
        try:
            self._path_of(uri)
        except ValueError:
            return False
        return True

    def key_of(self, uri: str) -> str | None:
        try:
            key = self._path_of(uri).partition("/")[2]
        except ValueError:
            return None
        return key[len(self.prefix) + 1 :] if self.prefix else key

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "bucket": self.bucket, "prefix": self.prefix}


class S3PayloadStore(ObjectPayloadStore):
    """An S3-compatible bucket (AWS S3, Ceph RGW, SeaweedFS, MinIO, moto) through fsspec/s3fs.

    Credentials and endpoint come from the arguments or the usual AWS environment variables /
    config files (botocore's chain); ``path_style=True`` addresses in-house stores that do not
    serve virtual-host buckets."""

    name = "s3"
    scheme = "s3"
    aliases = ("s3a",)

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        key: str | None = None,
        secret: str | None = None,
        create_bucket: bool = False,
        path_style: bool | None = None,
        storage_class: str | None = None,
        **storage_options: Any,
    ):
        from noetl_dagster.util.extras import require  # noqa: PLC0415

        s3fs = require("s3fs", "an s3:// store")

        self._locate(bucket, prefix)
        self._options = dict(endpoint_url=endpoint_url, region=region, key=key, secret=secret, path_style=path_style,
                             storage_class=storage_class, **storage_options)  # fmt: skip
        client_kwargs = dict(storage_options.pop("client_kwargs", {}) or {})
        region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            client_kwargs.setdefault("region_name", region)
        endpoint_url = (
            endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        )
        self.endpoint_url = endpoint_url
        self.region = region
        self.storage_class = storage_class
        # network bytes of every request go into the running task's usage (storage/objstore_usage.py)
        config_kwargs = s3_config_kwargs(storage_options.pop("config_kwargs", None))
        if path_style is not None:
            config_kwargs.setdefault("s3", {"addressing_style": "path" if path_style else "virtual"})
        if storage_class:
            storage_options.setdefault("s3_additional_kwargs", {"StorageClass": storage_class})
        self.fs = s3fs.S3FileSystem(
            endpoint_url=endpoint_url,
            key=key,
            secret=secret,
            client_kwargs=client_kwargs,
            config_kwargs=config_kwargs,
            **storage_options,
        )
        if create_bucket and not self.fs.exists(self.bucket):
            self.fs.mkdir(self.bucket)

    def locality(self) -> str | None:
        return _locality(self.endpoint_url)


def _locality(endpoint: str | None) -> str | None:
    """``in-cluster`` or ``egress`` for an explicit endpoint (as the usage meter classes its host)."""
    if not endpoint:
        return None
    from noetl_dagster.engine.usage import in_cluster  # noqa: PLC0415

    return (
        "in-cluster"
        if in_cluster(urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}").hostname)
        else "egress"
    )


def _flag(value: Any) -> bool:
    return str(value).lower() in ("1", "true", "yes", "on")


def _credential_record(name: str) -> dict[str, Any]:
    """A stored credential from the keychain's providers (env, credentials file, plug-ins)."""
    from noetl_dagster.engine.keychain import Keychain, KeychainError  # noqa: PLC0415

    try:
        record = Keychain(None).credential(name)
    except KeychainError as e:
        raise ValueError(f"payload store credential {name!r} not found: {e}") from None
    if not record:
        raise ValueError(f"payload store credential {name!r} not found in the keychain")
    return dict(record)


def open_s3(parts: Any, query: dict[str, str], options: dict[str, Any]) -> PayloadStore:
    opts: dict[str, Any] = {}
    for k in ("endpoint_url", "region", "key", "secret", "storage_class"):
        if k in query:
            opts[k] = query.pop(k)
    for k in ("create_bucket", "path_style"):
        if k in query:
            opts[k] = _flag(query.pop(k))
    if "credential" in query:
        rec = _credential_record(query.pop("credential"))
        opts.setdefault("key", rec.get("aws_access_key_id") or rec.get("access_key_id") or rec.get("key"))
        opts.setdefault(
            "secret", rec.get("aws_secret_access_key") or rec.get("secret_access_key") or rec.get("secret")
        )
        for k in ("endpoint_url", "region"):
            if rec.get(k):
                opts.setdefault(k, rec[k])
    if query:
        raise ValueError(f"unknown s3 store parameters: {sorted(query)}")
    opts.update(options)
    return S3PayloadStore(parts.netloc, parts.path.strip("/"), **opts)
