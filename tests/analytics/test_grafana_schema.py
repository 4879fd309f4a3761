"""The Grafana dashboard JSON against the structure of Grafana's dashboard schema (issue 18.4).

The field names and types are checked against Grafana's schema itself (the official
grafana-foundation-sdk models) in test_grafana_schema_sdk.py; this file checks what that schema
does not model: the import envelope (``__inputs`` / ``__requires``), unique panel ids, the
24-column grid without overlaps, each target's refId, SQL and format, and the datasource the
import inputs declare."""

from __future__ import annotations

from noetl_analytics.dashboard_access import Viewer
from noetl_analytics.grafana import build_dashboard

PANEL_TYPES = {"stat", "timeseries", "barchart", "table", "bargauge", "piechart", "text", "gauge", "heatmap"}


def test_dashboard_has_the_schema_required_fields():
    d = build_dashboard(viewer=Viewer.everyone())
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36
    assert (
        isinstance(d["title"], str) and d["title"] and isinstance(d["uid"], str) and 0 < len(d["uid"]) <= 40
    )
    assert isinstance(d["editable"], bool) and isinstance(d["tags"], list)
    assert set(d["time"]) >= {"from", "to"} and isinstance(d["templating"]["list"], list)
    assert isinstance(d["annotations"]["list"], list)
    inputs = {i["name"]: i for i in d["__inputs"]}
    assert inputs["DS_CLICKHOUSE"]["type"] == "datasource"
    assert inputs["DS_CLICKHOUSE"]["pluginId"] == "grafana-clickhouse-datasource"
    assert any(r["id"] == "grafana-clickhouse-datasource" for r in d["__requires"])


def test_panels_and_targets_are_well_formed():
    d = build_dashboard(viewer=Viewer.everyone())
    ids, cells = set(), set()
    for p in d["panels"]:
        assert isinstance(p["id"], int) and p["id"] not in ids
        ids.add(p["id"])
        assert p["type"] in PANEL_TYPES and p["title"]
        g = p["gridPos"]
        assert all(isinstance(g[k], int) and g[k] >= 0 for k in "xywh") and g["w"] > 0 and g["h"] > 0
        assert g["x"] + g["w"] <= 24, p["title"]
        cover = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cover & cells, f"{p['title']} overlaps another panel"
        cells |= cover
        assert p["datasource"] == {"type": "grafana-clickhouse-datasource", "uid": "${DS_CLICKHOUSE}"}
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(set(refs)) == len(refs)
        for t in p["targets"]:
            assert t["rawSql"].strip() and t["format"] in (0, 1, 2, "table", "time_series")
