"""PayloadStore port, the filesystem adapter, and ResultRef.

Events carry references, never big bodies: a result whose JSON encoding is
over the inline limit is written here and the event holds a ``ResultRef``
(``{"$ref": {uri, store, format, size, checksum, rows?, schema_fingerprint?}}``).
Reads verify the sha256 checksum and fail closed on a mismatch.
"""

from __future__ import annotations

import hashlib
import os
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from noetl_dagster.storage.jsonutil import dumps, loads

DEFAULT_INLINE_LIMIT = 64 * 1024


class ChecksumMismatch(RuntimeError):
    """A stored payload's bytes do not match the checksum its reference recorded."""


@dataclass(frozen=True)
class ResultRef:
    uri: str
    store: str
    format: str
    size: int
    checksum: str
    rows: int | None = None
    schema_fingerprint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def envelope(self) -> dict[str, Any]:
        return {"$ref": self.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ResultRef:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})  # type: ignore[arg-type]


def is_ref(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "$ref" in value and isinstance(value["$ref"], dict)


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class PayloadStore(ABC):
    """Where bodies over the inline limit live."""

    name: str = "payload"

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> str:
        """Store bytes under ``key`` and return the URI."""

    @abstractmethod
    def get_bytes(self, uri: str) -> bytes: ...

    def put_json(self, key: str, value: Any, *, rows: int | None = None) -> ResultRef:
        data = dumps(value).encode()
        uri = self.put_bytes(key, data)
        if rows is None and isinstance(value, list):
            rows = len(value)
        return ResultRef(uri=uri, store=self.name, format="json", size=len(data), checksum=sha256(data), rows=rows)

    def get_verified(self, ref: ResultRef) -> bytes:
        data = self.get_bytes(ref.uri)
        actual = sha256(data)
        if actual != ref.checksum:
            raise ChecksumMismatch(f"checksum mismatch for {ref.uri}: expected {ref.checksum}, got {actual}")
        return data

    def get_json(self, ref: ResultRef) -> Any:
        return loads(self.get_verified(ref))


class FilePayloadStore(PayloadStore):
    name = "file"

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        p = (self.root / key).resolve()
        if self.root not in p.parents and p != self.root:
            raise ValueError(f"payload key escapes the store root: {key!r}")
        return p

    def put_bytes(self, key: str, data: bytes) -> str:
        p = self._path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, p)
        return p.as_uri()

    def get_bytes(self, uri: str) -> bytes:
        path = uri[len("file://") :] if uri.startswith("file://") else uri
        p = Path(path).resolve()
        if self.root not in p.parents:
            raise ValueError(f"payload uri outside the store root: {uri}")
        return p.read_bytes()


class Offloader:
    """Turns a value into itself (small) or a ``$ref`` envelope (large)."""

    def __init__(self, store: PayloadStore, inline_limit: int = DEFAULT_INLINE_LIMIT):
        self.store = store
        self.inline_limit = inline_limit

    def maybe_offload(self, value: Any, key: str) -> Any:
        if value is None or isinstance(value, (bool, int, float)):
            return value
        if isinstance(value, str) and len(value) < self.inline_limit // 4:
            return value
        data = dumps(value).encode()
        if len(data) <= self.inline_limit:
            return value
        uri = self.store.put_bytes(key + ".json", data)
        rows = len(value) if isinstance(value, list) else None
        return ResultRef(uri, self.store.name, "json", len(data), sha256(data), rows).envelope()

    def resolve(self, value: Any) -> Any:
        if is_ref(value):
            return self.store.get_json(ResultRef.from_dict(value["$ref"]))
        return value
