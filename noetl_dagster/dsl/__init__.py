"""Playbook DSL: canonical model, YAML loading with source lines, validation.

The names below are resolved on first access (PEP 562): importing a light module of this
package (``dsl.locator``, ``dsl.loader``) does not build the pydantic model or load the flow
parser, so a command pays only for what it uses (issue 35, docs/capacity.md "Start-up").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("load_playbook", "validate_file"), "files"),
    **dict.fromkeys(("SourceMap", "YamlSyntaxError", "load_yaml_file", "load_yaml_text"), "loader"),
    **dict.fromkeys(
        (
            "AdmitRule",
            "Arc",
            "Executor",
            "Loop",
            "Metadata",
            "Playbook",
            "PolicyRule",
            "Router",
            "RuleThen",
            "SetBlock",
            "Step",
            "Task",
            "WorkbookEntry",
        ),
        "model",
    ),  # fmt: skip
    **dict.fromkeys(
        ("PlaybookInvalid", "ValidationIssue", "check_playbook", "load_playbook_dict", "parse_playbook"),
        "parse",
    ),
    "playbook_to_raw": "serialize",
}

__all__ = [
    "AdmitRule", "Arc", "Executor", "Loop", "Metadata", "Playbook", "PlaybookInvalid", "PolicyRule", "Router",
    "RuleThen", "SetBlock", "check_playbook", "SourceMap", "Step", "Task", "ValidationIssue", "WorkbookEntry", "YamlSyntaxError",
    "load_playbook", "load_playbook_dict", "load_yaml_file", "load_yaml_text", "parse_playbook",
    "playbook_to_raw", "validate_file",
]  # fmt: skip

if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'noetl_dagster.dsl' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"noetl_dagster.dsl.{module}"), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
