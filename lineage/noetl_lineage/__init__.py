"""NoETL events -> OpenLineage RunEvents (openlineage-python), emitted off the hot path.

``listener_from_env()`` returns an event listener when openlineage-python is
configured the standard way, else None (without importing openlineage, so an
unconfigured run pays nothing); runners pass it each durably appended event.
See docs/lineage.md.
"""

from __future__ import annotations

import importlib
from typing import Any

from noetl_dagster.util.extras import require
from noetl_lineage.config import is_configured

_LAZY = {
    "LineageConverter": "noetl_lineage.convert",
    "convert_all": "noetl_lineage.convert",
    "playbook_run_id": "noetl_lineage.convert",
    "step_run_id": "noetl_lineage.convert",
    "LineageEmitter": "noetl_lineage.emitter",
    "close_all": "noetl_lineage.emitter",
    "file_client": "noetl_lineage.emitter",
    "flush_all": "noetl_lineage.emitter",
    "registry_describer": "noetl_lineage.emitter",
    "LineageValidator": "noetl_lineage.validate",
}


def listener_from_env() -> Any:
    """The process-wide lineage listener (a callable taking an Event), or None when
    OpenLineage is not configured (openlineage.yml, OPENLINEAGE_CONFIG,
    OPENLINEAGE__TRANSPORT__*, OPENLINEAGE_URL) or disabled (OPENLINEAGE_DISABLED=true)."""
    if not is_configured():
        return None
    # configured but not installed: the one-line hint, not a lost stream of lineage events
    require("openlineage.client", "OpenLineage events (configured by openlineage.yml or OPENLINEAGE_*)")
    from noetl_lineage.emitter import listener_from_env as build  # noqa: PLC0415

    return build()


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lineage' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["is_configured", "listener_from_env", *_LAZY]
