"""The installed version of ``noetl-dagster``, read without importing ``importlib.metadata``.

``importlib.metadata`` costs ~20 ms to import (``email``, ``zipfile``, ``csv``...) on top of a
``--version`` that otherwise needs ~60 ms. The version is still pyproject.toml's, from the
installed metadata: this looks where ``importlib.metadata`` looks first (each ``sys.path``
directory in order, a ``<name>-<version>.dist-info`` or ``.egg-info`` of the distribution) and
reads the ``Version:`` header. Anything unusual (two candidates in one directory, no header, a
zip on the path holding it) falls back to ``importlib.metadata.version``, so the answer is the
same (tests/commands/test_cli_startup.py compares them).
"""

from __future__ import annotations

import os
import re
import sys

DISTRIBUTION = "noetl-dagster"


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _metadata_dirs(entry: str, wanted: str) -> list[str]:
    try:
        children = os.listdir(entry or ".")
    except OSError:  # not a directory (a zip, a missing entry): importlib.metadata may still find it there
        return []
    out = []
    for child in children:
        low = child.lower()
        if (
            low.endswith((".dist-info", ".egg-info"))
            and _normalized(low.rpartition(".")[0].partition("-")[0]) == wanted
        ):
            out.append(os.path.join(entry or ".", child))
    return out


def _header_version(meta_dir: str) -> str | None:
    for name in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(meta_dir, name), encoding="utf-8") as f:
                for line in f:
                    if not line.strip():  # the end of the headers
                        return None
                    if line.startswith("Version:"):
                        return line.partition(":")[2].strip() or None
        except OSError:
            continue
    return None


def package_version(distribution: str = DISTRIBUTION) -> str:
    """What ``importlib.metadata.version(distribution)`` answers (its exception when not installed)."""
    wanted = _normalized(distribution)
    for entry in sys.path:
        found = _metadata_dirs(entry, wanted)
        if len(found) == 1:
            version = _header_version(found[0])
            if version:
                return version
        if found:  # several, or one without a readable version: let importlib.metadata decide
            break
        if entry and not os.path.isdir(entry) and os.path.exists(entry):  # a zip: searched by importlib only
            break
    from importlib.metadata import version  # noqa: PLC0415

    return version(distribution)
