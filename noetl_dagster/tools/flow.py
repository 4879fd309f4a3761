"""Tool kinds that compiled flows use: ``flow_input``, ``flow_guard`` and ``resource``.

They are registered with the tool registry on import and through the
``noetl_dagster.tools`` entry-point group (pyproject.toml), so a compiled
playbook runs in any process that has this package installed.

- ``flow_input``: a task's input from the tokens that reached its step,
  following the seed's aggregation rules (:func:`aggregate`); or a literal.
- ``flow_guard``: the same input, plus whether a JSONPath guard holds on it.
- ``resource``: ``op: load`` reads a resource, ``op: store`` writes the input
  to it. ``file://`` and relative paths (relative to the playbook's folder),
  ``http(s)://`` and ``noetl://`` (through the resource registry).
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import yaml

from noetl_dagster.dsl.flow.jsonpath import guard_holds
from noetl_dagster.storage.payload import ChecksumMismatch, sha256, verify_checksum
from noetl_dagster.tools.configs import FlowGuardConfig, FlowInputConfig, ResourceConfig
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool

# -- input aggregation (seed 002) -------------------------------------------------------------


def aggregate(values: list[Any]) -> Any:
    """The input of a task from the outputs on its incoming edges.

    A missing output is the empty object; empty objects are merged into one,
    and omitted when anything else is present; one remaining value is the
    input itself, several are a list (in the order given).
    """
    present = [v for v in ({} if v is None else v for v in values) if v != {}]
    if not present:
        return {}
    if len(present) == 1:
        return present[0]
    return present


def merge_objects(value: Any) -> dict[str, Any]:
    """The merge operator ``>``: a collection of objects becomes one object (later keys win)."""
    items = value if isinstance(value, list) else [value]
    out: dict[str, Any] = {}
    for item in items:
        for obj in item if isinstance(item, list) else [item]:
            if obj is None:
                continue
            if not isinstance(obj, Mapping):
                raise ToolError(
                    f"the merge operator '>' needs objects to merge, got {type(obj).__name__}: {_short(obj)}",
                    kind="flow_merge",
                )
            out.update(obj)
    return out


def tokens_input(tokens: Any, order: list[str] | None = None, merge: bool = False) -> Any:
    """The input of a step from its token ``args``: one token's dict, or a join's list of them.

    Tokens carry ``{"input": value, "from": step}``; ``order`` lists the
    predecessor steps in flow order so that a collection does not depend on
    which branch finished first.
    """
    if tokens is None:
        toks: list[Any] = []
    elif isinstance(tokens, Mapping):
        toks = [tokens]
    elif isinstance(tokens, list):
        toks = list(tokens)
    else:
        raise ToolError(
            f"flow_input: tokens must be an object or a list, got {type(tokens).__name__}", kind="flow_input"
        )
    if order:
        rank = {name: i for i, name in enumerate(order)}
        toks.sort(key=lambda t: rank.get(t.get("from"), len(rank)) if isinstance(t, Mapping) else len(rank))
    values = [t.get("input") if isinstance(t, Mapping) else t for t in toks]
    value = aggregate(values) if len(values) != 1 else ({} if values[0] is None else values[0])
    return merge_objects(value) if merge else value


@register_tool(
    "flow_input",
    config=FlowInputConfig,
    raw_keys={"literal", "literal_b64"},
    description="A flow task's input: aggregates the step's tokens (`tokens`, `order`, `merge`), "
    "or returns `value` / `literal` as it is.",
)
def flow_input_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    if "literal" in inputs:
        return inputs["literal"]
    if "literal_b64" in inputs:  # a literal holding text that looks like a template
        return json.loads(base64.b64decode(inputs["literal_b64"]))
    if "value" in inputs:
        value = inputs["value"]
        return merge_objects(value) if inputs.get("merge") else ({} if value is None else value)
    return tokens_input(inputs.get("tokens"), inputs.get("order"), bool(inputs.get("merge")))


@register_tool(
    "flow_guard",
    config=FlowGuardConfig,
    description="A guarded flow task's input and whether its JSONPath guard (`path`) holds: {pass, input}.",
)
def flow_guard_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    path = inputs.get("path")
    if not isinstance(path, str) or not path.strip():
        raise ToolError("flow_guard needs `path` (a JSONPath expression)", kind="config_error")
    value = tokens_input(inputs.get("tokens"), inputs.get("order"), bool(inputs.get("merge")))
    try:
        holds = guard_holds(path, value)
    except ValueError as e:
        raise ToolError(f"guard {path!r} is not valid JSONPath: {e}", kind="config_error") from None
    return {"pass": holds, "input": value}


# -- resources -------------------------------------------------------------------------------

_CONTENT_TYPES = {
    "application/json": "json",
    "text/json": "json",
    "text/plain+json": "json",
    "application/json-seq": "json-seq",
    "application/x-ndjson": "jsonl",
    "application/ndjson": "jsonl",
    "application/jsonl": "jsonl",
    "application/x-jsonlines": "jsonl",
    "application/yaml": "yaml",
    "application/x-yaml": "yaml",
    "text/yaml": "yaml",
    "text/x-yaml": "yaml",
    "text/plain+yaml": "yaml",
    "text/plain": "text",
}
_EXTENSIONS = {
    ".json": "json",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json-seq": "json-seq",
    ".jsonseq": "json-seq",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".txt": "text",
}
FORMATS = ("json", "jsonl", "json-seq", "yaml", "text")
_RS = "\x1e"  # RFC 7464 record separator


def _short(value: Any) -> str:
    s = repr(value)
    return s if len(s) <= 80 else s[:77] + "..."


def resource_format(uri: str, params: Mapping[str, Any], content_type: str | None = None) -> str | None:
    """The format to read or write: the ``format`` / ``content-type`` parameter, the
    server's content type, then the file extension; None: guess from the bytes."""
    fmt = params.get("format")
    if fmt:
        fmt = str(fmt).lower()
        if fmt not in FORMATS:
            raise ToolError(
                f"unknown resource format {fmt!r}; use one of {', '.join(FORMATS)}", kind="config_error"
            )
        return fmt
    for ct in (params.get("content-type") or params.get("content_type"), content_type):
        if ct:
            base = str(ct).split(";", 1)[0].strip().lower()
            if base in _CONTENT_TYPES:
                return _CONTENT_TYPES[base]
            if base.endswith("+json"):
                return "json"
            if base.endswith("+yaml"):
                return "yaml"
    path = urlsplit(uri).path if "://" in uri else uri
    return _EXTENSIONS.get(os.path.splitext(path)[1].lower())


def _json_records(text: str) -> list[Any]:
    """JSON text sequences (RFC 7464) and JSON lines: one value per record."""
    out = []
    for chunk in text.split(_RS):
        for line in chunk.splitlines() if _RS not in text else [chunk]:
            if line.strip():
                out.append(json.loads(line))
    return out


def decode(data: bytes, fmt: str | None, where: str) -> Any:
    text = data.decode("utf-8-sig")
    try:
        if fmt == "text":
            return text
        if fmt in ("jsonl", "json-seq"):
            return _json_records(text)
        if fmt == "yaml":
            value = yaml.safe_load(text)
            return {} if value is None else value
        if _RS in text:  # JSON never holds a raw record separator: a JSON text sequence
            return _json_records(text)
        if not text.strip():
            return {}
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            # a .json file holding a JSON sequence (one value per line or per RS record)
            if e.msg == "Extra data":
                return _json_records(text)
            if fmt == "json":
                raise
            value = yaml.safe_load(text)
            return {} if value is None else value
    except (ValueError, yaml.YAMLError) as e:
        raise ToolError(
            f"cannot decode {where} as {fmt or 'JSON or YAML'}: {e}", kind="resource_format"
        ) from None


def encode(value: Any, fmt: str | None) -> bytes:
    fmt = fmt or "json"
    if fmt == "text":
        return (value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)).encode()
    if fmt in ("jsonl", "json-seq"):
        items = value if isinstance(value, list) else [value]
        prefix = _RS if fmt == "json-seq" else ""
        return "".join(prefix + json.dumps(v, ensure_ascii=False, default=str) + "\n" for v in items).encode()
    if fmt == "yaml":
        return yaml.safe_dump(value, sort_keys=False, allow_unicode=True).encode()
    return (json.dumps(value, ensure_ascii=False, indent=2, default=str) + "\n").encode()


def _file_path(uri: str, base_dir: str | None) -> Path:
    if uri.startswith("file:"):
        parts = urlsplit(uri)
        p = Path(unquote(parts.path))
        if parts.netloc and parts.netloc != "localhost":
            raise ToolError(
                f"file URI {uri!r} names a host; only local files are supported", kind="config_error"
            )
    else:
        p = Path(uri)
    if not p.is_absolute():
        p = Path(base_dir or os.getcwd()) / p
    return Path(os.path.abspath(p))  # normalizes `..` without following links


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _http(uri: str, op: str, inputs: Mapping[str, Any], value: Any) -> Any:
    import httpx

    method = str(inputs.get("method") or ("GET" if op == "load" else "POST")).upper()
    headers = dict(inputs.get("headers") or {})
    fmt = resource_format(uri, inputs) if op == "store" else None
    body = None
    if op == "store":
        body = encode(value, fmt)
        ctype = {"json": "application/json", "yaml": "application/yaml", "jsonl": "application/x-ndjson",
                 "json-seq": "application/json-seq", "text": "text/plain"}[fmt or "json"]  # fmt: skip
        headers.setdefault("content-type", ctype)
    try:
        resp = httpx.request(method, uri, headers=headers, params=inputs.get("params"), content=body,
                             timeout=float(inputs.get("timeout") or 30), follow_redirects=True)  # fmt: skip
    except httpx.HTTPError as e:
        raise ToolError(
            f"{method} {uri}: {type(e).__name__}: {e}", kind="http_error", retryable=True
        ) from None
    if resp.status_code >= 400:
        raise ToolError(
            f"{method} {uri} answered {resp.status_code}",
            kind="http_error",
            retryable=resp.status_code == 429 or resp.status_code >= 500,
            code=resp.status_code,
            details={"http": {"status": resp.status_code, "headers": dict(resp.headers)}},
        )
    if op == "load":
        return decode(resp.content, resource_format(uri, inputs, resp.headers.get("content-type")), uri)
    out: dict[str, Any] = {
        "uri": uri,
        "method": method,
        "status_code": resp.status_code,
        "size": len(body or b""),
    }
    if resp.content:
        ctype = resp.headers.get("content-type", "")
        try:
            out["response"] = decode(resp.content, resource_format(uri, {}, ctype) or "text", uri)
        except ToolError:
            out["response"] = resp.text
    return out


def _registry(inputs: Mapping[str, Any], ctx: ToolContext) -> Any:
    from noetl_registry.client import open_registry

    url = inputs.get("registry") or os.environ.get("NOETL_REGISTRY_URL")
    if not url:
        data_dir = getattr(ctx, "data_dir", None) or os.environ.get("NOETL_DAGSTER_HOME", ".noetl")
        url = str(Path(data_dir) / "registry.db")
    tenant = getattr(ctx, "tenant", None) or "default"
    project = getattr(ctx, "project", None) or "default"
    return ctx.resource(f"flow.registry:{url}:{tenant}:{project}",
                        lambda: open_registry(str(url), tenant=tenant, project=project))  # fmt: skip


def _noetl(uri: str, op: str, inputs: Mapping[str, Any], value: Any, ctx: ToolContext) -> Any:
    from noetl_dagster.dsl.locator import InvalidLocator, parse_locator
    from noetl_registry.errors import RegistryError

    try:
        loc = parse_locator(uri, require_version=False)
    except InvalidLocator as e:
        raise ToolError(f"not a valid noetl:// URI: {e}", kind="config_error") from None
    client = _registry(inputs, ctx)
    try:
        if op == "load":
            plan = client.resolve(uri, purpose="read")
            if not plan.allowed or plan.location is None:
                raise ToolError(f"the registry denies reading {uri} (or it has no available location)",
                                kind="access_denied")  # fmt: skip
            where = plan.location.uri
            data = _read_location(where, ctx)
            expected = plan.location.checksum or plan.expected_checksum
            if expected:
                try:
                    verify_checksum(data, expected, f"{where} ({uri})")
                except ChecksumMismatch as e:
                    raise ToolError(str(e), kind="checksum_mismatch") from None
            fmt = resource_format(where, inputs) or (plan.location.format or plan.format)
            return decode(data, fmt if fmt in FORMATS else None, uri)
        fmt = resource_format(uri, inputs) or "json"
        data = encode(value, fmt)
        checksum = sha256(data)
        key = f"resources/{loc.tenant}/{loc.project}/{loc.namespace}/{loc.type}/{loc.name}/{checksum[7:23]}.{fmt}"
        location_uri = _put_bytes(key, data, ctx)
        rows = len(value) if isinstance(value, list) else None
        res = client.register(
            uri,
            locations=[
                {
                    "uri": location_uri,
                    "checksum": checksum,
                    "size_bytes": len(data),
                    "format": fmt,
                    "rows": rows,
                }
            ],
            execution_id=getattr(ctx, "execution_id", None),
            step=getattr(ctx, "step", None),
            task=getattr(ctx, "task", None),
        )
    except RegistryError as e:
        raise ToolError(f"registry: {e}", kind="registry_error") from None
    return {"uri": res.uri, "location": location_uri, "format": fmt, "size": len(data), "checksum": checksum}


def _put_bytes(key: str, data: bytes, ctx: ToolContext) -> str:
    store = getattr(ctx, "payloads", None)
    if store is not None:
        return store.put_bytes(key, data)
    data_dir = Path(getattr(ctx, "data_dir", None) or os.environ.get("NOETL_DAGSTER_HOME", ".noetl"))
    path = (data_dir / key).resolve()
    _write_atomic(path, data)
    return path.as_uri()


def _read_location(where: str, ctx: ToolContext) -> bytes:
    if where.startswith("file:"):
        path = _file_path(where, None)
        try:
            return path.read_bytes()
        except OSError as e:
            raise ToolError(f"cannot read {where}: {e.strerror}", kind="resource_not_found") from None
    store = getattr(ctx, "payloads", None)
    if store is None:
        raise ToolError(f"no payload store here to read {where}", kind="config_error")
    with store.open_read(where) as f:
        return f.read()


@register_tool(
    "resource",
    config=ResourceConfig,
    description="Loads (`op: load`) or stores (`op: store`, `value`) a resource by `uri`: "
    "file:// or a path relative to the playbook, http(s)://, noetl:// (resource registry).",
)
def resource_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    uri = inputs.get("uri")
    if not isinstance(uri, str) or not uri:
        raise ToolError("`kind: resource` needs `uri`", kind="config_error")
    op = str(inputs.get("op") or "load")
    if op not in ("load", "store"):
        raise ToolError(f"resource `op` is load or store, not {op!r}", kind="config_error")
    value = inputs.get("value")
    scheme = urlsplit(uri).scheme.lower() if "://" in uri or uri.startswith("file:") else ""
    if scheme in ("http", "https"):
        return _http(uri, op, inputs, value)
    if scheme == "noetl":
        return _noetl(uri, op, inputs, value, ctx)
    if scheme not in ("", "file"):
        raise ToolError(f"unsupported resource scheme {scheme!r} in {uri!r} (file, http, https, noetl)",
                        kind="config_error")  # fmt: skip
    path = _file_path(uri, getattr(ctx, "base_dir", None))
    if op == "load":
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ToolError(f"resource {uri!r} not found ({path})", kind="resource_not_found") from None
        except OSError as e:
            raise ToolError(f"cannot read {path}: {e.strerror}", kind="resource_error") from None
        return decode(data, resource_format(uri, inputs), str(path))
    fmt = resource_format(uri, inputs) or "json"
    data = encode(value, fmt)
    try:
        _write_atomic(path, data)
    except OSError as e:
        raise ToolError(f"cannot write {path}: {e.strerror}", kind="resource_error") from None
    return {"uri": path.as_uri(), "format": fmt, "size": len(data), "checksum": sha256(data)}
