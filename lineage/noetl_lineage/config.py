"""Is openlineage-python configured the standard way? (no heavy imports here:
the runner asks on every run, and lineage must cost nothing when it is off)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def _config_files() -> list[Path]:
    # os.path, not pathlib: asked on every run, and three Path objects cost more than the stats (issue 35)
    files = []
    if os.environ.get("OPENLINEAGE_CONFIG"):
        files.append(os.environ["OPENLINEAGE_CONFIG"])
    files.append(os.path.join(os.getcwd(), "openlineage.yml"))
    files.append(os.path.expanduser("~/.openlineage/openlineage.yml"))
    return [Path(f) for f in files if os.path.isfile(f)]


def is_configured() -> bool:
    """True when openlineage-python would find a transport configuration."""
    if os.environ.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return False
    if os.environ.get("OPENLINEAGE_URL"):
        return True
    if any(k.startswith("OPENLINEAGE__") for k in os.environ):
        return True
    return bool(_config_files())


def config_fingerprint() -> str:
    h = hashlib.sha256()
    for k in sorted(os.environ):
        if k.startswith("OPENLINEAGE") or k in ("NOETL_REGISTRY_URL", "NOETL_DAGSTER_HOME"):
            h.update(f"{k}={os.environ[k]}\n".encode())
    for f in _config_files():
        h.update(f"{f}:{f.stat().st_mtime_ns}\n".encode())
    return h.hexdigest()
