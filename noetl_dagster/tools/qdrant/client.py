"""Shared qdrant-client instances (one per local path or server) and error translation."""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from noetl_dagster.tools.registry import ToolError

KIND = "qdrant"
DEFAULT_BATCH = 1024
ORIGINAL_ID_KEY = "_id"  # payload key holding a string id that is not a UUID
OPERATIONS = ("create", "upsert", "query", "delete", "retrieve", "scroll", "count", "info", "drop")
DISTANCES = {
    "cosine": models.Distance.COSINE,
    "dot": models.Distance.DOT,
    "euclid": models.Distance.EUCLID,
    "euclidean": models.Distance.EUCLID,
    "l2": models.Distance.EUCLID,
    "manhattan": models.Distance.MANHATTAN,
    "l1": models.Distance.MANHATTAN,
}
_ID_NAMESPACE = uuid.UUID("6f1c5a0e-3d7b-5b9e-9a57-8e0f6d0c4a11")
_NATIVE_FILTER_KEYS = {"must", "should", "must_not", "min_should"}
_HTTP_RETRYABLE = {408, 425, 429, 500, 502, 503, 504}


# -- shared clients --------------------------------------------------------------------


@dataclass
class SharedClient:
    """One qdrant-client per location per process, with the lock its calls take."""

    client: QdrantClient
    location: str  # "qdrant+file:///abs/path" or the server URL
    path: str | None = None
    url: str | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)
    # collection -> dimension, so a query does not ask for the collection first; kept up to date by
    # create/drop here, and refreshed before reporting a dimension mismatch (another client may change it)
    dims: dict[str, int] = field(default_factory=dict)

    @property
    def local(self) -> bool:
        return self.path is not None

    def location_uri(self, collection: str) -> str:
        """The physical address of one collection, as recorded in the registry."""
        if self.local:
            return f"qdrant+file://{self.path}?collection={collection}"
        scheme, _, rest = (self.url or "").partition("://")
        return f"qdrant+{scheme}://{rest.rstrip('/')}?collection={collection}"


_clients: dict[tuple[str, ...], SharedClient] = {}
_clients_lock = threading.Lock()


def _key_digest(api_key: str | None) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()[:16] if api_key else ""


def shared_client(
    *, path: str | os.PathLike[str] | None = None, url: str | None = None, api_key: str | None = None,
    timeout: int | None = None,
) -> SharedClient:  # fmt: skip
    """The process's client for a local path or a server (created on first use)."""
    if (path is None) == (url is None):
        raise ToolError("qdrant: give either a local `path` or a server `url`", kind="config_error")
    if path is not None:
        real = str(Path(path).expanduser().resolve())
        key: tuple[str, ...] = ("local", real)
    else:
        real = str(url).rstrip("/")
        key = ("server", real, _key_digest(api_key))
    with _clients_lock:
        hit = _clients.get(key)
        if hit is not None:
            return hit
        try:
            if path is not None:
                Path(real).mkdir(parents=True, exist_ok=True)
                client = QdrantClient(path=real)
                shared = SharedClient(client, f"qdrant+file://{real}", path=real)
            else:
                # no version probe at construction: it is a blocking request that only warns
                client = QdrantClient(url=real, api_key=api_key, timeout=timeout, check_compatibility=False)
                shared = SharedClient(client, real, url=real)
        except Exception as e:  # noqa: BLE001 - opening errors become tool errors
            raise translate_error(e, f"opening {real}") from None
        _clients[key] = shared
        return shared


def release_client(
    *, path: str | os.PathLike[str] | None = None, url: str | None = None, api_key: str | None = None
) -> bool:
    """Close and forget a shared client (frees a local path for another process)."""
    key: tuple[str, ...] = (
        ("local", str(Path(path).expanduser().resolve()))
        if path is not None
        else ("server", str(url).rstrip("/"), _key_digest(api_key))
    )
    with _clients_lock:
        shared = _clients.pop(key, None)
    if shared is None:
        return False
    with shared.lock:
        shared.client.close()
    return True


def release_all() -> None:
    with _clients_lock:
        items = list(_clients.values())
        _clients.clear()
    for shared in items:
        with shared.lock:
            shared.client.close()


# close while the interpreter can still import (qdrant-client's __del__ fails at shutdown)
atexit.register(release_all)


# -- errors -------------------------------------------------------------------------------


def translate_error(e: BaseException, what: str, collection: str | None = None) -> ToolError:
    """A qdrant-client exception as a clear, classified ToolError."""
    if isinstance(e, ToolError):
        return e
    where = f"collection {collection!r}" if collection else what
    if isinstance(e, ResponseHandlingException):  # no answer: connection refused, timeout, TLS
        cause = e.source if getattr(e, "source", None) is not None else e
        return ToolError(f"qdrant: server unreachable while {what}: {cause}", kind="qdrant_unavailable", retryable=True,
                         code="unavailable")  # fmt: skip
    if isinstance(e, UnexpectedResponse):
        status = e.status_code
        text = _response_message(e)
        if status == 404:
            return ToolError(f"qdrant: {where} does not exist ({text})", kind="qdrant_not_found", code=404)
        if status in (401, 403):
            return ToolError(f"qdrant: access denied while {what} (HTTP {status}); check the API key", kind="qdrant_auth",
                             code=status)  # fmt: skip
        if "dimension" in text.lower():
            return ToolError(f"qdrant: {where}: {text}", kind="qdrant_dimension", code=status)
        return ToolError(f"qdrant: {what} failed with HTTP {status}: {text}", kind="qdrant_server_error" if status >= 500 else "qdrant_bad_request",
                         retryable=status in _HTTP_RETRYABLE, code=status)  # fmt: skip
    if isinstance(e, RuntimeError) and "already accessed by another instance" in str(e):
        return ToolError(
            f"qdrant: the local storage at {what.removeprefix('opening ')} is open in another process; "
            "local mode allows one client per path — run the steps in one process or use a Qdrant server",
            kind="qdrant_locked",
            retryable=True,
            code="locked",
        )
    msg = str(e)
    low = msg.lower()
    if isinstance(e, (KeyError, ValueError)) and "not found" in low and "collection" in low:
        return ToolError(f"qdrant: {where} does not exist", kind="qdrant_not_found", code=404)
    if "dimension" in low or "not aligned" in low:
        return ToolError(f"qdrant: {where}: {msg}", kind="qdrant_dimension", code=400)
    if isinstance(e, (ValueError, TypeError)):
        return ToolError(f"qdrant: {what}: {msg}", kind="qdrant_bad_request", code=400)
    if isinstance(e, (TimeoutError, ConnectionError, OSError)):
        return ToolError(
            f"qdrant: {what}: {type(e).__name__}: {msg}", kind="qdrant_unavailable", retryable=True
        )
    return ToolError(f"qdrant: {what}: {type(e).__name__}: {msg}", kind="qdrant_error")


def _response_message(e: UnexpectedResponse) -> str:
    try:
        body = json.loads(e.content)
        status = body.get("status") if isinstance(body, dict) else None
        if isinstance(status, dict) and status.get("error"):
            return str(status["error"])
    except Exception:  # noqa: BLE001 - fall back to the raw text
        pass
    return (e.content or b"").decode("utf-8", "replace")[:500] or (e.reason_phrase or "")
