"""Replay-time resolution of stored references (seed 004 F.2) through the adapter registry.

Every ``$ref`` an execution's events or an archive manifest hold is resolved through
:func:`~noetl_dagster.storage.payload.store_for_uri` — the same registry writes use; a ``noetl://``
one first through the resource catalog's read plan (location + expected checksum), any other
through the locator for the execution's tenant (storage/locator.py) — and summed up
deterministically: the same bytes give the same summary on any machine and any cloud (no
timestamps, no provider URIs of the reader). Full bodies only on request, bounded by size.

A summary: ``uri, store, format, size, checksum, status`` (``ok`` | ``refused`` | ``missing`` |
``checksum_mismatch`` | ``unreachable`` | ``no_adapter`` | ``too_large``), ``rows`` and
``schema_fingerprint`` where recorded, ``arrow_schema`` (a fingerprint of the Parquet/Arrow
file's schema, read from the bytes), ``json_shape`` (the JSON's type, length and sorted keys, two
levels deep) and, with ``bodies=True``, ``body`` (the decoded JSON, text, or nothing past the bound).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from noetl_dagster.storage.locator import Locator, RefRefused
from noetl_dagster.storage.payload import (
    ChecksumMismatch,
    PayloadNotFound,
    PayloadStore,
    ResultRef,
    is_ref,
    store_for_uri,
    verify_checksum,
)
from noetl_dagster.util.jsonutil import loads

DEFAULT_BODY_LIMIT = 16 << 20  # --bodies fetches at most this many bytes per reference


def json_shape(value: Any, depth: int = 2) -> Any:
    """A deterministic sketch of a JSON value: types, lengths and sorted keys, ``depth`` levels."""
    if isinstance(value, dict):
        out: dict[str, Any] = {"type": "object", "keys": len(value)}
        if depth > 0:
            out["fields"] = {k: json_shape(value[k], depth - 1) for k in sorted(value)[:50]}
        return out
    if isinstance(value, list):
        out = {"type": "array", "length": len(value)}
        if depth > 0 and value:
            out["items"] = json_shape(value[0], depth - 1)
        return out
    if isinstance(value, str):
        return {"type": "string", "length": len(value)}
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, (int, float)):
        return {"type": "number"}
    return {"type": "null"} if value is None else {"type": type(value).__name__}


def _arrow_schema(data: bytes, fmt: str) -> dict[str, Any] | None:
    try:
        import pyarrow as pa  # noqa: PLC0415

        if fmt == "parquet":
            import pyarrow.parquet as pq  # noqa: PLC0415

            f = pq.ParquetFile(pa.BufferReader(data))
            schema, rows = f.schema_arrow, f.metadata.num_rows
        else:
            reader = pa.ipc.open_file(pa.BufferReader(data))
            schema, rows = (
                reader.schema,
                sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches)),
            )
    except Exception:  # noqa: BLE001 - not a readable table: no schema summary
        return None
    text = ",".join(f"{f.name}:{f.type}" for f in schema)
    return {
        "fingerprint": "sha256:" + hashlib.sha256(text.encode()).hexdigest(),
        "fields": len(schema),
        "rows": rows,
    }


class RefResolver:
    """Resolves references through the registry, caching one store per bucket / directory.

    ``like``: the configured payload store, whose connection (endpoint, credentials) other buckets
    of its kind reuse."""

    def __init__(
        self,
        like: PayloadStore | None = None,
        *,
        bodies: bool = False,
        body_limit: int = DEFAULT_BODY_LIMIT,
        registry: Any = None,
        reader: tuple[str, str] | None = None,
        locator: Locator | None = None,
    ):
        self.like = like
        # every non-noetl:// reference passes the locator as the execution's tenant and project
        self.reader = reader or ("default", "default")
        self.locator = locator or Locator(like)
        self.registry = (
            registry  # a registry client: noetl:// references resolve through the resource catalog
        )
        self.bodies = bodies
        self.body_limit = body_limit
        self._stores: dict[str, PayloadStore] = {}

    def summarize(self, ref: ResultRef | dict[str, Any]) -> dict[str, Any]:
        if isinstance(ref, dict):
            ref = ResultRef.from_dict(ref.get("$ref", ref))
        out: dict[str, Any] = {k: v for k, v in ref.to_dict().items() if k in
                               ("uri", "store", "format", "size", "checksum", "rows", "schema_fingerprint",
                                "content_type", "region", "storage_class")}  # fmt: skip
        if ref.uri.startswith("noetl://"):
            located = self._locate(ref, out)
            if isinstance(located, dict):
                return located
            ref = located
        else:
            try:  # refused before any store is asked: a refusal tells nothing of the object
                self.locator.authorize(ref, *self.reader)
            except RefRefused as e:
                return {**out, "status": "refused", "error": str(e)}
        try:
            store = store_for_uri(ref.uri, like=self.like, cache=self._stores)
        except (ValueError, NotImplementedError) as e:
            return {**out, "status": "no_adapter", "error": str(e).splitlines()[0]}
        if self.bodies and ref.size and ref.size > self.body_limit:
            return {
                **out,
                "status": "too_large",
                "error": f"{ref.size} bytes over the body limit {self.body_limit}",
            }
        try:
            data = store.get_bytes(ref.uri)
        except (PayloadNotFound, FileNotFoundError):
            return {**out, "status": "missing"}
        except Exception as e:  # noqa: BLE001 - a dead endpoint, refused credentials: reported, not raised
            return {
                **out,
                "status": "unreachable",
                "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}",
            }
        try:
            verify_checksum(data, ref.checksum, ref.uri)
        except ChecksumMismatch as e:
            return {**out, "status": "checksum_mismatch", "error": str(e)}
        out["status"] = "ok"
        out["stored_size"] = len(data)
        fmt = (ref.format or "").lower()
        if fmt in ("parquet", "arrow", "feather", "ipc"):
            schema = _arrow_schema(data, "parquet" if fmt == "parquet" else "arrow")
            if schema:
                out["arrow_schema"] = schema
        elif fmt == "json":
            try:
                value = loads(data)
            except ValueError:
                value = None
                out["json_shape"] = {"type": "invalid"}
            else:
                out["json_shape"] = json_shape(value)
            if self.bodies:
                out["body"] = value
        elif self.bodies:
            out["body"] = data.decode("utf-8", errors="replace")
        return out

    def _locate(self, ref: ResultRef, out: dict[str, Any]) -> ResultRef | dict[str, Any]:
        """A ``noetl://`` reference as the registry's read plan places it (location and checksum)."""
        if self.registry is None:
            return {**out, "status": "no_adapter", "error": "noetl:// references need the resource registry"}
        try:
            plan = self.registry.resolve(ref.uri, purpose="read")
        except Exception as e:  # noqa: BLE001 - unknown resource, refused access: reported
            return {
                **out,
                "status": "missing",
                "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}",
            }
        loc = plan.location
        if loc is None:
            return {**out, "status": "missing", "error": "the registry records no location"}
        out["location"] = loc.uri
        out["checksum"] = plan.expected_checksum or ref.checksum
        return replace(ref, uri=loc.uri, checksum=out["checksum"], format=loc.format or ref.format)

    def summarize_all(self, refs: Iterable[ResultRef | dict[str, Any]]) -> list[dict[str, Any]]:
        seen: set[tuple[str, str]] = set()
        out = []
        for r in refs:
            d = r.to_dict() if isinstance(r, ResultRef) else dict(r.get("$ref", r))
            key = (str(d.get("uri")), str(d.get("checksum")))
            if key in seen:
                continue
            seen.add(key)
            out.append(self.summarize(d))
        return out

    def resolve_value(self, value: Any) -> Any:
        """``value`` with every ``$ref`` inside replaced by its body (verified), within the body limit;
        a reference that cannot be fetched stays a reference, with its summary's status."""
        if is_ref(value):
            s = self.summarize(value)
            if s["status"] == "ok" and "body" in s:
                return s["body"]
            return {"$ref": value["$ref"], "status": s["status"]}
        if isinstance(value, dict):
            return {k: self.resolve_value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve_value(v) for v in value]
        return value


def summaries_text(summaries: list[dict[str, Any]]) -> str:
    """One line per reference, sorted (for a terminal)."""
    lines = []
    for s in sorted(summaries, key=lambda s: str(s.get("uri"))):
        extra = f" rows={s['rows']}" if s.get("rows") is not None else ""
        lines.append(
            f"{s['status']:<17} {s.get('size', '?'):>10} {s.get('checksum', '')[:23]} {s.get('uri')}{extra}"
        )
    return "\n".join(lines)


def canonical(summaries: list[dict[str, Any]]) -> str:
    """The summaries as canonical JSON (what two replays of the same references must agree on)."""
    return json.dumps(sorted(summaries, key=lambda s: str(s.get("uri"))), sort_keys=True, separators=(",", ":"),
                      default=str)  # fmt: skip
