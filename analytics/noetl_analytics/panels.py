"""The dashboard panels: one SQL query each, shared by the HTML/PNG dashboard,
the Grafana dashboard JSON and docs/analytics.md.

SQL placeholders: ``$db`` is the facts database; ``$__timeFilter(col)`` is the
Grafana ClickHouse macro for the dashboard time range (the local renderer
replaces it with a filter on ``--days``, or with ``1 = 1``); ``$scope(tenant_col,
project_col)`` is the viewer's tenant filter of ``noetl_analytics.dashboard_access`` (every
table a panel reads names it, so no panel shows another tenant's rows).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Panel:
    key: str
    title: str
    description: str
    sql: str
    chart: str  # timeseries | barh | stat
    x: str = ""  # category / time column
    y: tuple[str, ...] = ()  # value columns
    series: str = ""  # long-format series column (timeseries)
    unit: str = ""
    percent: bool = False

    def render_sql(self, database: str, *, days: int | None = None) -> str:
        """The SQL for a direct run: ``$db`` bound, the time macro a plain filter."""

        def time_filter(m: re.Match[str]) -> str:
            if days is None:
                return "1 = 1"
            return f"{m.group(1)} >= now() - INTERVAL {int(days)} DAY"

        return _TIME_FILTER.sub(time_filter, self.sql).replace("$db", database)

    def grafana_sql(self, database: str) -> str:
        return self.sql.replace("$db", database)


_TIME_FILTER = re.compile(r"\$__timeFilter\(([^)]+)\)")

PANELS: tuple[Panel, ...] = (
    Panel(
        key="summary",
        title="Totals",
        description="Executions, step runs, task attempts, failures, bytes stored by reference, cost and the idle capacity part of it.",
        sql="""SELECT
    (SELECT count() FROM $db.execution_fact FINAL WHERE transition = 'requested' AND $__timeFilter(ts) AND $scope(tenant_id, project_id)) AS executions,
    (SELECT count() FROM $db.execution_fact FINAL WHERE transition = 'finished' AND status = 'failed' AND $__timeFilter(ts) AND $scope(tenant_id, project_id)) AS failed_executions,
    (SELECT count() FROM $db.step_fact FINAL WHERE outcome != 'skipped' AND $__timeFilter(ts) AND $scope(tenant_id, project_id)) AS step_runs,
    (SELECT count() FROM $db.task_fact FINAL WHERE $__timeFilter(ts) AND $scope(tenant_id, project_id)) AS task_attempts,
    (SELECT countIf(status = 'error') FROM $db.task_fact FINAL WHERE $__timeFilter(ts) AND $scope(tenant_id, project_id)) AS failed_attempts,
    (SELECT sum(size_bytes) FROM (SELECT uri, any(size_bytes) AS size_bytes FROM $db.resource_fact FINAL
        WHERE action = 'created' AND $__timeFilter(ts) AND $scope(tenant_id, project_id) GROUP BY uri)) AS bytes_stored,
    (SELECT round(sum(amount), 12) FROM $db.tenant_cost_fact WHERE $__timeFilter(day) AND $scope(tenant_id, project_id)) AS cost,
    (SELECT round(sum(amount), 12) FROM $db.tenant_cost_fact WHERE category = 'idle' AND $__timeFilter(day) AND $scope(tenant_id, project_id)) AS cost_of_which_idle""",
        chart="stat",
        y=(
            "executions",
            "failed_executions",
            "step_runs",
            "task_attempts",
            "failed_attempts",
            "bytes_stored",
            "cost",
            "cost_of_which_idle",  # idle capacity labelled apart: it can be most of the cost
        ),
    ),
    Panel(
        key="cost_per_tenant",
        title="Cost per tenant over time",
        description="Daily showback per tenant from the priced table (cost_line_day via cost_by_project_day: every cost line).",
        sql="""SELECT toDateTime(day) AS time, tenant_id AS tenant, sum(amount) AS amount
FROM $db.cost_by_project_day
WHERE $__timeFilter(day) AND $scope(tenant_id, project_id)
GROUP BY time, tenant
ORDER BY time, tenant""",
        chart="timeseries",
        x="time",
        y=("amount",),
        series="tenant",
        unit="currency",
    ),
    Panel(
        key="top_playbooks_by_cost",
        title="Top playbooks by cost",
        description="The ten most expensive playbooks in the period (of every tenant the dashboard shows).",
        sql="""SELECT concat(tenant_id, ' / ', playbook) AS playbook, sum(amount) AS amount
FROM $db.cost_by_playbook_day
WHERE $__timeFilter(day) AND $scope(tenant_id, project_id)
GROUP BY playbook
ORDER BY amount DESC
LIMIT 10""",
        chart="barh",
        x="playbook",
        y=("amount",),
        unit="currency",
    ),
    Panel(
        key="step_duration_percentiles",
        title="Step duration percentiles",
        description="p50 / p90 / p99 of step run durations (ms), slowest p90 first.",
        sql="""SELECT concat(_dim.playbook, ' / ', _step.step) AS step, count() AS runs,
    quantile(0.5)(_step.duration_ms) AS p50, quantile(0.9)(_step.duration_ms) AS p90, quantile(0.99)(_step.duration_ms) AS p99
FROM $db.step_fact AS _step FINAL
LEFT JOIN $db.execution_dim AS _dim ON _dim.execution_id = _step.execution_id
WHERE _step.outcome != 'skipped' AND $__timeFilter(_step.ts) AND $scope(_step.tenant_id, _step.project_id)
GROUP BY step
ORDER BY p90 DESC
LIMIT 15""",
        chart="barh",
        x="step",
        y=("p50", "p90", "p99"),
        unit="ms",
    ),
    Panel(
        key="failure_rates",
        title="Failure rates",
        description="Share of failed executions and of failed task attempts (retries included), per playbook.",
        sql="""SELECT _dim.playbook AS playbook, count() AS executions,
    countIf(_dim.status = 'failed') / count() AS execution_failure_rate,
    sum(_tasks.attempts) AS task_attempts,
    sum(_tasks.failed_attempts) / greatest(sum(_tasks.attempts), 1) AS task_failure_rate
FROM $db.execution_dim AS _dim
LEFT JOIN
(
    SELECT execution_id, count() AS attempts, countIf(status = 'error') AS failed_attempts
    FROM $db.task_fact FINAL
    WHERE $scope(tenant_id, project_id)
    GROUP BY execution_id
) AS _tasks ON _tasks.execution_id = _dim.execution_id
WHERE $__timeFilter(_dim.started_at) AND $scope(_dim.tenant_id, _dim.project_id)
GROUP BY playbook
ORDER BY execution_failure_rate DESC, task_failure_rate DESC, executions DESC
LIMIT 15""",
        chart="barh",
        x="playbook",
        y=("execution_failure_rate", "task_failure_rate"),
        percent=True,
    ),
    Panel(
        key="loop_throughput",
        title="Loop throughput",
        description="Loop iterations per second of loop wall time, per playbook loop step.",
        sql="""SELECT concat(playbook, ' / ', step) AS loop, count() AS loops, sum(n) AS iterations,
    sum(n) / greatest(sum(seconds), 0.001) AS iterations_per_second
FROM
(
    SELECT _frame.loop_id AS loop_id, any(_frame.step) AS step, any(_dim.playbook) AS playbook,
        countIf(_frame.transition IN ('iteration_done', 'iteration_failed')) AS n,
        if(maxIf(_frame.duration_ms, _frame.transition = 'done') > 0, maxIf(_frame.duration_ms, _frame.transition = 'done') / 1000,
           dateDiff('microsecond', min(_frame.ts), max(_frame.ts)) / 1e6) AS seconds
    FROM $db.frame_fact AS _frame FINAL
    LEFT JOIN $db.execution_dim AS _dim ON _dim.execution_id = _frame.execution_id
    WHERE $__timeFilter(_frame.ts) AND $scope(_frame.tenant_id, _frame.project_id)
    GROUP BY loop_id
)
GROUP BY loop
ORDER BY iterations_per_second DESC
LIMIT 15""",
        chart="barh",
        x="loop",
        y=("iterations_per_second",),
        unit="iterations/s",
    ),
)


def panel(key: str) -> Panel:
    for p in PANELS:
        if p.key == key:
            return p
    raise KeyError(key)
