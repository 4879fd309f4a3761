-- Quantum as its own price line (issue 20.4): shots and QPU seconds each attempt counted
-- (usage.shots / usage.qpu_s from the quantum tool) are summed by the allocation rollup and
-- priced per shot and per QPU-second by the versioned price table, as category `quantum`.

ALTER TABLE $db.task_fact ADD COLUMN IF NOT EXISTS qpu_seconds Float64 AFTER shots;

-- AFTER shots: rebuild_allocation inserts its SELECT positionally
ALTER TABLE $db.allocation_step_day
    ADD COLUMN IF NOT EXISTS qpu_seconds SimpleAggregateFunction(sum, Float64) AFTER shots;
-- the rebuild's staging table is a copy of the old shape: recreated on the next rebuild
DROP TABLE IF EXISTS $db.allocation_step_day_next;

DROP VIEW IF EXISTS $db.allocation_step_day_mv;
CREATE MATERIALIZED VIEW IF NOT EXISTS $db.allocation_step_day_mv TO $db.allocation_step_day AS
SELECT tenant_id, project_id, playbook, step, toDate(ts) AS day,
       toUInt64(count()) AS attempts,
       toUInt64(countIf(status = 'error')) AS failed_attempts,
       toUInt64(countIf(attempt > 1)) AS retries,
       sum(coalesce(cpu_ms, duration_ms * units)) / 3.6e6 AS cpu_core_hours,
       sum(mem_bytes * duration_ms) / 3.6e6 AS ram_byte_hours,
       sum(duration_ms) / 3.6e6 AS wall_hours,
       sum(egress_bytes) AS egress_bytes, sum(net_in_bytes) AS net_in_bytes, sum(net_out_bytes) AS net_out_bytes,
       sum(bytes_read) AS bytes_read, sum(bytes_written) AS bytes_written,
       sum(rows_moved) AS rows_moved, sum(shots) AS shots, sum(qpu_seconds) AS qpu_seconds,
       uniqState(execution_id) AS executions,
       quantilesTDigestState(0.5, 0.9, 0.99)(duration_ms) AS duration_q
FROM $db.task_fact
GROUP BY tenant_id, project_id, playbook, step, day;

-- per-shot and per-QPU-second prices, versioned with the others (0 where a version names none)
ALTER TABLE $db.price_version
    ADD COLUMN IF NOT EXISTS shot       Float64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS qpu_second Float64 DEFAULT 0;

-- allocation_summary_day reads cost from this view: quantum is allocated, not idle capacity
CREATE OR REPLACE VIEW $db.allocation_cost_day AS
SELECT if(tenant_id = '', '__unallocated__', tenant_id) AS tenant, project_id AS project,
       if(playbook = '', '(unknown)', playbook) AS playbook, step, _a.day AS day,
       attempts, failed_attempts, retries, executions, cpu_core_hours, ram_byte_hours, wall_hours,
       egress_bytes, net_in_bytes, net_out_bytes, bytes_read, bytes_written, rows_moved, shots, qpu_seconds,
       cpu_core_hours * _p.cpu_core_hour AS cpu_cost,
       ram_byte_hours / 1e9 * _p.ram_gb_hour AS ram_cost,
       egress_bytes / 1e9 * _p.egress_gb AS egress_cost,
       shots * _p.shot AS shot_cost,
       qpu_seconds * _p.qpu_second AS qpu_cost,
       shot_cost + qpu_cost AS quantum_cost,
       cpu_cost + ram_cost + egress_cost + quantum_cost AS cost,
       _p.version AS price_version, _p.currency AS currency
FROM
(
    SELECT tenant_id, project_id, playbook, step, day, 1 AS k,
           sum(attempts) AS attempts, sum(failed_attempts) AS failed_attempts, sum(retries) AS retries,
           uniqMerge(executions) AS executions, sum(cpu_core_hours) AS cpu_core_hours,
           sum(ram_byte_hours) AS ram_byte_hours, sum(wall_hours) AS wall_hours,
           sum(egress_bytes) AS egress_bytes, sum(net_in_bytes) AS net_in_bytes, sum(net_out_bytes) AS net_out_bytes,
           sum(bytes_read) AS bytes_read, sum(bytes_written) AS bytes_written,
           sum(rows_moved) AS rows_moved, sum(shots) AS shots, sum(qpu_seconds) AS qpu_seconds
    FROM $db.allocation_step_day
    GROUP BY tenant_id, project_id, playbook, step, day
) AS _a
ASOF LEFT JOIN $db.price_version AS _p ON _a.k = _p.k AND _a.day >= _p.valid_from;

-- One row per priced line of each allocation row (compute, ram, egress, and quantum by shot and
-- by QPU-second): the cost lines a showback report lists; quantity is in the line's unit.
CREATE VIEW IF NOT EXISTS $db.allocation_cost_line_day AS
SELECT tenant, project, playbook, step, day, _line.1 AS category, _line.2 AS unit, _line.3 AS quantity,
       _line.4 AS cost, price_version, currency
FROM $db.allocation_cost_day
ARRAY JOIN [
    ('compute', 'cpu_core_hour', cpu_core_hours, cpu_cost),
    ('ram', 'ram_byte_hour', ram_byte_hours, ram_cost),
    ('egress', 'byte', toFloat64(egress_bytes), egress_cost),
    ('quantum', 'shot', toFloat64(shots), shot_cost),
    ('quantum', 'qpu_second', qpu_seconds, qpu_cost)
] AS _line
