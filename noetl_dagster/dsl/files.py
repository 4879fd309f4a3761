"""Playbook files: YAML (``.yaml``/``.yml``) and flow (``.flow``) sources to one model.

This is the top of the ``dsl`` layer: it picks the front end by file suffix.
"""

from __future__ import annotations

from pathlib import Path

from noetl_dagster.dsl.flow import FlowError, load_flow_playbook
from noetl_dagster.dsl.loader import YamlSyntaxError, load_yaml_file
from noetl_dagster.dsl.model import Playbook
from noetl_dagster.dsl.parse import PlaybookInvalid, ValidationIssue, load_playbook_dict, parse_playbook


def load_playbook(path: str | Path) -> Playbook:
    """Load and validate a playbook file; raises PlaybookInvalid (incl. YAML syntax errors)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such playbook file")
    if p.suffix == ".flow":
        return _load_flow(p)
    try:
        raw, sm = load_yaml_file(p)
    except YamlSyntaxError as e:
        raise PlaybookInvalid([ValidationIssue(e.file, e.line, "", "yaml-syntax", e.message)]) from None
    return load_playbook_dict(raw, source_file=str(p.resolve()), source_map=sm)


def validate_file(path: str | Path) -> list[ValidationIssue]:
    p = Path(path)
    if not p.is_file():
        return [ValidationIssue(str(p), 0, "", "file-not-found", "no such file")]
    if p.suffix == ".flow":
        try:
            _load_flow(p)
        except PlaybookInvalid as e:
            return e.issues
        return []
    try:
        raw, sm = load_yaml_file(p)
    except YamlSyntaxError as e:
        return [ValidationIssue(e.file, e.line, "", "yaml-syntax", e.message)]
    _, issues = parse_playbook(raw, source_map=sm, source_file=str(p))
    return issues


def _load_flow(p: Path) -> Playbook:
    """A ``.flow`` file (seed 002 syntax) compiled to a playbook; flow errors keep line and column."""
    try:
        return load_flow_playbook(p)
    except FlowError as e:
        where = f"column {e.column}: " if e.column is not None else ""
        raise PlaybookInvalid([ValidationIssue(str(p), e.line or 1, "", e.rule, where + e.message)]) from None


