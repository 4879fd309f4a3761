"""The three legacy playbooks migrate to valid standard files; standard files pass through; migrating twice changes nothing."""

from __future__ import annotations

import pytest
import yaml

from noetl_dagster.dsl import validate_file
from noetl_dagster.dsl.legacy import find_deprecated_spellings, find_legacy_constructs
from noetl_dagster.dsl.migrate import migrate_file, migrate_text
from tests.dsl.migrate.conftest import EARLY_V2, LABELMAP_V2, WEATHER_V1, issues_of, step

LEGACY = [WEATHER_V1, EARLY_V2, LABELMAP_V2]


@pytest.mark.parametrize("path", LEGACY, ids=lambda p: p.name.split("__")[-1])
def test_legacy_playbooks_migrate_to_files_that_validate(path, tmp_path):
    r = migrate_file(path)
    assert r.changed and not r.refused, [str(n) for n in r.refused]
    out = tmp_path / path.name
    out.write_text(r.text)
    assert [str(i) for i in validate_file(out)] == []
    assert find_legacy_constructs(yaml.safe_load(r.text)) == []
    again = migrate_text(r.text, str(out))
    assert not again.changed and again.text == r.text  # idempotent
    assert all(n.file == str(path) and n.line >= 1 for n in r.notes)


def test_the_legacy_playbooks_do_not_validate_before_migration_and_validate_names_migrate(tmp_path):
    from noetl_dagster.dsl.files import check_file_with_warnings

    for path in LEGACY:
        # legacy constructs are errors; NoETL's renamed keys (task `args`) only deprecation warnings
        _, issues, warnings = check_file_with_warnings(path)
        assert issues or warnings, path
        assert any("noetl-dagster migrate" in i.message for i in issues + warnings)


def test_weather_v1_shape_after_migration():
    doc = yaml.safe_load(migrate_file(WEATHER_V1).text)
    assert doc["metadata"] == {"name": "weather_example", "path": "examples/weather_loop_example"}
    loop = step(doc, "city_loop")
    labels = [t.get("name") or next(iter(t)) for t in loop["tool"]]
    assert labels == ["city_loop_bind", "fetch_and_evaluate", "check_alert_needed", "alert_step", "log_step",
                      "city_loop_iteration"]  # fmt: skip
    assert step(doc, "aggregate_alerts")["next"]["spec"] == {"mode": "inclusive"}
    assert [w["name"] for w in doc["workbook"]][:2] == ["log_forcast_request", "get_forecast"]
    assert all("tool" in w and "kind" in w["tool"] for w in doc["workbook"])


def test_early_v2_shape_after_migration():
    doc = yaml.safe_load(migrate_file(EARLY_V2).text)
    fetch = step(doc, "fetch_weather_data")
    assert [t["name"] for t in fetch["tool"]] == [
        "fetch_weather_data",
        "fetch_weather_data_sink",
        "fetch_weather_data_log",
    ]
    assert fetch["loop"]["spec"] == {"mode": "sequential"}
    assert step(doc, "verify_results")["set"] == {"ctx.verify_results": "{{ {'command_0': verify_results} }}"}
    assert step(doc, "validate_data")["tool"]["input"] == {"verify_results": "{{ ctx.verify_results }}"}


def test_label_map_file_keeps_its_form():
    r = migrate_file(LABELMAP_V2)
    doc = yaml.safe_load(r.text)
    tools = step(doc, "process_items")["tool"]
    assert list(tools[0]) == ["transform"] and tools[0]["transform"]["input"] == {"item": "{{ item }}"}
    # only the changed key differs from the original text
    changed = [(a, b) for a, b in zip(r.original.splitlines(), r.text.splitlines(), strict=True) if a != b]
    assert changed == [("          args:", "          input:")]


def _e2e_files(conformance_dir):
    return sorted(conformance_dir.rglob("*.yaml"))


def test_standard_form_files_pass_through_byte_for_byte(conformance_dir):
    files = _e2e_files(conformance_dir)
    assert len(files) > 100
    standard = 0
    for f in files:
        text = f.read_text()
        doc = yaml.safe_load(text)
        if find_legacy_constructs(doc) or find_deprecated_spellings(doc):  # renamed keys are rewritten
            continue
        standard += 1
        r = migrate_text(text, str(f))
        assert r.text == text and not r.notes, f
    assert standard > 100


def test_corpus_remnants_migrate_to_valid_idempotent_files(conformance_dir, tmp_path):
    remnants = [
        f for f in _e2e_files(conformance_dir) if find_legacy_constructs(yaml.safe_load(f.read_text()))
    ]
    assert remnants  # the corpus still has a few retry blocks and task args
    for f in remnants:
        r = migrate_file(f)
        assert r.changed and not r.refused, f
        assert find_legacy_constructs(yaml.safe_load(r.text)) == []
        issues = [i for i in issues_of(r.text) if "unknown-tool-kind" not in i]  # kinds this project lacks
        assert issues == [], f
        assert migrate_text(r.text, str(f)).text == r.text
