"""NoETL resource locator, shard key and object-prefix layout (seed 004 §4, §8, §14).

One record has two spellings:

    noetl://<tenant>/<project>/<namespace>/<type>/<name>@<version>
    urn:noetl:<tenant>:<project>:<namespace>:<type>:<name>:<version>

``name`` may have several ``/``-separated segments (``snapshots/2026-05-29``).
Every segment is checked against a strict character set: the parts end up in
object-store paths, SQL parameters, NATS subjects and Dagster asset keys, so
traversal (``..``), separators, percent-encoding, quotes and whitespace are
refused rather than escaped.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date as _date

SCHEME = "noetl://"
URN_PREFIX = "urn:noetl:"
DEFAULT_SHARD_COUNT = 256

# tenant / project: used in paths and subjects; no dots so they cannot form "." or "..".
_SCOPE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
# namespace / type / name segment / version: dots allowed inside, never leading or trailing
# (a trailing dot is dropped by some filesystems and object stores: `x.` and `x` would collide).
_SEGMENT_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,126}[A-Za-z0-9_-])?$")
_MAX_NAME_SEGMENTS = 16


class InvalidLocator(ValueError):
    """A string is not a well-formed noetl:// URI or urn:noetl URN."""


def _check(value: str, what: str, pattern: re.Pattern[str]) -> str:
    if not isinstance(value, str) or not pattern.match(value) or ".." in value:
        raise InvalidLocator(
            f"invalid {what} {value!r}: use letters, digits, '_' and '-'"
            + (" and inner '.'" if pattern is _SEGMENT_RE else "")
            + f" (at most {64 if pattern is _SCOPE_RE else 128} characters, starting with a letter or digit"
            + (", not ending with '.')" if pattern is _SEGMENT_RE else ")")
        )
    return value


def check_scope(value: str, what: str = "tenant") -> str:
    """A tenant or project name by the locator's rule (the one rule: service, clients, CLI options)."""
    return _check(value, what, _SCOPE_RE)


def check_segment(value: str, what: str = "segment") -> str:
    """A namespace, type, name segment or version by the locator's rule."""
    return _check(value, what, _SEGMENT_RE)


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidLocator("resource name is empty")
    parts = name.split("/")
    if len(parts) > _MAX_NAME_SEGMENTS:
        raise InvalidLocator(f"resource name {name!r} has more than {_MAX_NAME_SEGMENTS} segments")
    for part in parts:
        _check(part, "name segment", _SEGMENT_RE)
    return name


@dataclass(frozen=True, order=True)
class ResourceLocator:
    """The logical identity of one registry record (version optional until registered)."""

    tenant: str
    project: str
    namespace: str
    type: str
    name: str
    version: str | None = None

    def __post_init__(self) -> None:
        _check(self.tenant, "tenant", _SCOPE_RE)
        _check(self.project, "project", _SCOPE_RE)
        _check(self.namespace, "namespace", _SEGMENT_RE)
        _check(self.type, "resource type", _SEGMENT_RE)
        _check_name(self.name)
        if self.version is not None:
            _check(self.version, "version", _SEGMENT_RE)

    # --- spellings -------------------------------------------------------
    @property
    def uri(self) -> str:
        base = f"{SCHEME}{self.tenant}/{self.project}/{self.namespace}/{self.type}/{self.name}"
        return base if self.version is None else f"{base}@{self.version}"

    @property
    def urn(self) -> str:
        if self.version is None:
            raise InvalidLocator(f"{self.uri} has no version; a URN always names one version")
        return f"{URN_PREFIX}{self.tenant}:{self.project}:{self.namespace}:{self.type}:{self.name}:{self.version}"

    @property
    def series(self) -> str:
        """The unversioned URI: every version of this resource shares it."""
        return self.unversioned().uri

    def unversioned(self) -> ResourceLocator:
        return ResourceLocator(self.tenant, self.project, self.namespace, self.type, self.name)

    def with_version(self, version: str | None) -> ResourceLocator:
        return ResourceLocator(self.tenant, self.project, self.namespace, self.type, self.name, version)

    def asset_key(self) -> list[str]:
        return [self.tenant, self.project, self.namespace, *self.name.split("/")]

    def __str__(self) -> str:
        return self.uri


# the tenant of a resource named anywhere in a text, in either spelling (noetl://T/… or urn:noetl:T:…)
_TENANT_IN_TEXT = re.compile(r"(?:noetl://|urn:noetl:)([^/:@\s'\"]+)", re.IGNORECASE)


def tenants_named(text: str) -> Iterator[str]:
    """The tenant of every resource locator ``text`` names, in both spellings: the trust gate's
    one reading of "which tenant does this reach" (a scheme in any case counts)."""
    for m in _TENANT_IN_TEXT.finditer(text):
        yield m.group(1)


def parse_locator(text: str, *, require_version: bool = True) -> ResourceLocator:
    """Parse either spelling. ``require_version=False`` accepts the unversioned form
    (used to register a new version or to resolve the latest one)."""
    if not isinstance(text, str):
        raise InvalidLocator(f"expected a string, got {type(text).__name__}")
    if any(ch.isspace() or ord(ch) < 32 for ch in text):
        raise InvalidLocator(f"locator contains whitespace or control characters: {text!r}")
    if text.startswith(SCHEME):
        body = text[len(SCHEME) :]
        if "?" in body or "#" in body or "\\" in body:
            raise InvalidLocator(f"a noetl:// URI has no query, fragment or backslash: {text!r}")
        path, sep, version = body.partition("@")
        if sep and "@" in version:
            raise InvalidLocator(f"more than one '@' in {text!r}")
        parts = path.split("/")
        if len(parts) < 5:
            raise InvalidLocator(
                f"{text!r}: expected noetl://<tenant>/<project>/<namespace>/<type>/<name>@<version>"
            )
        tenant, project, namespace, rtype = parts[:4]
        name = "/".join(parts[4:])
        loc_version: str | None = version if sep else None
        if sep and not version:
            raise InvalidLocator(f"empty version after '@' in {text!r}")
    elif text.startswith(URN_PREFIX):
        parts = text[len(URN_PREFIX) :].split(":")
        if len(parts) != 6:
            raise InvalidLocator(
                f"{text!r}: expected urn:noetl:<tenant>:<project>:<namespace>:<type>:<name>:<version>"
            )
        tenant, project, namespace, rtype, name, loc_version = parts
        if not loc_version:
            raise InvalidLocator(f"empty version in {text!r}")
    else:
        raise InvalidLocator(f"not a noetl:// URI or urn:noetl URN: {text!r}")
    loc = ResourceLocator(tenant, project, namespace, rtype, name, loc_version)
    if require_version and loc.version is None:
        raise InvalidLocator(f"{text!r} has no version (append @<version>, e.g. @v1 or @latest)")
    return loc


def format_uri(
    tenant: str, project: str, namespace: str, type: str, name: str, version: str | None = None
) -> str:
    return ResourceLocator(tenant, project, namespace, type, name, version).uri


def format_urn(tenant: str, project: str, namespace: str, type: str, name: str, version: str) -> str:
    return ResourceLocator(tenant, project, namespace, type, name, version).urn


def to_urn(text: str) -> str:
    return parse_locator(text).urn


def to_uri(text: str) -> str:
    return parse_locator(text, require_version=False).uri


def is_locator(text: object) -> bool:
    return isinstance(text, str) and (text.startswith(SCHEME) or text.startswith(URN_PREFIX))


def asset_key_for_uri(uri: str) -> list[str]:
    """Dagster asset key path for a resource: ``[tenant, project, namespace, *name_segments]``.

    The version is not part of the key (each version is one materialization of the
    asset), nor is the type (it is kept in asset metadata as ``noetl/type``)."""
    return parse_locator(uri, require_version=False).asset_key()


# --- shards and object prefixes (seed 004 §4) --------------------------------


def shard_for(
    tenant: str, project: str, affinity: str = "", *, shard_count: int = DEFAULT_SHARD_COUNT
) -> int:
    """``hash(tenant + project [+ affinity]) % shard_count`` with a stable hash (sha256),
    so every process and language computes the same shard."""
    if shard_count < 1:
        raise ValueError("shard_count must be >= 1")
    key = "\x1f".join((tenant, project, affinity)) if affinity else f"{tenant}\x1f{project}"
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") % shard_count


def shard_name(shard: int) -> str:
    """``s0042``: the logical shard id used in stream names, databases and prefixes."""
    if shard < 0 or shard > 9999:
        raise ValueError(f"shard out of range: {shard}")
    return f"s{shard:04d}"


def shard_key(
    tenant: str, project: str, affinity: str = "", *, shard_count: int = DEFAULT_SHARD_COUNT
) -> str:
    return shard_name(shard_for(tenant, project, affinity, shard_count=shard_count))


@dataclass(frozen=True)
class ObjectLayout:
    """Where payloads go inside a store:
    ``noetl/env=<env>/region=<region>/cell=<cell>/shard=<sNNNN>/tenant=<t>/project=<p>/[date=…/][execution=…/]``."""

    env: str = "dev"
    region: str = "local"
    cell: str = "local-a"
    shard_count: int = DEFAULT_SHARD_COUNT
    root: str = "noetl"

    def __post_init__(self) -> None:
        for what, value in (("env", self.env), ("region", self.region), ("cell", self.cell)):
            _check(value, what, _SCOPE_RE)
        _check(self.root, "root", _SEGMENT_RE)

    def prefix(
        self,
        tenant: str,
        project: str,
        *,
        date: _date | str | None = None,
        execution_id: str | None = None,
        affinity: str = "",
    ) -> str:
        _check(tenant, "tenant", _SCOPE_RE)
        _check(project, "project", _SCOPE_RE)
        shard = shard_key(tenant, project, affinity, shard_count=self.shard_count)
        parts = [
            self.root,
            f"env={self.env}",
            f"region={self.region}",
            f"cell={self.cell}",
            f"shard={shard}",
            f"tenant={tenant}",
            f"project={project}",
        ]
        if date is not None:
            day = date.isoformat() if isinstance(date, _date) else _check(date, "date", _SEGMENT_RE)
            parts.append(f"date={day}")
        if execution_id is not None:
            parts.append(f"execution={_check(str(execution_id), 'execution id', _SEGMENT_RE)}")
        return "/".join(parts) + "/"

    def key(self, tenant: str, project: str, relative: str, **kw: object) -> str:
        """A full object key: the prefix plus a relative path checked segment by segment."""
        rel = [_check(seg, "key segment", _SEGMENT_RE) for seg in relative.split("/")]
        return self.prefix(tenant, project, **kw) + "/".join(rel)  # type: ignore[arg-type]


DEFAULT_LAYOUT = ObjectLayout()


def object_prefix(tenant: str, project: str, **kw: object) -> str:
    return DEFAULT_LAYOUT.prefix(tenant, project, **kw)  # type: ignore[arg-type]
