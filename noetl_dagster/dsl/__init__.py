"""Playbook DSL: canonical model, YAML loading with source lines, validation."""

from noetl_dagster.dsl.files import load_playbook, validate_file
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
    check_playbook,
    load_playbook_dict,
    parse_playbook,
)
from noetl_dagster.dsl.serialize import playbook_to_raw

__all__ = [
    "AdmitRule", "Arc", "Executor", "Loop", "Metadata", "Playbook", "PlaybookInvalid", "PolicyRule", "Router",
    "RuleThen", "SetBlock", "check_playbook", "SourceMap", "Step", "Task", "ValidationIssue", "WorkbookEntry", "YamlSyntaxError",
    "load_playbook", "load_playbook_dict", "load_yaml_file", "load_yaml_text", "parse_playbook",
    "playbook_to_raw", "validate_file",
]  # fmt: skip
