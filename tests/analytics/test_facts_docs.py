"""docs/analytics.md documents the SQL behind every dashboard panel, verbatim."""

from __future__ import annotations

from pathlib import Path

from noetl_analytics.panels import PANELS

DOC = Path(__file__).resolve().parents[2] / "docs" / "analytics.md"


def test_every_panel_sql_is_documented():
    text = DOC.read_text()
    for panel in PANELS:
        assert f"```sql\n{panel.sql}\n```" in text, (
            f"{panel.key}: regenerate the panel SQL in docs/analytics.md"
        )
