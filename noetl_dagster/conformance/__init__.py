"""The conformance run over NoETL's public e2e playbook corpus: stub servers, runner, report."""

from noetl_dagster.conformance.runner import ConformanceReport, FixtureReport, run_conformance

__all__ = ["ConformanceReport", "FixtureReport", "run_conformance"]
