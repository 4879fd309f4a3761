"""The reference locator (seed 004 §10, §16): every read of a stored reference passes here.

A reference the platform writes (``Offloader``, ``kind: artifact``, a shell's captured output, a
DuckDB spill) carries a **capability**: the tenant and project it belongs to, its URI and checksum,
the scope ``read`` and an expiry, signed with the platform's key (HMAC-SHA256, :class:`RefKeys`).
A task cannot make one, so knowing a bucket path reads nothing.

:meth:`Locator.authorize` decides, before any store is touched, whether a reader (tenant,
project) may use a reference:

- a valid, unexpired capability of the reader's own tenant and project: yes;
- one of another tenant/project: only through a live registry grant of that owner to the
  reader on ``noetl://<owner tenant>/<owner project>/payloads/execution/<execution id>`` (one
  execution's payloads) or ``…/payloads/project/all`` (all of them), see :func:`grant_uris`;
- no capability (references recorded before capabilities existed), or an expired one: only when
  its URI lies in the reader's own payload store under its own ``<prefix><tenant>/<project>/``
  (``engine.recorder.payload_prefix``): what the reader's tenant wrote anyway. ``$NOETL_UNSIGNED_REFS
  =refuse`` turns even that off;
- anything else (forged, another scheme or bucket, a traversal, another tenant without a grant):
  :class:`RefRefused`, one line that names neither the checksum nor whether the object exists.

Only a permitted reference reaches a store: its read is checksum-verified (a mismatch is a
``ChecksumMismatch`` that names neither checksum), and "missing" is said of it alone.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from noetl_dagster.storage.payload import (
    PayloadStore,
    ResultRef,
    store_for_uri,
)

KEYS_ENV = "NOETL_REF_SIGNING_KEYS"  # "kid:base64key[,kid:base64key…]": the first signs, all verify
KEY_FILE_ENV = "NOETL_REF_SIGNING_KEY_FILE"  # a file of such lines (default $NOETL_DAGSTER_HOME/.keys/…)
TTL_ENV = "NOETL_REF_TTL"  # seconds a capability lasts (default 7 days)
UNSIGNED_ENV = "NOETL_UNSIGNED_REFS"  # own (default) | refuse
DEFAULT_TTL = 7 * 24 * 3600
CAPABILITY_VERSION = "v1"
# the registry series a tenant grants to share one execution's payloads, or all of a project's
GRANT_NAMESPACE = "payloads"


class RefRefused(Exception):
    """A reference its reader may not use (the one message: nothing about the object itself)."""


def refusal(uri: str, tenant: str, project: str) -> RefRefused:
    shown = uri if len(uri) <= 200 else uri[:200] + "…"
    return RefRefused(f"reference refused for {tenant}/{project}: {shown!r} is unsigned outside the reader's "
                      "payloads, forged, expired, another tenant's without a grant, or not what it was signed as")  # fmt: skip


def _b64(data: bytes) -> str:
    from base64 import urlsafe_b64encode  # noqa: PLC0415 - a signed reference, not a run's start-up

    return urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    from base64 import urlsafe_b64decode  # noqa: PLC0415 - a signed reference, not a run's start-up

    return urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class Claims:
    """What a capability says: whose reference it is and what it lets a reader do until when."""

    tenant: str
    project: str
    uri: str
    checksum: str
    scope: str
    expires: int
    execution_id: str | None = None


class RefKeys:
    """The platform's reference-signing keys: ``[(kid, secret), …]``; the first signs, every one
    verifies (rotation: put the new key first, keep the old ones until their capabilities expired)."""

    def __init__(self, keys: Iterable[tuple[str, bytes]]):
        self.keys = list(keys)
        if not self.keys:
            raise ValueError("no reference-signing key")
        for kid, secret in self.keys:
            if not kid or "." in kid or ":" in kid or len(secret) < 16:
                raise ValueError(
                    f"reference-signing key {kid!r}: a kid without '.' or ':' and at least 16 bytes"
                )
        self._by_id = dict(self.keys)

    @classmethod
    def parse(cls, text: str, where: str) -> RefKeys:
        keys = []
        for item in text.replace("\n", ",").split(","):
            item = item.strip()
            if not item or item.startswith("#"):
                continue
            kid, sep, secret = item.partition(":")
            try:
                raw = _unb64(secret.strip()) if sep else b""
            except ValueError:
                raw = b""
            if not raw:
                raise ValueError(f"{where}: each key is kid:base64 (got {kid.strip()[:20]!r}…)")
            keys.append((kid.strip(), raw))
        return cls(keys)

    def sign(self, claims: Claims) -> str:
        kid, secret = self.keys[0]
        body = {"t": claims.tenant, "p": claims.project, "u": claims.uri, "c": claims.checksum,
                "s": claims.scope, "x": claims.expires}  # fmt: skip
        if claims.execution_id:
            body["e"] = claims.execution_id
        payload = _b64(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
        head = f"{CAPABILITY_VERSION}.{kid}.{payload}"
        return f"{head}.{_b64(hmac.new(secret, head.encode(), hashlib.sha256).digest())}"

    def knows(self, token: Any) -> bool:
        """Whether ``token`` names one of these keys (else it cannot be checked here)."""
        parts = token.split(".", 2) if isinstance(token, str) else []
        return len(parts) == 3 and parts[1] in self._by_id

    def verify(self, token: Any) -> Claims | None:
        """The claims of a capability signed by one of these keys, else None (expiry not checked)."""
        if not isinstance(token, str) or len(token) > 8192:
            return None
        parts = token.split(".")
        if len(parts) != 4 or parts[0] != CAPABILITY_VERSION or parts[1] not in self._by_id:
            return None
        head = ".".join(parts[:3])
        want = hmac.new(self._by_id[parts[1]], head.encode(), hashlib.sha256).digest()
        try:
            if not hmac.compare_digest(want, _unb64(parts[3])):
                return None
            body = json.loads(_unb64(parts[2]))
            return Claims(str(body["t"]), str(body["p"]), str(body["u"]), str(body["c"]), str(body["s"]),
                          int(body["x"]), body.get("e"))  # fmt: skip
        except (ValueError, KeyError, TypeError):
            return None


_KEYS: dict[str, RefKeys] = {}
_KEYS_LOCK = threading.Lock()


def ref_keys() -> RefKeys:
    """The installation's signing keys: ``$NOETL_REF_SIGNING_KEYS``, else the file
    ``$NOETL_REF_SIGNING_KEY_FILE``, else ``$NOETL_DAGSTER_HOME/.keys/ref-signing.keys`` (made on
    first use, mode 0600, shared by every process and data dir of the installation; a deployment
    sets the variable from its secret store instead)."""
    text = os.environ.get(KEYS_ENV, "").strip()
    if text:
        with _KEYS_LOCK:
            if text not in _KEYS:
                _KEYS[text] = RefKeys.parse(text, KEYS_ENV)
            return _KEYS[text]
    base = Path(os.environ.get("NOETL_DAGSTER_HOME") or ".noetl")
    path = Path(os.environ.get(KEY_FILE_ENV) or base / ".keys" / "ref-signing.keys").resolve()
    key = str(path)
    with _KEYS_LOCK:
        if key in _KEYS:
            return _KEYS[key]
        if not path.exists() and not os.environ.get(KEY_FILE_ENV):
            _create_key_file(path)
        try:
            keys = RefKeys.parse(path.read_text(), str(path))
        except OSError as e:
            raise ValueError(f"cannot read the reference-signing keys {path}: {e.strerror}") from None
        _KEYS[key] = keys
        return keys


def _create_key_file(path: Path) -> None:
    """A fresh key, published atomically: two processes starting at once keep the first one's."""
    import secrets  # noqa: PLC0415 - once per home (with base64 and random: not a run's start-up)

    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, f"k{int(time.time())}:{_b64(secrets.token_bytes(32))}\n".encode())
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def grant_uris(tenant: str, project: str, execution_id: str | None) -> list[str]:
    """The registry resources whose read grant shares an owner's payloads with another tenant."""
    base = f"noetl://{tenant}/{project}/{GRANT_NAMESPACE}"
    return [*([f"{base}/execution/{execution_id}"] if execution_id else []), f"{base}/project/all"]


GrantCheck = Callable[[str, str, str], bool]  # (reader tenant, reader project, resource uri) -> allowed


def registry_grants(data_dir: str | os.PathLike[str] | None) -> GrantCheck:
    """Grant decisions from the NoETL registry (``$NOETL_REGISTRY_URL`` or ``<data dir>/registry.db``),
    asked as the reader; opened only when a reference of another tenant is read."""

    def check(tenant: str, project: str, uri: str) -> bool:
        from noetl_registry.client import API_KEY_ENV, URL_ENV, open_registry  # noqa: PLC0415

        base = Path(data_dir or os.environ.get("NOETL_DAGSTER_HOME") or ".noetl")
        url = os.environ.get(URL_ENV) or str(base / "registry.db")
        try:
            client = open_registry(url, os.environ.get(API_KEY_ENV) or None, tenant=tenant, project=project)
            if (client.tenant, client.project or project) != (tenant, project):
                return False  # a key of another principal cannot speak for this reader
            return client.may_read(uri)
        except Exception:  # noqa: BLE001 - an unreachable or refusing registry grants nothing (fail closed)
            return False

    return check


class Locator:
    """The one gate between a reference and the bytes it names (see the module docstring).

    ``store``: the reader's payload store (its own payloads, and the connection other buckets of
    its kind reuse); ``key_prefix``: the store's shard prefix before ``<tenant>/<project>/``."""

    def __init__(
        self,
        store: PayloadStore | None,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        keys: RefKeys | None = None,
        grants: GrantCheck | None = None,
        key_prefix: str = "",
        ttl: int | None = None,
    ):
        self.store = store
        self.data_dir = data_dir
        self._keys = keys
        self.grants = grants or registry_grants(data_dir)
        self.key_prefix = key_prefix
        self.ttl = ttl if ttl is not None else int(os.environ.get(TTL_ENV) or DEFAULT_TTL)
        self._stores: dict[str, PayloadStore] = {}

    @property
    def keys(self) -> RefKeys:
        if self._keys is None:  # read at the first signature, not at start-up
            self._keys = ref_keys()
        return self._keys

    # -- writing -------------------------------------------------------------------------------
    def sign(self, ref: ResultRef, tenant: str, project: str) -> ResultRef:
        """``ref`` with a capability for ``tenant``/``project`` (scope read, expiring after the TTL)."""
        claims = Claims(tenant, project, ref.uri, ref.checksum, "read", int(time.time()) + self.ttl,
                        ref.execution_id)  # fmt: skip
        return replace(ref, capability=self.keys.sign(claims))

    # -- reading -------------------------------------------------------------------------------
    def authorize(self, ref: ResultRef, tenant: str, project: str) -> None:
        """RefRefused unless ``tenant``/``project`` may read ``ref`` (no store is touched)."""
        claims = None
        # a capability under a key this installation does not hold (another one's, one rotated out)
        # counts as none; under one it holds, it must verify and name this very object
        if ref.capability is not None and self.keys.knows(ref.capability):
            claims = self.keys.verify(ref.capability)
            if claims is None or (claims.uri, claims.checksum, claims.scope) != (
                ref.uri,
                ref.checksum,
                "read",
            ):
                raise refusal(ref.uri, tenant, project)
        if claims is not None and claims.expires > time.time():
            if (claims.tenant, claims.project) == (tenant, project):
                return
            for uri in grant_uris(claims.tenant, claims.project, claims.execution_id):
                if self.grants(tenant, project, uri):
                    return
            raise refusal(ref.uri, tenant, project)
        # unsigned (recorded before capabilities) or expired: the reader's own payloads only
        if os.environ.get(UNSIGNED_ENV, "own") == "own" and self.own(ref.uri, tenant, project):
            return
        raise refusal(ref.uri, tenant, project)

    def own(self, uri: str, tenant: str, project: str) -> bool:
        """Whether ``uri`` names an object of the reader's own payload store under its own prefix."""
        key = self.store.key_of(uri) if isinstance(uri, str) and self.store is not None else None
        if key is None or any(part in ("", ".", "..") for part in key.split("/")):
            return False
        return key.startswith(f"{self.key_prefix}{tenant}/{project}/")

    def store_for(self, uri: str) -> PayloadStore:
        return store_for_uri(uri, like=self.store, cache=self._stores)

    def read(self, ref: ResultRef | dict[str, Any], tenant: str, project: str) -> bytes:
        """The verified bytes of a reference (or ``{"$ref": …}`` envelope) its reader may use."""
        if isinstance(ref, dict):
            ref = ResultRef.from_dict(ref.get("$ref", ref))  # type: ignore[arg-type]
        self.authorize(ref, tenant, project)
        try:
            store = self.store_for(ref.uri)
        except (ValueError, NotImplementedError):
            if self.store is None:  # (a scheme the registry does not know: the reader's own store's)
                raise refusal(ref.uri, tenant, project) from None
            store = self.store
        # a permitted reference whose bytes differ: ChecksumMismatch, naming no checksum
        return store.get_verified(ref)


def locator_of(holder: Any, store: PayloadStore | None = None) -> Locator:
    """The locator of an offloader or a tool context (one made on the fly for a bare ``store``)."""
    offloader = getattr(holder, "offloader", holder)
    loc = getattr(offloader, "locator", None)
    if isinstance(loc, Locator):
        return loc
    store = store or getattr(holder, "payloads", None) or getattr(offloader, "store", None)
    if store is None:
        raise ValueError("no payload store to read references from")
    return Locator(store, data_dir=getattr(holder, "data_dir", None),
                   key_prefix=getattr(offloader, "key_prefix", "") or "")  # fmt: skip


def reader_of(ctx: Any) -> tuple[str, str]:
    """(tenant, project) a tool context reads references as: its execution's."""
    return getattr(ctx, "tenant", None) or "default", getattr(ctx, "project", None) or "default"


def read_for(ctx: Any, ref: ResultRef | dict[str, Any], store: PayloadStore | None = None) -> bytes:
    """A tool's read of a reference it was handed, as its execution's tenant and project."""
    return locator_of(ctx, store).read(ref, *reader_of(ctx))


def sign_for(ctx: Any, ref: ResultRef, store: PayloadStore | None = None) -> ResultRef:
    """A reference a tool wrote (to ``store``), with its execution's capability."""
    return locator_of(ctx, store).sign(ref, *reader_of(ctx))
