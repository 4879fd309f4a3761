"""Playbook DSL: canonical model, YAML loading with source lines, validation."""

from noetl_dagster.dsl.loader import SourceMap, YamlSyntaxError, load_yaml_file, load_yaml_text
from noetl_dagster.dsl.model import (
    AdmitRule,
    Arc,
    Executor,
    Loop,
    Metadata,
    Playbook,
    PolicyRule,
    Router,
    RuleThen,
    SetBlock,
    Step,
    Task,
    WorkbookEntry,
)
from noetl_dagster.dsl.parse import (
    PlaybookInvalid,
    ValidationIssue,
    load_playbook,
    load_playbook_dict,
    parse_playbook,
    playbook_to_raw,
    validate_file,
)

__all__ = [
    "AdmitRule", "Arc", "Executor", "Loop", "Metadata", "Playbook", "PlaybookInvalid", "PolicyRule", "Router",
    "RuleThen", "SetBlock", "SourceMap", "Step", "Task", "ValidationIssue", "WorkbookEntry", "YamlSyntaxError",
    "load_playbook", "load_playbook_dict", "load_yaml_file", "load_yaml_text", "parse_playbook",
    "playbook_to_raw", "validate_file",
]  # fmt: skip
