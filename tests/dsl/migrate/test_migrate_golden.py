"""Golden test: the exact output of `migrate_text` (migrated YAML and the notes report)
for the legacy conformance playbooks, the noetl-e2e corpus and every input the other
migrate tests feed it, recorded from the single-module implementation before it was
split into the `noetl_dagster.dsl.migrate` package. Any byte of difference fails.

Layout: golden/manifest.json lists the cases (`source` is `shared:<path under
/work/shared>` or `inputs/<id>.yaml`); golden/out/<id>.txt holds the report, then
the migrated text (or `UNCHANGED`, or the input error). Regenerate only on purpose
with golden/regen.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from noetl_dagster.dsl.migrate import MigrationInputError, migrate_text

GOLDEN = Path(__file__).resolve().parent / "golden"
SHARED = Path(os.environ.get("NOETL_SHARED", Path(__file__).resolve().parents[3].parent / "shared"))
CASES = json.loads((GOLDEN / "manifest.json").read_text()) if (GOLDEN / "manifest.json").exists() else []


def read_input(case: dict) -> str:
    src = case["source"]
    if src.startswith("shared:"):
        return (SHARED / src[len("shared:") :]).read_text(encoding="utf-8")
    return (GOLDEN / src).read_text(encoding="utf-8")


def render(text: str, file: str, fn=None) -> str:
    fn = fn or migrate_text
    try:
        r = fn(text, file)
    except MigrationInputError as e:
        return f"=== error\n{e}\n"
    notes = "".join(f"{n}\n" for n in r.notes)
    body = "UNCHANGED\n" if r.text == text else r.text
    return (
        f"=== notes ({len(r.notes)}, changed={r.changed}, refused={len(r.refused)})\n{notes}=== text\n{body}"
    )


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_migrate_output_is_byte_identical_to_golden(case: dict) -> None:
    if case["source"].startswith("shared:") and not (SHARED / case["source"][7:]).exists():
        pytest.skip(f"shared material missing: {case['source']}")
    expected = (GOLDEN / "out" / f"{case['id']}.txt").read_text(encoding="utf-8")
    assert render(read_input(case), case["file"]) == expected


def test_golden_covers_the_legacy_conformance_playbooks() -> None:
    ids = {c["source"] for c in CASES}
    for name in ("weather_loop_example", "iterator_save_test", "http_iterator_save_postgres"):
        assert any("conformance/legacy/" in s and name in s for s in ids), name
