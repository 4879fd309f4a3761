"""Playbooks -> Dagster definitions (jobs, ops, schedules, the token-routing sensor).

from noetl_dagster.translator import build_playbook_definitions
defs = build_playbook_definitions("playbooks/")
"""

from noetl_dagster.translator.build import (
    CompiledPlaybook,
    NoetlCodeLocation,
    PlaybookIndex,
    build_playbook_definitions,
    compile_playbooks,
)
from noetl_dagster.translator.translator import (
    NoetlAssetData,
    NoetlJobSpec,
    NoetlNodeData,
    NoetlOpSpec,
    NoetlPlaybookData,
    NoetlScheduleSpec,
    NoetlStepData,
    NoetlTranslator,
)

__all__ = [
    "CompiledPlaybook", "NoetlAssetData", "NoetlCodeLocation", "NoetlJobSpec", "NoetlNodeData", "NoetlOpSpec", "NoetlPlaybookData",
    "NoetlScheduleSpec", "NoetlStepData", "NoetlTranslator", "PlaybookIndex", "build_playbook_definitions",
    "compile_playbooks",
]  # fmt: skip
