"""Asset-first round 2 (issue 31): partitions keep their own data (a partition's checks and drift see
its own version, a backfill through the daemon leaves one record per key, a single-run backfill policy
hands the playbook its range), subsets run only what the selected tables need, the component's op
tags and pool reach the Materialize op, and a failed Materialize names the user's step, task and
playbook line with the user's traceback."""

from __future__ import annotations

import logging
import os
import time

import dagster as dg
import pytest
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
from dagster._core.test_utils import create_test_daemon_workspace_context
from dagster._core.workspace.load_target import PythonFileTarget
from dagster._daemon.backfill import execute_backfill_iteration
from dagster_helpers import tables_of

from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.translator import compile_playbooks
from noetl_dagster.translator.component import NoetlTranslation, _ConfiguredTranslator

EVENTS = dg.AssetKey(["t", "daily_events"])
SERIES = "noetl://demo/examples/t/dataset/daily_events"


def _res(data_dir):
    return NoetlResource(data_dir=str(data_dir), tenant="demo", project="examples")


def _defs(paths, data_dir, **kw):
    return compile_playbooks(paths, include_sensor=False, resource=_res(data_dir), **kw).definitions


DAILY = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: daily_events, path: tests/daily_events}}
executor:
  spec:
    dagster:
      partitions: {{daily: 2026-11-20, workload_key: day{extra}}}
workload: {{day: "2026-01-01"}}
workflow:
  - step: start
    tool:
      - make:
          kind: python
          input: {{day: "{{{{ workload.day }}}}", days: "{{{{ workload.days | default([]) }}}}"}}
          code: |
            def main(day, days):
                days = days or [day]
                return [{{"day": d, "i": i{column}}} for d in days for i in range(int(d[-2:]) - 18)]
      - save:
          kind: parquet
          uri: {series}
          data: "{{{{ make }}}}"
    outputs:
      - uri: {series}
        checks:
          - schema: {{stable: true}}
          - name: rows_of_the_day
            assert: "{{{{ output.rows == (partition_key[-2:] | int) - 18 }}}}"
"""


def _daily(tmp_path, extra="", column=""):
    f = tmp_path / "daily_events.yaml"
    f.write_text(DAILY.format(extra=extra, column=column, series=SERIES))
    return f


def _records(data_dir):
    """(version, partition_key, rows) of every registry version of the series."""
    reg = _res(data_dir).registry("demo", "examples")
    newest = int(reg.resolve(SERIES).version[1:])
    out = []
    for i in range(1, newest + 1):
        plan = reg.resolve(f"{SERIES}@v{i}")
        out.append((plan.version, plan.metadata.get("partition_key"), plan.rows))
    return out


def _check_job(defs):
    """The playbook's checks alone (the asset's Checks tab), run for one partition via the run's tag."""
    job = dg.define_asset_job("checks_only", selection=dg.AssetSelection.checks_for_assets(EVENTS))
    return dg.Definitions.merge(defs, dg.Definitions(jobs=[job])).resolve_job_def("checks_only")


def test_a_partitions_checks_see_its_own_version_not_the_newest_of_any_partition(dagster_data, tmp_path):
    defs = _defs([_daily(tmp_path)], dagster_data)
    job = defs.resolve_implicit_global_asset_job_def()
    with dg.instance_for_test() as instance:
        for day in ("2026-11-21", "2026-11-22"):
            assert job.execute_in_process(instance=instance, partition_key=day).success
        # the 11-21 check after 11-22 stored a newer version (a backfill's runs interleave like this)
        r = _check_job(defs).execute_in_process(instance=instance, tags={"dagster/partition": "2026-11-21"})
    evals = {e.check_name: e for e in r.get_asset_check_evaluations()}
    rows = evals["rows_of_the_day"]
    assert rows.passed, rows.description
    assert rows.metadata["noetl/partition_key"].value == "2026-11-21"
    assert rows.metadata["noetl/uri"].value == f"{SERIES}@v1"
    assert _records(dagster_data) == [("v1", "2026-11-21", 3), ("v2", "2026-11-22", 4)]


def test_schema_drift_compares_with_the_same_partitions_previous_version(dagster_data, tmp_path):
    f = _daily(tmp_path)
    with dg.instance_for_test() as instance:
        job = _defs([f], dagster_data).resolve_implicit_global_asset_job_def()
        assert job.execute_in_process(instance=instance, partition_key="2026-11-21").success
        f.write_text(DAILY.format(extra="", column=', "extra": 1', series=SERIES))  # a new column from now on
        job = _defs([f], dagster_data).resolve_implicit_global_asset_job_def()
        first = job.execute_in_process(instance=instance, partition_key="2026-11-22")
        again = job.execute_in_process(instance=instance, partition_key="2026-11-21")
    drift = {e.check_name: e for e in first.get_asset_check_evaluations()}["schema_drift"]
    assert drift.passed, drift.description  # 11-22's first version: nothing of its own to drift from
    drift = {e.check_name: e for e in again.get_asset_check_evaluations()}["schema_drift"]
    assert not drift.passed and "added since v1: extra" in drift.description  # 11-21's v1, not 11-22's v2


BACKFILL_DEFS = """\
import os
from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.translator import compile_playbooks
defs = compile_playbooks([os.environ["T31_PLAYBOOK"]], include_sensor=False,
                         resource=NoetlResource(data_dir=os.environ["T31_DATA"], tenant="demo", project="examples")).definitions
"""


def _backfill(tmp_path, data_dir, playbook, keys):
    """A partition backfill as ``dagster dev`` runs it: the backfill daemon's iteration launches the
    runs (in-process launcher) from a code location served by a gRPC code server."""
    mod = tmp_path / "t31_defs.py"
    mod.write_text(BACKFILL_DEFS)
    os.environ["T31_PLAYBOOK"], os.environ["T31_DATA"] = str(playbook), str(data_dir)
    overrides = {
        "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"},
        "run_launcher": {
            "module": "dagster._core.launcher.sync_in_memory_run_launcher",
            "class": "SyncInMemoryRunLauncher",
        },
    }
    try:
        with dg.instance_for_test(overrides=overrides) as instance:
            target = PythonFileTarget(
                str(mod), attribute=None, working_directory=str(tmp_path), location_name="t31"
            )
            with create_test_daemon_workspace_context(target, instance) as wctx:
                bf = PartitionBackfill.from_asset_partitions(
                    backfill_id="t31", asset_graph=wctx.create_request_context().asset_graph, partition_names=keys,
                    asset_selection=[EVENTS], backfill_timestamp=time.time(), tags={}, dynamic_partitions_store=instance,
                    all_partitions=False, title=None, description=None, run_config=None,
                )  # fmt: skip
                instance.add_backfill(bf)
                for _ in range(20):
                    list(execute_backfill_iteration(wctx, logging.getLogger("t31")))
                    if instance.get_backfill("t31").status != BulkActionStatus.REQUESTED:
                        break
                assert instance.get_backfill("t31").status == BulkActionStatus.COMPLETED_SUCCESS
                runs = instance.get_runs()
                evals = {}
                for run in runs:
                    for rec in instance.all_logs(
                        run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
                    ):
                        ev = rec.dagster_event.event_specific_data
                        evals[(run.tags.get("dagster/partition") or run.tags.get("dagster/asset_partition_range_start"),
                               ev.check_name)] = ev  # fmt: skip
                return runs, evals, instance.get_materialized_partitions(EVENTS)
    finally:
        os.environ.pop("T31_PLAYBOOK", None)
        os.environ.pop("T31_DATA", None)


@pytest.mark.slow
def test_a_two_partition_backfill_through_the_daemon_leaves_one_record_per_key(dagster_data, tmp_path):
    runs, evals, done = _backfill(tmp_path, dagster_data, _daily(tmp_path), ["2026-11-21", "2026-11-22"])
    assert done == {"2026-11-21", "2026-11-22"}
    # issue 42: no declared backfill policy is one run, which runs the playbook once per key
    assert len(runs) == 1 and runs[0].status == dg.DagsterRunStatus.SUCCESS
    records = sorted(_records(dagster_data), key=lambda r: r[1])
    assert [(pk, rows) for _, pk, rows in records] == [("2026-11-21", 3), ("2026-11-22", 4)]
    ev = evals[("2026-11-21", "rows_of_the_day")]  # the run's checks evaluated each key's own record
    assert ev.passed and ev.description == "2 partitions pass"
    assert ev.metadata["noetl/partition_uris"].value == {pk: f"{SERIES}@{v}" for v, pk, _ in records}


@pytest.mark.slow
def test_single_run_backfill_policy_hands_the_playbook_its_range(dagster_data, tmp_path):
    f = _daily(tmp_path, extra=", backfill: single_run, range_key: days")
    ad = _defs([f], dagster_data).resolve_assets_def(EVENTS)
    assert ad.backfill_policy == dg.BackfillPolicy.single_run()
    runs, evals, done = _backfill(tmp_path, dagster_data, f, ["2026-11-21", "2026-11-22", "2026-11-23"])
    assert done == {
        "2026-11-21",
        "2026-11-22",
        "2026-11-23",
    }  # the one run materialized every key of its range
    assert len(runs) == 1 and runs[0].status == dg.DagsterRunStatus.SUCCESS
    # one version covers the range, recorded under its label; each key's rows are in it
    assert _records(dagster_data) == [("v1", "2026-11-21...2026-11-23", 3 + 4 + 5)]
    drift = evals[("2026-11-21", "schema_drift")]
    assert drift.passed and drift.description == "3 partitions pass"
    from noetl_dagster.translator.versions import partition_version  # noqa: PLC0415

    parts = ad.partitions_def
    assert partition_version(_res(dagster_data), SERIES, "2026-11-22", parts).uri == f"{SERIES}@v1"
    assert partition_version(_res(dagster_data), SERIES, "2026-11-24", parts) is None


BRANCHES = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: branches, path: tests/branches}
workflow:
  - step: start
    tool:
      - seed: {kind: python, code: "result = [{'x': 1}, {'x': 2}]"}
    next:
      spec: {mode: inclusive}
      arcs: [{step: left}, {step: right}]
  - step: left
    tool:
      - save: {kind: parquet, uri: noetl://demo/examples/t/dataset/left, data: "{{ start }}"}
    outputs: [noetl://demo/examples/t/dataset/left]
    next:
      arcs: [{step: both}]
  - step: right
    tool:
      - save: {kind: parquet, uri: noetl://demo/examples/t/dataset/right, data: "{{ start }}"}
    outputs: [noetl://demo/examples/t/dataset/right]
    next:
      arcs: [{step: both}]
  - step: both
    tool:
      - total: {kind: python, code: "result = 1"}
"""
LEFT = dg.AssetKey(["t", "left"])
RIGHT = dg.AssetKey(["t", "right"])


def test_materializing_one_table_runs_only_the_steps_it_needs(dagster_data, tmp_path):
    f = tmp_path / "branches.yaml"
    f.write_text(BRANCHES)
    defs = _defs([f], dagster_data)
    ad = defs.resolve_assets_def(LEFT)
    assert ad.can_subset and set(ad.keys) == {LEFT, RIGHT}
    with dg.instance_for_test() as instance:
        r = dg.materialize([ad], instance=instance, selection=[LEFT])
        assert r.success
        mats = {e.materialization.asset_key: e.materialization for e in tables_of(r)}
        eid = instance.get_run_by_id(r.run_id).tags["noetl/execution_id"]
    assert set(mats) == {LEFT}
    assert mats[LEFT].metadata["noetl/skipped_steps"].value == "right, both"
    events = _res(dagster_data).services().event_store.read(eid)
    ran = {e.step for e in events if e.name == "step.done"}
    skipped = {e.step: e.data["reason"] for e in events if e.name == "step.skipped"}
    assert ran == {"start", "left"} and skipped == {"right": "not selected", "both": "not selected"}
    req = next(e for e in events if e.name == "playbook.execution.requested")
    assert req.data["requested_by"] == f"dagster-asset:{r.run_id}" and req.data["select"] == ["left", "start"]
    reg = _res(dagster_data).registry("demo", "examples")
    with pytest.raises(Exception, match="right"):  # never stored
        reg.resolve("noetl://demo/examples/t/dataset/right")


def test_component_op_tags_and_pool_reach_the_materialize_op(dagster_data, tmp_path):
    f = tmp_path / "branches.yaml"
    f.write_text(BRANCHES)
    for translation, want in (
        (NoetlTranslation(op_tags={"dagster/concurrency_key": "noetl", "team": "data"}), ("noetl", None)),
        (NoetlTranslation(op_tags={"team": "data"}, pool="warehouse"), (None, "warehouse")),
    ):
        defs = _defs([f], dagster_data, translator=_ConfiguredTranslator(translation))
        step_op = defs.resolve_job_def("branches").graph.node_named("left").definition
        for op in (defs.resolve_assets_def(LEFT).op, step_op):  # the Materialize op like the job's ops
            assert (op.tags.get("dagster/concurrency_key"), op.pool) == want and op.tags["team"] == "data"
        assert defs.resolve_assets_def(LEFT).op.name == "branches__tables"


FAILING = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: broken_math, path: tests/broken_math}
workflow:
  - step: start
    tool:
      - numbers: {kind: python, code: "result = {'a': 1, 'b': 0}"}
    next:
      arcs: [{step: transform}]
  - step: transform
    tool:
      - divide:
          kind: python
          input: {a: "{{ start.a }}", b: "{{ start.b }}"}
          code: |
            def ratio(a, b):
                return a / b

            def main(a, b):
                return [{"r": ratio(a, b)}]
      - save: {kind: parquet, uri: noetl://demo/examples/t/dataset/ratios, data: "{{ divide }}"}
    outputs: [noetl://demo/examples/t/dataset/ratios]
"""


def test_a_failed_materialize_names_the_task_the_playbook_line_and_the_users_traceback(
    dagster_data, tmp_path
):
    f = tmp_path / "broken_math.yaml"
    f.write_text(FAILING)
    defs = _defs([f], dagster_data)
    ad = defs.resolve_assets_def(dg.AssetKey(["t", "ratios"]))
    with dg.instance_for_test() as instance:
        r = dg.materialize([ad], instance=instance, raise_on_error=False)
        assert not r.success
        failure = r.get_step_failure_events()[0].step_failure_data
        logs = "\n".join(rec.user_message for rec in instance.all_logs(r.run_id) if rec.user_message)
    text = failure.user_failure_data.description
    lines = FAILING.splitlines()
    at = lines.index("                return a / b") + 1  # the playbook line of the failing code line
    head = text.splitlines()[0]
    assert (
        head
        == f"step 'transform' failed in task divide (python) at {f.name}:{at}: ZeroDivisionError: division by zero"
    )
    assert f"line {at}, in ratio" in text and "return a / b" in text and "in main" in text
    assert "noetl_dagster" not in text and "dagster/_core" not in text  # the user's frames only
    md = failure.user_failure_data.metadata
    assert md["noetl/failed_task"].value == "divide" and md["noetl/failed_kind"].value == "python"
    # the Materialize run logs the NoETL events a job run logs
    assert "task.done transform.divide error" in logs and "step.done start" in logs


def test_a_failed_job_op_tells_the_same_story(dagster_data, tmp_path):
    f = tmp_path / "broken_math.yaml"
    f.write_text(FAILING)
    job = _defs([f], dagster_data).resolve_job_def("broken_math")
    with dg.instance_for_test() as instance:
        r = job.execute_in_process(instance=instance, raise_on_error=False)
    assert not r.success
    text = r.get_step_failure_events()[0].step_failure_data.user_failure_data.description
    at = FAILING.splitlines().index("                return a / b") + 1
    assert text.startswith(
        f"step 'transform' failed in task divide (python) at {f.name}:{at}: ZeroDivisionError"
    )
    assert "Traceback (your code):" in text and "return a / b" in text and "noetl_dagster" not in text


def test_the_scaffolded_sample_is_an_asset_whose_first_materialize_works(dagster_data, tmp_path):
    from importlib import resources  # noqa: PLC0415

    from noetl_dagster.translator.component import SAMPLE_PLAYBOOK, SAMPLE_PROJECT, SAMPLE_TENANT  # noqa: PLC0415

    f = tmp_path / SAMPLE_PLAYBOOK
    f.write_text(resources.files("noetl_dagster.translator").joinpath(SAMPLE_PLAYBOOK).read_text("utf-8"))
    res = NoetlResource(
        data_dir=str(dagster_data), tenant=SAMPLE_TENANT, project=SAMPLE_PROJECT
    )  # as scaffolded
    loc = compile_playbooks([f], include_sensor=False, resource=res)
    assert loc.index.warnings == []
    key = dg.AssetKey(["scaffold", "greetings"])
    with dg.instance_for_test() as instance:
        r = dg.materialize([loc.definitions.resolve_assets_def(key)], instance=instance)
    assert r.success
    assert r.get_asset_materialization_events()[0].materialization.metadata["dagster/row_count"].value == 1


def test_a_table_outside_the_locations_scope_is_reported_at_load(dagster_data, tmp_path, caplog):
    f = tmp_path / "branches.yaml"
    f.write_text(BRANCHES)
    res = NoetlResource(data_dir=str(dagster_data))  # default/default, as a bare defs.yaml has it
    with caplog.at_level(logging.WARNING, logger="noetl_dagster.translator"):
        loc = compile_playbooks([f], include_sensor=False, resource=res)
    line = BRANCHES.splitlines().index("    outputs: [noetl://demo/examples/t/dataset/left]") + 1
    want = (f"{f}:{line}: registry-scope: default/default may not write noetl://demo/examples/t/dataset/left "
            "(it belongs to demo/examples); set tenant: demo and project: examples in defs.yaml")  # fmt: skip
    assert len(loc.index.warnings) == 2 and loc.index.warnings[0].startswith(want)
    assert [r.getMessage() for r in caplog.records].count("noetl: " + loc.index.warnings[0]) == 1
    spec = loc.definitions.resolve_assets_def(LEFT).specs_by_key[LEFT]
    assert spec.description.startswith("WARNING: " + want)
    with dg.instance_for_test() as instance:  # what the warning predicts
        r = dg.materialize(
            [loc.definitions.resolve_assets_def(LEFT)], instance=instance, raise_on_error=False
        )
    assert not r.success
    text = r.get_step_failure_events()[0].step_failure_data.user_failure_data.description
    assert "no live grant" in text and "in task save (parquet)" in text


def test_validation_fails_on_broken_playbooks_and_each_load_warning_is_logged_once(dagster_data, tmp_path, caplog,
                                                                                     monkeypatch):  # fmt: skip
    from noetl_dagster.dsl import PlaybookInvalid  # noqa: PLC0415

    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: b, path: t/b}\nworkflow:\n"
                   "  - step: start\n    tool: [{a: {kind: teleport}}]\n")  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="noetl_dagster.translator"):
        for _ in range(2):  # Dagster may build a code location twice in one process
            loc = compile_playbooks(
                [tmp_path], include_sensor=False, resource=_res(dagster_data), on_error="report"
            )
            assert [b.file for b in loc.index.invalid] == [str(bad)]
    assert sum("invalid playbook" in r.getMessage() for r in caplog.records) == 1
    monkeypatch.setenv("DAGSTER_IS_DEFS_VALIDATION_CLI", "1")  # what dg check defs sets
    with pytest.raises(PlaybookInvalid, match="bad.yaml:6: unknown-tool-kind"):
        compile_playbooks([tmp_path], include_sensor=False, resource=_res(dagster_data), on_error="report")


@pytest.mark.filterwarnings("ignore:Parameter `include_sources` of function `AssetSelection.all`")
def test_invalid_playbook_checks_are_requested_by_a_running_automation_sensor(dagster_data, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: b, path: t/b}\nworkflow:\n"
                   "  - step: start\n    tool: [{a: {kind: teleport}}]\n")  # fmt: skip
    (tmp_path / "ok.yaml").write_text(BRANCHES)
    defs = _defs([tmp_path], dagster_data, on_error="report")
    sensor = defs.resolve_sensor_def("noetl_invalid_playbooks")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    key = dg.AssetCheckKey(dg.AssetKey(["noetl_invalid_playbook", "bad"]), "playbook_is_valid")
    with dg.instance_for_test() as instance:
        tick = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        assert {r.key for r in tick.results if r.true_subset.size} == {key}  # requested without a click
        job = dg.Definitions.merge(
            defs, dg.Definitions(jobs=[dg.define_asset_job("c", dg.AssetSelection.checks(key))])
        )
        run = job.resolve_job_def("c").execute_in_process(instance=instance)
        ev = run.get_asset_check_evaluations()[0]
        assert not ev.passed and "bad.yaml:6: unknown-tool-kind" in ev.description
        again = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=tick.cursor)
        assert not any(r.true_subset.size for r in again.results)  # evaluated once, not on every tick


READER = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: daily_counts, path: tests/daily_counts}
executor:
  spec:
    dagster:
      partitions: {daily: 2026-11-20, workload_key: day}
workload: {day: "2026-01-01"}
workflow:
  - step: start
    tool:
      - events: {kind: parquet, op: read, uri: noetl://demo/examples/t/dataset/daily_events}
      - save:
          kind: parquet
          uri: noetl://demo/examples/t/dataset/daily_counts
          data: [{day: "{{ workload.day }}", rows: "{{ events.row_count }}", seen: "{{ events.rows[0].day }}"}]
    outputs: [noetl://demo/examples/t/dataset/daily_counts]
"""


def test_a_partitioned_read_sees_its_partitions_version(dagster_data, tmp_path):
    reader = tmp_path / "daily_counts.yaml"
    reader.write_text(READER)
    defs = _defs([_daily(tmp_path), reader], dagster_data)
    job = defs.resolve_implicit_global_asset_job_def()
    counts = dg.AssetKey(["t", "daily_counts"])
    with dg.instance_for_test() as instance:
        for day in ("2026-11-21", "2026-11-22"):  # the writer's two partitions: v1 (3 rows), v2 (4 rows)
            assert (
                job.get_subset(asset_selection={EVENTS})
                .execute_in_process(instance=instance, partition_key=day)
                .success
            )
        r = job.get_subset(asset_selection={counts}).execute_in_process(
            instance=instance, partition_key="2026-11-21"
        )
        assert r.success
    from noetl_dagster.storage.tables import TableStorage  # noqa: PLC0415

    reg = _res(dagster_data).registry("demo", "examples")
    plan = reg.resolve("noetl://demo/examples/t/dataset/daily_counts")
    table, _ = TableStorage(reg, data_dir=dagster_data).fetch(plan.uri, as_type="arrow")
    assert table.to_pylist() == [{"day": "2026-11-21", "rows": 3, "seen": "2026-11-21"}]  # not 11-22's v2
