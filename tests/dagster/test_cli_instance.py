"""The instance ``run --runner dagster`` opens without DAGSTER_HOME (translator/runner.open_instance)."""

from __future__ import annotations

import dagster as dg

from noetl_dagster.translator.runner import open_instance, run_playbook_dagster

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: one_connection, path: tests/one_connection}
workflow:
  - step: start
    tool:
      - burn: {kind: python, code: "result = sum(i * i for i in range(1000))"}
    next: {arcs: [{step: done}]}
  - step: done
    tool: {kind: noop}
"""


def test_the_ephemeral_instance_writes_dagster_events_on_one_connection(tmp_path, dagster_data, monkeypatch):
    """Its in-memory event log shares the SQLite connection it holds (runner._one_event_connection;
    Dagster's opens one per write, 0.88x CPU a small execution without it, benchmarks/bench_platform_line.py):
    every event of the run is stored and read back, and no connection is opened for them."""
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    pb = tmp_path / "one_connection.yaml"
    pb.write_text(PLAYBOOK)
    instance = open_instance()
    storage = instance._event_storage
    connects = []
    engine_connect = storage._engine.connect
    monkeypatch.setattr(storage._engine, "connect", lambda: connects.append(1) or engine_connect())
    try:
        res = run_playbook_dagster(pb, data_dir=dagster_data, instance=instance)
        assert res.status == "completed", res.results
        [run_id] = res.extra["dagster"]["run_ids"]
        kinds = [e.dagster_event.event_type_value for e in instance.all_logs(run_id) if e.dagster_event]
        t = dg.DagsterEventType
        assert kinds[0] == t.RUN_START.value and kinds[-1] == t.RUN_SUCCESS.value
        assert kinds.count(t.STEP_SUCCESS.value) == 3
        assert connects == []
    finally:
        instance.dispose()
