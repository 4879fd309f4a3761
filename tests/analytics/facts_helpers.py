"""Helpers shared by the facts tests."""

from __future__ import annotations

TOTALS_SQL = """SELECT
    (SELECT count() FROM $db.execution_fact WHERE transition = 'requested') AS executions,
    (SELECT countIf(status = 'failed') FROM $db.execution_fact WHERE transition = 'finished') AS failed_executions,
    (SELECT count() FROM $db.step_fact WHERE outcome != 'skipped') AS step_runs,
    (SELECT countIf(outcome = 'failed') FROM $db.step_fact) AS failed_steps,
    (SELECT count() FROM $db.task_fact) AS task_attempts,
    (SELECT countIf(status = 'error') FROM $db.task_fact) AS failed_attempts,
    (SELECT count() FROM $db.frame_fact WHERE transition IN ('iteration_done', 'iteration_failed')) AS iterations,
    (SELECT sum(size_bytes) FROM (SELECT uri, any(size_bytes) AS size_bytes FROM $db.resource_fact
        WHERE action = 'created' GROUP BY uri)) AS bytes"""


def fact_totals(store) -> dict[str, int]:
    cols, rows = store.query(TOTALS_SQL)
    return dict(zip(cols, [int(v or 0) for v in rows[0]], strict=True))
