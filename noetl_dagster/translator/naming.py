"""Dagster-safe, collision-free names for jobs and ops.

Dagster names must match ``^[A-Za-z0-9_]+$`` and op names must be unique in a
code location, so every name is derived from the playbook (job) and step (op)
and disambiguated with a short hash of the original id when two originals
sanitize to the same name. Names are deterministic: the same playbooks give
the same names in every process (run workers reload the code location).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Sequence

from noetl_dagster.dsl.locator import parse_locator

_UNSAFE = re.compile(r"[^A-Za-z0-9_]+")
NAME_RE = re.compile(r"^[A-Za-z0-9_]+$")
MAX_BASE = 60  # keep names readable in the UI; the hash suffix keeps them unique


def short_hash(text: str, n: int = 6) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:n]


def sanitize(text: str) -> str:
    """``text`` with every run of unsafe characters replaced by ``_`` (never empty)."""
    s = _UNSAFE.sub("_", str(text)).strip("_")
    if not s:
        s = "x"
    if s[0].isdigit():
        s = "n" + s
    if len(s) > MAX_BASE:
        s = s[:MAX_BASE].rstrip("_") + "_" + short_hash(text)
    return s


def job_base(text: str) -> str:
    """A job name never contains ``__``: op names are ``<job>__<step>``, so they cannot clash across jobs."""
    return re.sub("_+", "_", sanitize(text))


def unique_names(
    originals: Iterable[tuple[str, str]],
    *,
    base_fn: Callable[[str], str] = sanitize,
    reserved: Iterable[str] = (),
) -> dict[str, str]:
    """Map each key to a sanitized name; keys whose names clash get ``_<hash of identity>``.

    ``originals`` yields ``(key, display_text)`` pairs; the key is the stable identity
    (e.g. a playbook's file or metadata.path) hashed into the suffix. ``reserved`` names
    are never given out.
    """
    pairs = list(originals)
    base: dict[str, str] = {key: base_fn(text) for key, text in pairs}
    count: dict[str, int] = {name: 2 for name in reserved}
    for name in base.values():
        count[name] = count.get(name, 0) + 1
    out: dict[str, str] = {}
    taken: set[str] = set(reserved)
    for key, _text in pairs:
        name = base[key]
        if count[name] > 1:
            name = f"{name}_{short_hash(key)}"
        while name in taken:  # a hash suffix that clashes with another literal name
            name = f"{name}_{short_hash(name + key, 4)}"
        taken.add(name)
        out[key] = name
    return out


# How much of a table's noetl://<tenant>/<project>/<namespace>/<type>/<name> its asset key carries:
# the catalog shows the key's path, so the default leaves out the tenant and project a code
# location is usually scoped to (like dagster-dbt's [model name]); "tenant" is the full scope, for a
# location that serves several tenants or projects.
KEY_SCOPES = ("name", "namespace", "project", "tenant")
DEFAULT_KEY_SCOPE = "namespace"


def table_key(uri: str, scope: str = DEFAULT_KEY_SCOPE, prefix: Sequence[str] = ()) -> list[str]:
    """The asset key path of the table ``uri`` names: ``[*prefix, <scope parts>, *name segments]``
    (``namespace``: ``sales/daily_sales`` for ``noetl://demo/examples/sales/dataset/daily_sales``).
    The version and the type are not part of it. Raises InvalidLocator for a non-noetl:// text."""
    if scope not in KEY_SCOPES:
        raise ValueError(f"asset key scope {scope!r}: use one of {', '.join(KEY_SCOPES)}")
    loc = parse_locator(uri, require_version=False)
    head = {"name": [], "namespace": [loc.namespace], "project": [loc.project, loc.namespace],
            "tenant": [loc.tenant, loc.project, loc.namespace]}[scope]  # fmt: skip
    return [*prefix, *head, *loc.name.split("/")]
