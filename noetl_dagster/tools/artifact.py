"""``kind: artifact`` (alias ``result_fetch``): read a stored result reference back, or store a value.

``action: get`` (the default) reads ``result_ref`` — a step's ``_ref`` (``{{ big_step._ref }}``, set
on every result the engine offloaded), a ``{"$ref": …}`` envelope, NoETL's ``{kind: result_ref,
ref: uri}`` — or ``uri`` (a URI of the execution's payload store). A reference with a checksum is
verified. JSON comes back as the value, Arrow results (DuckDB spills) as their rows, text as text;
``.gz`` is decompressed.

Result: ``{data, uri, store, format, size_bytes}`` and, when ``data`` is a mapping, its keys at the
top level too (``{{ load.count }}`` as in NoETL's fixtures; the metadata keys win a clash).
``select`` keeps only some values: a list of paths (dotted ``items.0.id`` or JSONPath ``$.items[0].id``)
or ``{name: path}``; the result then holds those names instead of ``data``.

``action: put`` stores ``data`` (mappings and lists as JSON, strings as text) at ``uri`` as
upstream's tool does — a ``file://`` URI, a plain path (relative: to the first root), NoETL's
``artifact://localfs/<abs path>`` or a URI of the execution's payload store — or, with no ``uri``, under a
key of the payload store. ``compress: true`` gzips (and appends ``.gz`` as upstream). Result:
``{ref: {"$ref": …}, uri, path, size_bytes, sha256}``.

Local paths, read or written, must resolve (symlinks and ``..`` followed) inside one of the
artifact roots: ``$NOETL_ARTIFACT_ROOTS`` (``os.pathsep``-separated; default the data dir), or for a
generated playbook its own directory only. Anything else is a one-line ``config_error``, never a
silent redirect. A generated playbook reads and writes payload-store keys of its own tenant and
project only (``<key prefix><tenant>/<project>/…``, where the engine keeps every execution's results):
another tenant's payload is ``trust_refused``, whoever knows its URI. Errors: a missing reference is ``artifact_not_found``, a checksum mismatch
``checksum_mismatch``.
"""

from __future__ import annotations

import gzip
import os
import posixpath
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote

from pydantic import Field

from noetl_dagster.engine.recorder import payload_prefix
from noetl_dagster.storage.locator import RefRefused, locator_of, read_for, reader_of, refusal, sign_for
from noetl_dagster.storage.payload import (
    ChecksumMismatch,
    PayloadStore,
    ResultRef,
    checksum_of,
    is_ref,
    verify_checksum,
)
from noetl_dagster.tools.configs import ToolConfig
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool
from noetl_dagster.tools.shell import data_dir, payload_store
from noetl_dagster.util.jsonutil import dumps, loads, plain

_MISSING = object()


class ArtifactConfig(ToolConfig):
    action: Literal["get", "put"] = Field("get", description="get (read a reference back) | put (store data)")
    result_ref: Any = Field(
        None, description="a step's _ref, a {$ref} envelope or {kind: result_ref, ref: uri}"
    )
    uri: str | None = Field(
        None,
        description="get: where to read; put: where to write (file://, a path inside "
        "NOETL_ARTIFACT_ROOTS, artifact://localfs/…, or a payload-store URI)",
    )
    select: list[str] | dict[str, str] | str | None = Field(
        None, description="paths to keep: [a.b, $.c[0]] or {name: path}"
    )
    data: Any = Field(None, description="put: the value to store")
    name: str | None = Field(None, description="put without uri: a name for the stored object")
    compress: bool = Field(False, description="put: gzip the bytes (and append .gz to a local path)")
    credential: str | None = Field(
        None, description="accepted for upstream compatibility (cloud URIs use kind: storage)"
    )


ROOTS_ENV = "NOETL_ARTIFACT_ROOTS"


def artifact_roots(ctx: ToolContext) -> list[str]:
    """The real directories local artifact paths must stay in: a generated playbook's own
    directory, else ``$NOETL_ARTIFACT_ROOTS``, else the data dir."""
    scope = getattr(ctx, "scope_dir", None)
    if scope:
        return [os.path.realpath(scope)]
    raw = os.environ.get(ROOTS_ENV, "")
    roots = [r.strip() for r in raw.split(os.pathsep) if r.strip()] or [str(data_dir(ctx))]
    return [os.path.realpath(os.path.expanduser(r)) for r in roots]


def _local_path(uri: str) -> str | None:
    """The filesystem path a URI names, or None for another scheme."""
    if uri.startswith("artifact://localfs/"):
        return "/" + unquote(uri[len("artifact://localfs/") :])
    if uri.startswith("artifact://"):
        return unquote(uri[len("artifact://") :])
    if uri.startswith("file://"):
        return unquote(uri[len("file://") :])
    return None if "://" in uri else uri


def _confine(path: str, ctx: ToolContext, action: str) -> str:
    """``path`` resolved (symlinks, ``..``) inside an artifact root, else a config_error."""
    roots = artifact_roots(ctx)
    if "\x00" in path:
        raise ToolError(f"artifact: {action} path contains a NUL byte", kind="config_error")
    full = os.path.expanduser(path)
    full = os.path.realpath(full if os.path.isabs(full) else os.path.join(roots[0], full))
    for root in roots:
        if full.startswith(root.rstrip(os.sep) + os.sep):
            return full
    where = (
        "this generated playbook's own directory"
        if getattr(ctx, "scope_dir", None)
        else f"{ROOTS_ENV} ({os.pathsep.join(roots)})"
    )
    raise ToolError(f"artifact: {action} {path!r} resolves outside the artifact roots: {where}; "
                    f"add its directory to {ROOTS_ENV}", kind="config_error")  # fmt: skip


def _tenant_prefix(ctx: ToolContext, execution_id: str = "") -> str:
    """Where this execution's tenant and project keep payloads (the recorder's layout)."""
    return payload_prefix(getattr(ctx, "offloader", None), getattr(ctx, "tenant", "default"),
                          getattr(ctx, "project", "default"), execution_id)  # fmt: skip


def _own_key(key: str, ctx: ToolContext, action: str, uri: str) -> str:
    """``key``, unless a generated playbook names a payload outside its tenant and project."""
    if getattr(ctx, "restricted", False):
        prefix = _tenant_prefix(ctx)
        if ".." in key.split("/") or not posixpath.normpath(key).startswith(prefix):
            raise ToolError(f"artifact: {action} {uri!r}: a generated playbook reads and writes payloads of its own "
                            f"tenant and project only ({prefix}…)", kind="trust_refused")  # fmt: skip
    return key


def _store_key(store: PayloadStore, uri: str) -> str | None:
    """The key of ``uri`` in ``store`` (None when the store does not own it)."""
    try:
        return store.key_of(uri)
    except (NotImplementedError, ValueError):
        return None


def _arg(inputs: Mapping[str, Any], key: str) -> Any:
    if inputs.get(key) is not None:
        return inputs[key]
    inner = inputs.get("input")
    return inner.get(key) if isinstance(inner, Mapping) else None


def _ref_of(value: Any) -> tuple[ResultRef | None, str | None]:
    """(a verifiable reference, or None and a bare URI)."""
    if is_ref(value):
        value = value["$ref"]
    if isinstance(value, Mapping) and isinstance(value.get("rows"), Mapping) and is_ref(value["rows"]):
        value = value["rows"]["$ref"]  # a DuckDB result whose rows were spilled
    if isinstance(value, Mapping):
        if value.get("uri") and value.get("checksum"):
            return ResultRef.from_dict(dict(value)), None
        uri = value.get("uri") or value.get("ref") or value.get("logical_uri")
        return None, str(uri) if uri else None
    if isinstance(value, str) and value.strip():
        return None, value.strip()
    return None, None


def _decode(data: bytes, fmt: str | None, uri: str) -> Any:
    if uri.endswith((".gz", ".gzip")) or data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if fmt in ("arrow", "arrow_ipc") or data[:6] == b"ARROW1":
        import pyarrow as pa  # noqa: PLC0415

        return plain(pa.ipc.open_file(pa.BufferReader(data)).read_all().to_pylist())
    if fmt == "text":
        return data.decode("utf-8", errors="replace")
    try:
        return loads(data)
    except ValueError:
        return data.decode("utf-8", errors="replace")


def _path(value: Any, path: str) -> Any:
    if path.startswith("$"):
        from jsonpath_ng import parse  # noqa: PLC0415

        try:
            found = [m.value for m in parse(path).find(value)]
        except Exception as e:  # noqa: BLE001 - jsonpath_ng raises several types for bad syntax
            raise ToolError(f"artifact: bad select path {path!r}: {e}", kind="config_error") from None
        return found[0] if len(found) == 1 else (found or None)
    for part in path.split("."):
        if isinstance(value, Mapping):
            value = value.get(part)
        elif isinstance(value, list) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _select(data: Any, select: Any) -> dict[str, Any]:
    if isinstance(select, str):
        select = [select]
    pairs = (
        select.items()
        if isinstance(select, Mapping)
        else ((p.lstrip("$.").split(".")[-1] or p, p) for p in select)
    )
    return {str(name): _path(data, str(path)) for name, path in pairs}


def _read(uri: str, ref: ResultRef | None, ctx: ToolContext) -> tuple[bytes, str]:
    """(bytes, store name) of ``uri``: a reference, and any URI of the payload store, through the
    locator (storage/locator.py: the execution's own payloads, or a signed one its tenant may
    read), local paths from inside the artifact roots; a reference's checksum is verified."""
    store = payload_store(ctx)
    key = _store_key(store, uri)
    if key is not None:
        _own_key(key, ctx, "get", uri)
    if ref is not None and (key is not None or ref.capability):
        return read_for(ctx, ref, store), store.name if key is not None else ref.store
    if key is not None:
        if not locator_of(ctx, store).own(uri, *reader_of(ctx)):
            raise refusal(uri, *reader_of(ctx))
        return store.get_bytes(uri), store.name
    path = _local_path(uri)
    if path is None:
        raise ToolError(f"artifact: get {uri!r}: its scheme is neither a local path nor this execution's "
                        f"payload store ({store.name}); read other object stores with kind: storage",
                        kind="config_error")  # fmt: skip
    with open(_confine(path, ctx, "get"), "rb") as fh:
        data = fh.read()
    if ref is not None:
        verify_checksum(data, ref.checksum, uri)
    return data, "local"


def _get(inputs: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    raw = _arg(inputs, "result_ref")
    ref, uri = _ref_of(raw if raw not in (None, "") else _arg(inputs, "uri"))
    if ref is None and uri is None:
        raise ToolError(
            "artifact: get needs result_ref (e.g. '{{ step._ref }}') or uri; the value given is empty "
            "(was the step's result stored inline?)",
            kind="config_error",
        )
    where = ref.uri if ref else str(uri)
    try:
        data, store_name = _read(where, ref, ctx)
    except RefRefused as e:
        raise ToolError(f"artifact: {e}", kind="reference_refused") from None
    except ChecksumMismatch as e:
        raise ToolError(f"artifact: {e}", kind="checksum_mismatch") from None
    except (FileNotFoundError, KeyError) as e:
        raise ToolError(f"artifact: no stored result at {where}: {e}", kind="artifact_not_found") from None
    except (OSError, ValueError) as e:
        raise ToolError(f"artifact: cannot read {where}: {e}", kind="artifact_error") from None
    value = _decode(data, ref.format if ref else None, where)
    meta = {"uri": where, "store": store_name, "format": ref.format if ref else None, "size_bytes": len(data)}
    select = _arg(inputs, "select")
    if select:
        return {**_select(value, select), **meta}
    out = dict(value) if isinstance(value, Mapping) else {}
    out.update(meta)
    out["data"] = value
    return out


def _encode(data: Any) -> tuple[bytes, str]:
    if isinstance(data, str):
        return data.encode("utf-8"), "text"
    return dumps(data).encode("utf-8"), "json"


def _write_file(path: str, body: bytes) -> None:
    """Atomically (temp file + rename in the same directory) at the already resolved ``path``."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "xb") as fh:
            fh.write(body)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _put(inputs: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    data = _arg(inputs, "data")
    if data is None:
        raise ToolError("artifact: put needs data", kind="config_error")
    store = payload_store(ctx)
    uri = _arg(inputs, "uri")
    # this runtime's extension: no uri → a key of the payload store, beside the execution's results
    if not uri:
        name = _arg(inputs, "name") or f"{ctx.task}-attempt{ctx.attempt}"
        key = f"{_tenant_prefix(ctx, ctx.execution_id)}{ctx.step}/artifact-{name}.json"
        ref = sign_for(ctx, store.put_json(_own_key(key, ctx, "put", key), data), store)
        return {"ref": ref.envelope(), "uri": ref.uri, "size_bytes": ref.size, "sha256": ref.checksum}
    uri = str(uri).strip()
    body, fmt = _encode(data)
    checksum = checksum_of(body)
    compress = bool(_arg(inputs, "compress"))
    if compress:
        body = gzip.compress(body, mtime=0)
    key = _store_key(store, uri)
    path = None
    try:
        if key is not None:
            where, store_name = store.put_bytes(_own_key(key, ctx, "put", uri), body), store.name
        else:
            local = _local_path(uri)
            if local is None:
                raise ToolError(f"artifact: put {uri!r}: its scheme is neither a local path nor this execution's "
                                f"payload store ({store.name}); write other object stores with kind: storage",
                                kind="config_error")  # fmt: skip
            if compress and not local.endswith((".gz", ".gzip")):
                local += ".gz"
            path = _confine(local, ctx, "put")
            _write_file(path, body)
            where, store_name = Path(path).as_uri(), "local"
    except (OSError, ValueError) as e:
        raise ToolError(f"artifact: cannot write {uri}: {e}", kind="artifact_error") from None
    # the checksum is of the bytes as stored (what get verifies); sha256 of the content as upstream
    ref = ResultRef(uri=where, store=store_name, format=fmt, size=len(body), checksum=checksum_of(body))
    ref = sign_for(ctx, ref, store)  # what later steps of this tenant read back through the locator
    out = {
        "ref": ref.envelope(),
        "uri": where,
        "size_bytes": len(body),
        "sha256": checksum,
        "compressed": compress,
    }
    if path is not None:
        out["path"] = path
    return out


@register_tool(
    "artifact",
    config=ArtifactConfig,
    description="Read a stored result reference back (select paths), or store data",
)
def artifact_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    """Read a stored result reference back (with select paths), or put data into the payload store."""
    action = str(_arg(inputs, "action") or "get")
    if action == "get":
        return _get(inputs, ctx)
    if action == "put":
        return _put(inputs, ctx)
    raise ToolError(f"artifact: action must be get or put, not {action!r}", kind="config_error")


register_tool(
    "result_fetch",
    artifact_tool,
    config=ArtifactConfig,
    description="NoETL's result_fetch: kind artifact, action get",
)
