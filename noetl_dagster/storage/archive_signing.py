"""The archive manifest's signature (seed 004 §7: ``signatures/manifest.sig``, issue 41).

The manifest lists every file's checksum and each execution's chain head, so signing its bytes
signs the bundle. Ed25519 (``cryptography``) with a PEM key pair, or HMAC-SHA256 with a shared
secret (``hmac:SECRET``) where no asymmetric library is installed. Keys (docs/configuration.md):

* signing, when an archive is written: ``$NOETL_ARCHIVE_SIGNING_KEY``, else the keychain credential
  ``noetl_archive_signing`` (field ``private_key`` or ``secret``);
* verifying, when a bundle is read (restore, ``replay --from-archive``, ``verify --archive``):
  ``$NOETL_ARCHIVE_VERIFY_KEY``, else the credential ``noetl_archive_verify`` (``public_key`` or
  ``secret``). With a verify key, an unsigned or badly signed bundle is refused.

A value is PEM text, the path of a PEM file, or ``hmac:SECRET``."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

from noetl_dagster.engine.chain import LogTampered

SIGNATURE_PATH = "signatures/manifest.sig"


class SignatureInvalid(LogTampered):
    """The bundle's manifest signature is missing or does not verify with the configured key."""


def _configured(env: str, credential: str, fields: tuple[str, ...]) -> str | None:
    value = os.environ.get(env)
    if value:
        return value
    from noetl_dagster.engine.keychain import default_providers  # noqa: PLC0415 - only when no env key

    for provider in default_providers():
        record = provider.credential(credential)
        if record:
            for f in fields:
                if record.get(f):
                    return ("hmac:" if f == "secret" else "") + str(record[f])
    return None


def _material(value: str) -> tuple[str, bytes]:
    """("hmac", secret) or ("pem", PEM bytes)."""
    if value.startswith("hmac:"):
        return "hmac", value[len("hmac:") :].encode()
    if "-----BEGIN" not in value:
        path = Path(value).expanduser()
        if not path.is_file():
            raise ValueError(f"archive key {value[:40]!r}...: neither PEM text, a PEM file nor hmac:SECRET")
        return "pem", path.read_bytes()
    return "pem", value.encode()


def signing_key() -> str | None:
    return _configured("NOETL_ARCHIVE_SIGNING_KEY", "noetl_archive_signing", ("private_key", "secret"))


def verify_key() -> str | None:
    return _configured("NOETL_ARCHIVE_VERIFY_KEY", "noetl_archive_verify", ("public_key", "secret"))


def sign(manifest: bytes, key: str) -> bytes:
    """The ``manifest.sig`` document for the manifest's bytes."""
    kind, material = _material(key)
    if kind == "hmac":
        sig, alg, key_id = hmac.new(material, manifest, hashlib.sha256).digest(), "hmac-sha256", None
    else:
        from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: PLC0415

        private = serialization.load_pem_private_key(material, password=None)
        if not isinstance(private, Ed25519PrivateKey):
            raise ValueError("the archive signing key is not an Ed25519 private key")
        sig, alg = private.sign(manifest), "ed25519"
        key_id = _key_id(private.public_key())
    doc = {"alg": alg, "signed": "manifest.json", "signature": base64.b64encode(sig).decode()}
    if key_id:
        doc["key_id"] = key_id
    return json.dumps(doc, indent=2, sort_keys=True).encode()


def _key_id(public: Any) -> str:
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "sha256:" + hashlib.sha256(raw).hexdigest()[:16]


def check(manifest: bytes, signature: bytes | None, key: str, where: str) -> str:
    """Verify ``signature`` (the manifest.sig bytes, None when absent); returns the algorithm."""
    if signature is None:
        raise SignatureInvalid(
            f"archive {where}: not signed ({SIGNATURE_PATH} missing) but a verify key is set"
        )
    try:
        doc = json.loads(signature)
        alg, sig = doc["alg"], base64.b64decode(doc["signature"], validate=True)
    except (ValueError, KeyError, TypeError):
        raise SignatureInvalid(f"archive {where}: {SIGNATURE_PATH} is not a signature document") from None
    kind, material = _material(key)
    if kind == "hmac":
        ok = alg == "hmac-sha256" and hmac.compare_digest(
            sig, hmac.new(material, manifest, hashlib.sha256).digest()
        )
    else:
        from cryptography.exceptions import InvalidSignature  # noqa: PLC0415
        from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey  # noqa: PLC0415

        public = serialization.load_pem_public_key(material)
        if not isinstance(public, Ed25519PublicKey):
            raise ValueError("the archive verify key is not an Ed25519 public key")
        ok = False
        if alg == "ed25519":
            try:
                public.verify(sig, manifest)
                ok = True
            except InvalidSignature:
                pass
    if not ok:
        raise SignatureInvalid(f"archive {where}: the manifest signature does not verify ({alg})")
    return str(alg)
