"""Issue 42: the asset catalog as the main path. Asset runs execute in the run's own process (like a
job run), a subset never writes a table it did not select (an upstream step with a recorded
materialization is not run again: its consumers read the version Dagster recorded) and a check
evaluates the version of the materialization it is attached to, never a newer one only the store knows.

The playbook is the issue's: daily partitions, a table whose rows depend on the day, a summary of it."""

from __future__ import annotations

import dagster as dg
import pytest
from dagster_helpers import tables_of

from noetl_dagster.dsl import load_playbook
from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.tables import TableStorage
from noetl_dagster.translator import compile_playbooks
from noetl_dagster.translator.declare import with_partition_metadata, with_pinned_reads
from noetl_dagster.translator.translator import NoetlTranslator

READINGS = "noetl://demo/examples/t/dataset/meter_readings"
SUMMARY = "noetl://demo/examples/t/dataset/daily_summary"
R = NoetlTranslator().get_asset_key(READINGS)
S = NoetlTranslator().get_asset_key(SUMMARY)

METER = f"""\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: meter_daily, path: tests/meter_daily}}
executor:
  spec:
    dagster:
      partitions: {{daily: 2026-11-01, workload_key: day}}
workload: {{day: "2026-11-01"}}
workflow:
  - step: start
    tool:
      - readings:
          kind: python
          input: {{day: "{{{{ workload.day }}}}"}}
          code: |
            def main(day):
                return [{{"day": day, "meter": m, "kwh": m * 1.5}} for m in range(int(day[-2:]))]
      - save:
          kind: parquet
          uri: {READINGS}
          data: "{{{{ readings }}}}"
    outputs:
      - uri: {READINGS}
        checks:
          - name: rows_of_the_day
            assert: "{{{{ output.rows == (partition_key[-2:] | int) }}}}"
    next:
      arcs: [{{step: summarize}}]
  - step: summarize
    tool:
      - readings: {{kind: parquet, op: read, uri: {READINGS}}}
      - save:
          kind: parquet
          uri: {SUMMARY}
          data: [{{day: "{{{{ workload.day }}}}", meters: "{{{{ readings.row_count }}}}", seen: "{{{{ readings.rows[0].day }}}}",
                   upstream: "{{{{ start.uri }}}}"}}]
    outputs:
      - uri: {SUMMARY}
        checks:
          - {{row_count: {{min: 1, max: 1}}}}
"""


def _res(data_dir):
    return NoetlResource(data_dir=str(data_dir), tenant="demo", project="examples")


def _meter(tmp_path):
    f = tmp_path / "meter_daily.yaml"
    f.write_text(METER)
    return f


def _job(tmp_path, data_dir):
    defs = compile_playbooks([_meter(tmp_path)], include_sensor=False, resource=_res(data_dir)).definitions
    return defs, defs.resolve_implicit_global_asset_job_def()


def _versions(data_dir, series):
    """(version, partition_key) of every registry version of the series."""
    reg = _res(data_dir).registry("demo", "examples")
    newest = int(reg.resolve(series).version[1:])
    return [
        (f"v{i}", reg.resolve(f"{series}@v{i}").metadata.get("partition_key")) for i in range(1, newest + 1)
    ]


def _rows(data_dir, uri):
    reg = _res(data_dir).registry("demo", "examples")
    table, _ = TableStorage(reg, data_dir=data_dir).fetch(reg.resolve(uri).uri, as_type="arrow")
    return table.to_pylist()


def _recorded(instance, key, partition=None):
    flt = dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None)
    mats = [r.asset_materialization.metadata for r in instance.fetch_materializations(flt, limit=100).records]
    return [m["noetl/uri"].value for m in mats if "noetl/uri" in m]  # (a range run's result names them all)


def _checks_alone(defs, instance, tags=None):
    """The playbook's checks alone (the asset's Checks tab), as their own run."""
    job = dg.define_asset_job("checks_only", selection=dg.AssetSelection.checks_for_assets(R, S))
    merged = dg.Definitions.merge(defs, dg.Definitions(jobs=[job])).resolve_job_def("checks_only")
    r = merged.execute_in_process(instance=instance, tags=tags or {})
    return {(e.asset_key, e.check_name): e for e in r.get_asset_check_evaluations()}


def _store_outside_dagster(tmp_path, data_dir, day):
    """A version Dagster never recorded: the playbook's upstream step run by the local runner."""
    pb = with_partition_metadata(load_playbook(_meter(tmp_path)))
    result = run_playbook(pb, {"day": day}, services=_res(data_dir).services(), select=["start"])
    assert result.status == "completed"


# -- 1. the fast path ---------------------------------------------------------------------------
def test_asset_runs_use_the_in_process_executor_like_a_job_run(dagster_data, tmp_path, monkeypatch):
    monkeypatch.delenv("NOETL_DAGSTER_EXECUTOR", raising=False)
    defs, job = _job(tmp_path, dagster_data)
    assert job.executor_def is dg.in_process_executor  # Materialize, subsets and backfills from the catalog
    assert defs.resolve_job_def("meter_daily").executor_def is dg.in_process_executor  # the job path
    monkeypatch.setenv("NOETL_DAGSTER_EXECUTOR", "multiprocess")  # a deployment's choice still holds
    _, job = _job(tmp_path, dagster_data)
    assert job.executor_def is dg.multiprocess_executor


def test_a_backfill_of_three_partitions_is_one_run_that_runs_the_playbook_per_key(dagster_data, tmp_path):
    defs, job = _job(tmp_path, dagster_data)
    assert defs.resolve_assets_def(R).backfill_policy == dg.BackfillPolicy.single_run()  # the daemon: one run
    days = ["2026-11-03", "2026-11-04", "2026-11-05"]
    with dg.instance_for_test() as instance:  # the run a single_run backfill launches: the range's tags
        r = job.execute_in_process(instance=instance, tags={"dagster/asset_partition_range_start": days[0],
                                                            "dagster/asset_partition_range_end": days[-1]})  # fmt: skip
        assert r.success
        assert instance.get_materialized_partitions(R) == set(days)
        latest = {d: _recorded(instance, R, d)[0] for d in days}  # each key's own version, newest first
        checks = {e.check_name: e for e in r.get_asset_check_evaluations()}
    assert _versions(dagster_data, READINGS) == [("v1", days[0]), ("v2", days[1]), ("v3", days[2])]
    assert latest == {d: f"{READINGS}@v{i}" for i, d in enumerate(days, 1)}
    rows = checks[
        "rows_of_the_day"
    ]  # each key's rows are that day's: the workload was the key, not the range
    assert rows.passed and rows.metadata["noetl/partition_uris"].value == latest


# -- 2. subsets write only what was selected -----------------------------------------------------
def test_materializing_the_summary_alone_reruns_no_upstream_and_reads_the_recorded_version(
    dagster_data, tmp_path
):
    defs, job = _job(tmp_path, dagster_data)
    with dg.instance_for_test() as instance:
        for day in ("2026-11-07", "2026-11-03"):  # the upstream's 11-07 (v1), then 11-03 (v2) is the newest
            assert (
                job.get_subset(asset_selection={R})
                .execute_in_process(instance=instance, partition_key=day)
                .success
            )
        r = job.get_subset(asset_selection={S}).execute_in_process(
            instance=instance, partition_key="2026-11-07"
        )
        assert r.success
        assert {e.materialization.asset_key for e in tables_of(r)} == {S}
        assert sorted(_recorded(instance, R)) == [f"{READINGS}@v1", f"{READINGS}@v2"]
        evals = _checks_alone(defs, instance, {"dagster/partition": "2026-11-07"})
    # the upstream table has no new version: every version of it is one Dagster recorded
    assert _versions(dagster_data, READINGS) == [("v1", "2026-11-07"), ("v2", "2026-11-03")]
    # the summary read 11-07's recorded version, and the upstream step's result came from its recorded run
    assert _rows(dagster_data, SUMMARY) == [
        {"day": "2026-11-07", "meters": 7, "seen": "2026-11-07", "upstream": f"{READINGS}@v1"}
    ]
    ev = evals[(R, "rows_of_the_day")]
    assert ev.passed and ev.metadata["noetl/uri"].value == f"{READINGS}@v1"


def test_checks_alone_evaluate_the_recorded_version_not_one_only_the_store_knows(dagster_data, tmp_path):
    defs, job = _job(tmp_path, dagster_data)
    with dg.instance_for_test() as instance:
        assert job.execute_in_process(instance=instance, partition_key="2026-11-07").success  # v1 of each
        _store_outside_dagster(tmp_path, dagster_data, "2026-11-07")  # v2 of 11-07: never recorded
        _store_outside_dagster(tmp_path, dagster_data, "2026-11-03")  # v3 of 11-03: the store's newest
        for tags in ({"dagster/partition": "2026-11-07"}, {}):  # one partition's checks, and unpartitioned
            evals = _checks_alone(defs, instance, tags)
            ev = evals[(R, "rows_of_the_day")]
            assert ev.passed, ev.description
            assert ev.metadata["noetl/uri"].value == f"{READINGS}@v1" == _recorded(instance, R)[0]


def test_a_subset_whose_upstream_was_never_materialized_fails_in_one_line_naming_it(dagster_data, tmp_path):
    _, job = _job(tmp_path, dagster_data)
    with dg.instance_for_test() as instance:
        r = job.get_subset(asset_selection={S}).execute_in_process(
            instance=instance, partition_key="2026-11-08", raise_on_error=False
        )
        assert not r.success
        failure = next(e for e in r.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
        text = failure.step_failure_data.error.message
    assert (
        f"upstream {R.to_user_string()} (step start) has no materialization for partition 2026-11-08" in text
    )
    assert "noetl/materialize_upstream: true" in text and "\n" not in text.strip()
    reg = _res(dagster_data).registry("demo", "examples")
    for series in (READINGS, SUMMARY):  # nothing was written
        with pytest.raises(Exception):  # noqa: B017, PT011 - the registry's not-found error
            reg.resolve(series)


def test_asking_for_the_upstream_materializes_and_records_it(dagster_data, tmp_path):
    _, job = _job(tmp_path, dagster_data)
    with dg.instance_for_test() as instance:
        r = job.get_subset(asset_selection={S}).execute_in_process(
            instance=instance, partition_key="2026-11-08", tags={"noetl/materialize_upstream": "true"}
        )
        assert r.success
        assert _recorded(instance, R, "2026-11-08") == [f"{READINGS}@v1"]
        assert instance.get_materialized_partitions(R) == {"2026-11-08"}
        mats = {e.materialization.asset_key: e.materialization for e in tables_of(r)}
    assert set(mats) == {R, S} and mats[R].partition == "2026-11-08"
    assert _versions(dagster_data, READINGS) == [("v1", "2026-11-08")]


def test_pinned_reads_read_the_recorded_version_unless_the_playbook_names_one(tmp_path):
    text = METER.replace(
        f"      - readings: {{kind: parquet, op: read, uri: {READINGS}}}",
        f"      - readings: {{kind: parquet, op: read, uri: {READINGS}}}\n"
        f"      - latest: {{kind: parquet, op: read, uri: '{READINGS}@latest'}}\n"
        f"      - fixed: {{kind: parquet, op: read, uri: '{READINGS}@v9'}}",
    )
    f = tmp_path / "meter_pins.yaml"
    f.write_text(text)
    pb = with_partition_metadata(load_playbook(f))
    pinned = with_pinned_reads(pb, {READINGS: "v1"})
    uris = {t.label: t.config["uri"] for t in pinned.steps["summarize"].tool if t.config.get("op") == "read"}
    assert uris == {"readings": f"{READINGS}@v1", "latest": f"{READINGS}@v1", "fixed": f"{READINGS}@v9"}
    assert (
        "partition_key" not in next(t for t in pinned.steps["summarize"].tool if t.label == "readings").config
    )
    assert pb.steps["summarize"].tool[0].config["uri"] == READINGS  # the compiled playbook is not changed


def test_a_recorded_materialization_from_another_scope_or_table_is_not_reused(dagster_data, tmp_path):
    """Materialization metadata anyone may log: another playbook's or tenant's execution, or another
    table's URI, is never what a subset stands on."""
    _, job = _job(tmp_path, dagster_data)
    f = tmp_path / "other.yaml"  # another playbook of the same scope, with a step of the same name
    f.write_text(
        METER.replace("tests/meter_daily", "tests/other").replace("meter_readings", "other_readings")
    )
    theirs = run_playbook(load_playbook(f), {"day": "2026-11-07"}, services=_res(dagster_data).services(),
                          select=["start"])  # fmt: skip
    assert theirs.status == "completed"
    forged = {  # noetl/uri: this playbook's table; execution: the other playbook's
        READINGS: {"noetl/uri": f"{READINGS}@v1", "noetl/execution_id": theirs.execution_id},
        "table": {"noetl/uri": f"{SUMMARY}@v1", "noetl/execution_id": theirs.execution_id},
    }
    with dg.instance_for_test() as instance:
        for case, md in forged.items():
            instance.report_runless_asset_event(
                dg.AssetMaterialization(R, partition="2026-11-07", metadata=md)
            )
            r = job.get_subset(asset_selection={S}).execute_in_process(
                instance=instance, partition_key="2026-11-07", raise_on_error=False
            )
            assert not r.success
            failure = next(e for e in r.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
            text = failure.step_failure_data.error.message
            want = "in this location's event log" if case == READINGS else f"names {SUMMARY}, not the table"
            assert want in text and "noetl/materialize_upstream: true" in text, text
    reg = _res(dagster_data).registry("demo", "examples")
    for series in (READINGS, SUMMARY):  # nothing was written in this scope
        with pytest.raises(Exception):  # noqa: B017, PT011 - the registry's not-found error
            reg.resolve(series)
