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

``action: put`` stores ``data`` (JSON) in the payload store: ``{ref: {"$ref": …}, uri, size_bytes, sha256}``.
Errors: a missing reference is ``artifact_not_found``, a checksum mismatch ``checksum_mismatch``.
"""

from __future__ import annotations

import gzip
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from noetl_dagster.storage.payload import ChecksumMismatch, ResultRef, is_ref
from noetl_dagster.tools.configs import ToolConfig
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool
from noetl_dagster.tools.shell import payload_store
from noetl_dagster.util.jsonutil import loads, plain

_MISSING = object()


class ArtifactConfig(ToolConfig):
    action: Literal["get", "put"] = Field("get", description="get (read a reference back) | put (store data)")
    result_ref: Any = Field(None, description="a step's _ref, a {$ref} envelope or {kind: result_ref, ref: uri}")
    uri: str | None = Field(None, description="a payload-store URI (instead of result_ref)")
    select: list[str] | dict[str, str] | str | None = Field(None, description="paths to keep: [a.b, $.c[0]] or {name: path}")
    data: Any = Field(None, description="put: the value to store")
    name: str | None = Field(None, description="put: a name for the stored object")


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
    pairs = select.items() if isinstance(select, Mapping) else ((p.lstrip("$.").split(".")[-1] or p, p) for p in select)
    return {str(name): _path(data, str(path)) for name, path in pairs}


def _get(inputs: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    raw = _arg(inputs, "result_ref")
    ref, uri = _ref_of(raw if raw not in (None, "") else _arg(inputs, "uri"))
    if ref is None and uri is None:
        raise ToolError("artifact: get needs result_ref (e.g. '{{ step._ref }}') or uri; the value given is empty "
                        "(was the step's result stored inline?)", kind="config_error")
    store = payload_store(ctx)
    try:
        data = store.get_verified(ref) if ref is not None else store.get_bytes(str(uri))
    except ChecksumMismatch as e:
        raise ToolError(f"artifact: {e}", kind="checksum_mismatch") from None
    except (FileNotFoundError, KeyError) as e:
        raise ToolError(f"artifact: no stored result at {ref.uri if ref else uri}: {e}", kind="artifact_not_found") from None
    except (OSError, ValueError) as e:
        raise ToolError(f"artifact: cannot read {ref.uri if ref else uri}: {e}", kind="artifact_error") from None
    where = ref.uri if ref else str(uri)
    value = _decode(data, ref.format if ref else None, where)
    meta = {"uri": where, "store": store.name, "format": ref.format if ref else None, "size_bytes": len(data)}
    select = _arg(inputs, "select")
    if select:
        return {**_select(value, select), **meta}
    out = dict(value) if isinstance(value, Mapping) else {}
    out.update(meta)
    out["data"] = value
    return out


def _put(inputs: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    data = _arg(inputs, "data")
    if data is None:
        raise ToolError("artifact: put needs data", kind="config_error")
    store = payload_store(ctx)
    prefix = getattr(getattr(ctx, "offloader", None), "key_prefix", "") or ""
    name = _arg(inputs, "name") or f"{ctx.task}-attempt{ctx.attempt}"
    ref = store.put_json(f"{prefix}{ctx.execution_id}/{ctx.step}/artifact-{name}.json", data)
    return {"ref": ref.envelope(), "uri": ref.uri, "size_bytes": ref.size, "sha256": ref.checksum}


@register_tool("artifact", config=ArtifactConfig, description="Read a stored result reference back (select paths), or store data")
def artifact_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    """Read a stored result reference back (with select paths), or put data into the payload store."""
    action = str(_arg(inputs, "action") or "get")
    if action == "get":
        return _get(inputs, ctx)
    if action == "put":
        return _put(inputs, ctx)
    raise ToolError(f"artifact: action must be get or put, not {action!r}", kind="config_error")


register_tool("result_fetch", artifact_tool, config=ArtifactConfig, description="NoETL's result_fetch: kind artifact, action get")
