"""The migrated legacy playbooks run to completion on the local runner against a local
Open-Meteo-style server and the real Postgres, writing the rows the originals meant to write."""

from __future__ import annotations

import duckdb
import psycopg

from noetl_dagster.dsl.migrate import migrate_file
from noetl_dagster.runners.local import run_playbook
from tests.dsl.migrate.conftest import EARLY_V2, LABELMAP_V2, WEATHER_V1, Stub


def _write(tmp_path, path, replace: dict[str, str] | None = None):
    text = migrate_file(path).text
    for old, new in (replace or {}).items():
        assert old in text
        text = text.replace(old, new)  # point hard-coded public hosts at the local server
    out = tmp_path / "migrated.yaml"
    out.write_text(text)
    return out


def test_label_map_playbook_writes_one_row_per_item(tmp_path, data_dir, pg_local):
    pb = _write(tmp_path, LABELMAP_V2)
    res = run_playbook(pb, {"pg_auth": "pg_local"})
    assert res.status == "completed", res.to_json()
    assert res.runs == {"start": 1, "create_table": 1, "process_items": 1, "end": 1}
    with psycopg.connect(pg_local) as conn:
        rows = conn.execute(
            "SELECT item_name, item_value FROM public.iterator_save_test WHERE execution_id = %s ORDER BY item_name",
            (res.execution_id,),
        ).fetchall()
    assert rows == [("item1", 100), ("item2", 200), ("item3", 300)]


def test_early_v2_http_loop_with_case_sink_saves_every_city(tmp_path, data_dir, pg_local, http_stub: Stub):
    pb = _write(tmp_path, EARLY_V2, {"https://api.open-meteo.com": http_stub.url})
    res = run_playbook(pb)  # the playbook's own workload names pg_local
    assert res.status == "completed", res.to_json()
    assert res.results["validate_data"]["status"] == "success"
    assert [g["path"] for g in http_stub.gets] == ["/v1/forecast"] * 3
    with psycopg.connect(pg_local) as conn:
        rows = conn.execute(
            "SELECT city_name, temperature::float, latitude::float, http_status FROM public.http_iterator_save_test"
            " WHERE execution_id = %s ORDER BY city_name",
            (res.execution_id,),
        ).fetchall()
    assert rows == [
        ("Berlin", Stub.temperature(52.52), 52.52, 200),
        ("London", Stub.temperature(51.5074), 51.5074, 200),
        ("Paris", Stub.temperature(48.8566), 48.8566, 200),
    ]


def test_v1_weather_loop_runs_its_folded_chain_and_stores_the_summary(tmp_path, data_dir, http_stub: Stub):
    pb = _write(tmp_path, WEATHER_V1, {"https://postman-echo.com": http_stub.url})
    res = run_playbook(pb, {"base_url": http_stub.url + "/v1", "temperature_threshold": 12.9})
    assert res.status == "completed", res.to_json()
    # every city was fetched and evaluated, and each took the branch its temperature called for
    iters = res.results["city_loop"]["results"]
    maxima = {i["fetch_and_evaluate"]["city"]: i["fetch_and_evaluate"]["max_temp"] for i in iters}
    assert maxima == {
        c: Stub.temperature(lat) for c, lat in (("London", 51.51), ("Paris", 48.85), ("Berlin", 52.52))
    }
    for i in iters:
        hot = i["fetch_and_evaluate"]["alert"]
        assert hot == (i["fetch_and_evaluate"]["max_temp"] > 12.9)
        assert (i["alert_step"] is not None) == hot and (i["log_step"] is not None) == (not hot)
    kinds = sorted(p["kind"] for p in http_stub.posts)
    hot_count = sum(i["fetch_and_evaluate"]["alert"] for i in iters)
    assert kinds.count("city_alert") == hot_count and kinds.count("city_log") == 3 - hot_count
    # the join after the inclusive fan-out stores the summary once
    assert res.runs["store_aggregate_result"] == 1
    db = next(data_dir.rglob("postgres_pipeline.duckdb"))
    with duckdb.connect(str(db), read_only=True) as con:
        stored = con.execute("SELECT alert_count FROM weather_alert_summary").fetchall()
    assert stored == [(res.results["aggregate_alerts"]["summary"]["count"],)]
