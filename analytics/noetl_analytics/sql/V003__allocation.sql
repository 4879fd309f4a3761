-- OpenCost-style allocation from measured usage (issue 18.2).
-- task_fact gains the measured usage of each attempt (outcome.meta.usage); a materialized
-- view sums it per tenant / project / playbook / step / day into an AggregatingMergeTree
-- rollup as rows arrive; a versioned price table prices the rollup (ASOF by day);
-- storage byte-hours come from stored references; idle and unallocated are rows, not gaps.

ALTER TABLE $db.task_fact
    ADD COLUMN IF NOT EXISTS playbook       LowCardinality(String),
    ADD COLUMN IF NOT EXISTS mem_bytes      UInt64,  -- RSS the attempt added at its peak (usage.mem_delta_bytes)
    ADD COLUMN IF NOT EXISTS mem_peak_bytes UInt64,
    ADD COLUMN IF NOT EXISTS bytes_read     UInt64,
    ADD COLUMN IF NOT EXISTS bytes_written  UInt64,
    ADD COLUMN IF NOT EXISTS net_in_bytes   UInt64,
    ADD COLUMN IF NOT EXISTS net_out_bytes  UInt64,
    ADD COLUMN IF NOT EXISTS rows_moved     UInt64,
    ADD COLUMN IF NOT EXISTS shots          UInt64;

-- raw attempts are kept 13 months; the rollups below keep 5 years
ALTER TABLE $db.task_fact MODIFY TTL toDateTime(ts) + INTERVAL 13 MONTH;

-- One row per (tenant, project, playbook, step, day) after merges. Sums are
-- SimpleAggregateFunction(sum); distinct executions and duration quantiles keep states.
CREATE TABLE IF NOT EXISTS $db.allocation_step_day
(
    tenant_id        LowCardinality(String),
    project_id       LowCardinality(String),
    playbook         LowCardinality(String),
    step             LowCardinality(String),
    day              Date,
    attempts         SimpleAggregateFunction(sum, UInt64),
    failed_attempts  SimpleAggregateFunction(sum, UInt64),
    retries          SimpleAggregateFunction(sum, UInt64),
    cpu_core_hours   SimpleAggregateFunction(sum, Float64),
    ram_byte_hours   SimpleAggregateFunction(sum, Float64),
    wall_hours       SimpleAggregateFunction(sum, Float64),
    egress_bytes     SimpleAggregateFunction(sum, UInt64),
    net_in_bytes     SimpleAggregateFunction(sum, UInt64),
    net_out_bytes    SimpleAggregateFunction(sum, UInt64),
    bytes_read       SimpleAggregateFunction(sum, UInt64),
    bytes_written    SimpleAggregateFunction(sum, UInt64),
    rows_moved       SimpleAggregateFunction(sum, UInt64),
    shots            SimpleAggregateFunction(sum, UInt64),
    executions       AggregateFunction(uniq, String),
    duration_q       AggregateFunction(quantilesTDigest(0.5, 0.9, 0.99), Float64)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (tenant_id, project_id, playbook, step, day)
TTL day + INTERVAL 5 YEAR;

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
       sum(rows_moved) AS rows_moved, sum(shots) AS shots,
       uniqState(execution_id) AS executions,
       quantilesTDigestState(0.5, 0.9, 0.99)(duration_ms) AS duration_q
FROM $db.task_fact
GROUP BY tenant_id, project_id, playbook, step, day;

-- Versioned prices: a new version is a new row with a later valid_from; days are priced by
-- the version valid on that day (ASOF JOIN), so history keeps the price it had.
CREATE TABLE IF NOT EXISTS $db.price_version
(
    k                UInt8 DEFAULT 1,  -- constant key: ASOF JOIN wants one equality
    version          String,
    valid_from       Date,
    currency         LowCardinality(String),
    cpu_core_hour    Float64,
    ram_gb_hour      Float64,
    egress_gb        Float64,
    storage_gb_hour  Float64,
    capacity_cores   Float64,   -- what the cluster provisions: idle = capacity - allocated
    capacity_ram_gb  Float64
)
ENGINE = ReplacingMergeTree
ORDER BY (k, valid_from, version);

-- Storage byte-hours of each stored reference, per day it existed (from its first
-- creation until now: the log records no deletions yet), billed to the first creator.
CREATE VIEW IF NOT EXISTS $db.storage_step_day AS
SELECT tenant_id, project_id, playbook, step, day,
       sum(size_bytes * dateDiff('second', greatest(toDateTime(day), created), least(toDateTime(day) + 86400, now())) / 3600) AS byte_hours
FROM
(
    SELECT _ref.uri AS uri, argMin(_ref.tenant_id, _ref.ts) AS tenant_id, argMin(_ref.project_id, _ref.ts) AS project_id,
           argMin(_ref.execution_id, _ref.ts) AS execution_id, argMin(_ref.step, _ref.ts) AS step,
           toDateTime(min(_ref.ts)) AS created, argMin(_ref.size_bytes, _ref.ts) AS size_bytes,
           arrayJoin(arrayMap(d -> toDate(d), range(toUInt32(toDate(min(_ref.ts))), toUInt32(today()) + 1))) AS day
    FROM $db.resource_fact AS _ref FINAL
    WHERE _ref.action = 'created'
    GROUP BY _ref.uri
) AS _s
LEFT JOIN $db.execution_dim AS _dim ON _dim.execution_id = _s.execution_id
GROUP BY tenant_id, project_id, if(_dim.playbook = '', '(unknown)', _dim.playbook) AS playbook, step, day;

-- Priced allocation per tenant / project / playbook / step / day. An empty tenant is shown as
-- __unallocated__ (usage no tenant can be charged for) instead of being dropped.
CREATE VIEW IF NOT EXISTS $db.allocation_cost_day AS
SELECT if(tenant_id = '', '__unallocated__', tenant_id) AS tenant, project_id AS project,
       if(playbook = '', '(unknown)', playbook) AS playbook, step, _a.day AS day,
       attempts, failed_attempts, retries, executions, cpu_core_hours, ram_byte_hours, wall_hours,
       egress_bytes, net_in_bytes, net_out_bytes, bytes_read, bytes_written, rows_moved, shots,
       cpu_core_hours * _p.cpu_core_hour AS cpu_cost,
       ram_byte_hours / 1e9 * _p.ram_gb_hour AS ram_cost,
       egress_bytes / 1e9 * _p.egress_gb AS egress_cost,
       cpu_cost + ram_cost + egress_cost AS cost,
       _p.version AS price_version, _p.currency AS currency
FROM
(
    SELECT tenant_id, project_id, playbook, step, day, 1 AS k,
           sum(attempts) AS attempts, sum(failed_attempts) AS failed_attempts, sum(retries) AS retries,
           uniqMerge(executions) AS executions, sum(cpu_core_hours) AS cpu_core_hours,
           sum(ram_byte_hours) AS ram_byte_hours, sum(wall_hours) AS wall_hours,
           sum(egress_bytes) AS egress_bytes, sum(net_in_bytes) AS net_in_bytes, sum(net_out_bytes) AS net_out_bytes,
           sum(bytes_read) AS bytes_read, sum(bytes_written) AS bytes_written,
           sum(rows_moved) AS rows_moved, sum(shots) AS shots
    FROM $db.allocation_step_day
    GROUP BY tenant_id, project_id, playbook, step, day
) AS _a
ASOF LEFT JOIN $db.price_version AS _p ON _a.k = _p.k AND _a.day >= _p.valid_from;

CREATE VIEW IF NOT EXISTS $db.storage_cost_day AS
SELECT if(tenant_id = '', '__unallocated__', tenant_id) AS tenant, project_id AS project, playbook, step, _s.day AS day,
       byte_hours, byte_hours / 1e9 * _p.storage_gb_hour AS cost, _p.version AS price_version
FROM (SELECT *, 1 AS k FROM $db.storage_step_day) AS _s
ASOF LEFT JOIN $db.price_version AS _p ON _s.k = _p.k AND _s.day >= _p.valid_from;

-- Per day: what was allocated to tenants, what no tenant carries, and the idle share of the
-- provisioned capacity (capacity_cores x 24 h and capacity_ram_gb x 24 h at that day's prices).
CREATE VIEW IF NOT EXISTS $db.allocation_summary_day AS
SELECT _d.day AS day, allocated, unallocated, storage_cost,
       _p.capacity_cores * 24 * _p.cpu_core_hour + _p.capacity_ram_gb * 24 * _p.ram_gb_hour AS capacity_cost,
       greatest(capacity_cost - compute_allocated, 0) AS idle,
       if(capacity_cost > 0, idle / capacity_cost, 0) AS idle_share,
       _p.version AS price_version
FROM
(
    SELECT day, 1 AS k, sumIf(cost, tenant != '__unallocated__') AS allocated,
           sumIf(cost, tenant = '__unallocated__') AS unallocated,
           sum(cpu_cost + ram_cost) AS compute_allocated
    FROM $db.allocation_cost_day
    GROUP BY day
) AS _d
LEFT JOIN (SELECT day, sum(cost) AS storage_cost FROM $db.storage_cost_day GROUP BY day) AS _st ON _st.day = _d.day
ASOF LEFT JOIN $db.price_version AS _p ON _d.k = _p.k AND _d.day >= _p.valid_from
