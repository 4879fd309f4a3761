"""``kind: gcs``: Google Cloud Storage objects through fsspec / gcsfs.

``operation`` (NoETL's ``gcs`` kind is an upload; that is the default when ``source`` is given):

| operation | inputs | result |
|---|---|---|
| ``upload`` | ``source`` (a local file, relative to the execution's work directory), ``destination`` (``gs://bucket/key``), ``content_type``, ``metadata`` | ``{uri, size_bytes, md5?}`` |
| ``download`` | ``source`` (``gs://…``), ``destination`` (local, in the work directory) | ``{path, size_bytes}`` |
| ``write`` | ``destination``, ``data`` (mapping/list -> JSON, string -> text) | ``{uri, size_bytes}`` |
| ``read`` | ``source`` | ``{uri, data, size_bytes}`` (JSON parsed when it is JSON) |
| ``list`` | ``source`` (a prefix) | ``{uris: [...], count}`` |
| ``delete`` | ``source`` | ``{uri, deleted}`` |

Credentials: ``credential`` | ``auth`` names a record with ``service_account_json`` (or ``token``); without one
gcsfs uses Application Default Credentials. ``endpoint`` points gcsfs at an emulator (fake-gcs-server,
gcp-storage-emulator) through gcsfs's JSON-API client. Network bytes of each request go into the task's
measured usage (storage/objstore_usage.py).
Other fsspec URLs (``memory://``, ``file://``) are accepted by the same code path — that is how the
operations are tested (tests/tools/test_gcs.py); write/read through gcsfs run against gcp-storage-emulator
in tests/storage/test_objstore_usage_gcs.py.
Errors: ``not_found``, ``auth_error``, ``gcs_error`` (retryable for 429/5xx-like transport failures).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from noetl_dagster.storage.objstore_usage import aiohttp_trace_config
from noetl_dagster.tools.configs import ToolConfig
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool
from noetl_dagster.tools.shell import work_dir


class GcsConfig(ToolConfig):
    operation: Literal["upload", "download", "write", "read", "list", "delete"] | None = Field(
        None, description="default: upload when source and destination are given, else read"
    )
    source: str | None = Field(None, description="local file (upload) or gs:// URI")
    destination: str | None = Field(None, description="gs:// URI (upload, write) or local file (download)")
    data: Any = Field(None, description="write: the value")
    content_type: str | None = Field(None, description="upload/write: Content-Type")
    metadata: dict[str, str] | None = Field(None, description="upload: object metadata")
    credential: str | None = Field(None, description="credential with service_account_json or token")
    auth: str | dict[str, Any] | None = Field(None, description="alias of credential (or inline)")
    project: str | None = Field(None, description="GCP project")
    endpoint: str | None = Field(None, description="emulator endpoint URL (fake-gcs-server)")


def _fs(uri: str, inputs: Mapping[str, Any], ctx: ToolContext) -> Any:
    import fsspec  # noqa: PLC0415

    protocol = uri.split("://", 1)[0] if "://" in uri else "file"
    if protocol not in ("gs", "gcs"):
        return fsspec.filesystem(protocol)
    try:
        import gcsfs  # noqa: PLC0415
    except ImportError:
        raise ToolError(
            "gcs: gcsfs is not installed (pip install 'noetl-dagster[gcs]')", kind="config_error"
        ) from None
    kw: dict[str, Any] = {}
    auth = inputs.get("credential") or inputs.get("auth")
    record = (
        ctx.credential(auth)
        if isinstance(auth, str) and auth
        else (dict(auth) if isinstance(auth, Mapping) else {})
    )
    sa = record.get("service_account_json") or record.get("service_account")
    if sa:
        kw["token"] = json.loads(sa) if isinstance(sa, str) else dict(sa)
        if isinstance(kw["token"], Mapping) and kw["token"].get("private_key"):
            ctx.redact(str(kw["token"]["private_key"]))
    elif record.get("token"):
        kw["token"] = str(record["token"])
        ctx.redact(kw["token"])
    if inputs.get("endpoint"):
        kw["endpoint_url"] = inputs["endpoint"]
        kw.setdefault("token", "anon")
    if inputs.get("project") or record.get("project_id"):
        kw["project"] = inputs.get("project") or record.get("project_id")
    kw["session_kwargs"] = {"trace_configs": [aiohttp_trace_config()]}  # network bytes into the task's usage
    if inputs.get(
        "endpoint"
    ):  # an emulator serves the JSON API only: no gRPC bucket-type probe (60 s timeouts)
        from gcsfs.core import GCSFileSystem  # noqa: PLC0415

        return GCSFileSystem(**kw)
    return gcsfs.GCSFileSystem(**kw)


def _local(path: str, ctx: ToolContext) -> Path:
    """A local path confined to the execution's work directory (as kind: shell)."""
    base = work_dir(ctx)
    p = Path(path.removeprefix("file://")).expanduser()
    p = (p if p.is_absolute() else base / p).resolve()
    if p != base and base not in p.parents:
        raise ToolError(
            f"gcs: local path {path!r} is outside the execution's work directory {base}", kind="config_error"
        )
    return p


def _parents(fs: Any, uri: str) -> None:
    if not type(fs).__module__.startswith("gcsfs"):  # object stores have no directories; local files do
        fs.makedirs(fs._parent(uri), exist_ok=True)


def _encode(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return value.encode() if isinstance(value, str) else json.dumps(value, default=str).encode()


def _run(op: str, inputs: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    src, dst = inputs.get("source"), inputs.get("destination")
    if op == "upload":
        local = _local(str(src), ctx)
        fs = _fs(str(dst), inputs, ctx)
        _parents(fs, str(dst))
        kw = {
            k: v
            for k, v in (("content_type", inputs.get("content_type")), ("metadata", inputs.get("metadata")))
            if v
        }
        fs.put_file(str(local), str(dst), **(kw if type(fs).__module__.startswith("gcsfs") else {}))
        return {"uri": dst, "size_bytes": local.stat().st_size, "source": str(local)}
    if op == "download":
        local = _local(str(dst), ctx)
        local.parent.mkdir(parents=True, exist_ok=True)
        _fs(str(src), inputs, ctx).get_file(str(src), str(local))
        return {"path": str(local), "size_bytes": local.stat().st_size, "uri": src}
    if op == "write":
        data = _encode(inputs.get("data"))
        fs = _fs(str(dst), inputs, ctx)
        _parents(fs, str(dst))
        with fs.open(str(dst), "wb") as f:
            f.write(data)
        return {"uri": dst, "size_bytes": len(data)}
    fs = _fs(str(src), inputs, ctx)
    if op == "read":
        raw = fs.cat_file(str(src))
        try:
            data: Any = json.loads(raw)
        except ValueError:
            data = raw.decode("utf-8", errors="replace")
        return {"uri": src, "data": data, "size_bytes": len(raw)}
    if op == "list":
        proto = str(src).split("://", 1)[0] + "://" if "://" in str(src) else ""
        uris = sorted(proto + p for p in fs.find(str(src)))
        return {"uris": uris, "count": len(uris)}
    fs.rm(str(src))
    return {"uri": src, "deleted": True}


@register_tool(
    "gcs",
    config=GcsConfig,
    description="Google Cloud Storage objects (gcsfs): upload, download, read, write, list, delete",
)
def gcs_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    """GCS object operations through fsspec/gcsfs."""
    op = inputs.get("operation") or (
        "upload" if inputs.get("source") and inputs.get("destination") else "read"
    )
    need = {
        "upload": ("source", "destination"),
        "download": ("source", "destination"),
        "write": ("destination",),
        "read": ("source",),
        "list": ("source",),
        "delete": ("source",),
    }[op]
    missing = [k for k in need if not inputs.get(k)]
    if missing:
        raise ToolError(f"gcs: operation {op} needs {', '.join(missing)}", kind="config_error")
    try:
        return _run(op, inputs, ctx)
    except ToolError:
        raise
    except FileNotFoundError as e:
        raise ToolError(f"gcs: {op}: not found: {e}", kind="not_found") from None
    except PermissionError as e:
        raise ToolError(f"gcs: {op}: permission denied: {e}", kind="auth_error") from None
    except OSError as e:
        raise ToolError(f"gcs: {op} failed: {e}", kind="gcs_error", retryable=True) from None
    except ValueError as e:
        raise ToolError(f"gcs: {op}: {e}", kind="gcs_error") from None
