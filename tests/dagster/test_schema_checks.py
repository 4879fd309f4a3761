"""Dagster's run storage asks the database's catalog whether its newer columns exist on every run
record read and every run status event (``SqlRunStorage.has_run_stats_index_cols`` and siblings; a
SQLAlchemy reflection over a connection of its own each time): three times in the daemon's launch
of a run, twice more in the run worker before RUN_START (issue 35). ``cache_schema_checks`` keeps a
positive answer per instance: the coordinator applies it to the daemon's instance, the zygote to the
instance its run workers inherit. A negative answer is asked again, so a migration made while the
process runs is still seen."""

from __future__ import annotations

import dagster as dg
from dagster._core.storage.runs.sql_run_storage import SqlRunStorage
from dagster._core.test_utils import create_run_for_test

from noetl_dagster.sensors.zygote import cache_schema_checks


def counting_checks(monkeypatch, answer=None):  # type: ignore[no-untyped-def]
    asked: list[str] = []
    original = SqlRunStorage.has_run_stats_index_cols

    def has_run_stats_index_cols(self):  # type: ignore[no-untyped-def]
        asked.append("run_stats")
        return original(self) if answer is None else answer

    monkeypatch.setattr(SqlRunStorage, "has_run_stats_index_cols", has_run_stats_index_cols)
    return asked


def _reads(instance) -> None:  # type: ignore[no-untyped-def]
    run = create_run_for_test(instance, job_name="j")
    for _ in range(3):
        assert instance.get_run_by_id(run.run_id) is not None
    instance.report_run_canceled(run)  # a run status event


def test_a_positive_schema_check_is_asked_once_per_instance(tmp_path, monkeypatch):
    asked = counting_checks(monkeypatch)
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        _reads(instance)
        uncached = len(asked)
        assert uncached >= 4  # Dagster as it is: every read and status event asks
        cache_schema_checks(instance)
        cache_schema_checks(instance)  # idempotent
        asked.clear()
        _reads(instance)
        assert asked == ["run_stats"]  # once, then remembered


def test_a_negative_schema_check_is_asked_again(tmp_path, monkeypatch):
    asked = counting_checks(monkeypatch, answer=False)
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        cache_schema_checks(instance)
        asked.clear()
        _reads(instance)
        assert len(asked) >= 4  # a migration made meanwhile would be seen at the next ask


def test_the_zygote_instance_its_run_workers_inherit_has_them_cached(tmp_path, monkeypatch):
    from noetl_dagster.sensors import zygote

    monkeypatch.setattr(dg.DagsterInstance, "from_ref", dg.DagsterInstance.from_ref)  # undone after the test
    asked = counting_checks(monkeypatch)
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        ref = instance.get_ref()
        zygote._open_instance_once(ref)  # what the zygote does before its first fork
        assert asked  # asked there (opening the instance may ask too)
        asked.clear()
        inherited = dg.DagsterInstance.from_ref(ref)  # what a forked run worker opens
        _reads(inherited)
        assert asked == []  # answered in the zygote: no fork asks again
        inherited.dispose()
