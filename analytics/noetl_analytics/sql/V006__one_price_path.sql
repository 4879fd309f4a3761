-- One price path (issue 30.1) and exactly-once rollups (issue 30.2).
--
-- usage_fact: the priced usage lines of each event (analytics/pricing.py usage_lines: CPU, RAM,
-- GPU, egress, call, quantum, storage, platform), written by the facts writer next to the other
-- facts and keyed like them on event_id. price_line / price_version: the one versioned price table
-- (analytics/prices.yaml). cost_line_day: the priced table every view reads, one row per tenant /
-- project / playbook / step / day / category / item, rebuilt from the deduplicated facts (FINAL)
-- for the days an export batch touched, before the export cursor moves (analytics/rollups.py).
-- No materialized view sums inserts any more: a re-sent event cannot count twice anywhere.

CREATE TABLE IF NOT EXISTS $db.usage_fact
(
    event_id     String,
    ordinal      UInt16,
    ts           DateTime64(6, 'UTC'),
    tenant_id    LowCardinality(String),
    project_id   LowCardinality(String),
    execution_id String,
    step         LowCardinality(String),
    kind         LowCardinality(String),
    category     LowCardinality(String),  -- compute | ram | gpu | egress | storage | call | quantum | platform
    item         LowCardinality(String),  -- worker class | GPU class | region | store | tool kind | shot | qpu_second
    unit         LowCardinality(String),
    quantity     Float64,                 -- max(used, requested)
    used         Float64,
    requested    Float64,
    `key`        String                   -- a stored object's uri: billed once, to its first creator
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (tenant_id, project_id, execution_id, event_id, ordinal);

CREATE TABLE IF NOT EXISTS $db.price_line
(
    version    String,
    valid_from Date,
    category   LowCardinality(String),
    item       String,
    unit       LowCardinality(String),
    price      Float64,
    multiplier Float64,
    currency   LowCardinality(String)
)
ENGINE = MergeTree
ORDER BY (version, category, item);

ALTER TABLE $db.price_version
    ADD COLUMN IF NOT EXISTS capacity_gpus     Float64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS gpu_hour          Float64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS capacity_cost_day Float64 DEFAULT 0;

-- which price file is loaded (a changed file re-prices history on `facts refresh`)
CREATE TABLE IF NOT EXISTS $db.price_meta
(
    k           UInt8 DEFAULT 1,
    fingerprint String,
    source      String,
    currency    LowCardinality(String),
    distribution String,  -- JSON: idle / shared rules and shared_tenants
    loaded_at   DateTime64(6, 'UTC')
)
ENGINE = ReplacingMergeTree(loaded_at)
ORDER BY k;

-- the priced table
CREATE TABLE IF NOT EXISTS $db.cost_line_day
(
    day           Date,
    tenant_id     LowCardinality(String),
    project_id    LowCardinality(String),
    playbook      LowCardinality(String),
    step          LowCardinality(String),
    category      LowCardinality(String),  -- the usage categories, and idle | shared (distributed)
    item          String,
    unit          LowCardinality(String),
    quantity      Float64,
    used          Float64,
    requested     Float64,
    unit_price    Float64,
    amount        Float64,
    currency      LowCardinality(String),
    price_version LowCardinality(String),
    built_at      DateTime64(6, 'UTC')
)
ENGINE = ReplacingMergeTree(built_at)
PARTITION BY toYYYYMM(day)
ORDER BY (day, tenant_id, project_id, playbook, step, category, item);

-- the usage counters of the interactive dashboard, rebuilt per day like cost_line_day
DROP VIEW IF EXISTS $db.allocation_step_day_mv;
DROP TABLE IF EXISTS $db.allocation_step_day;
DROP TABLE IF EXISTS $db.allocation_step_day_next;
CREATE TABLE $db.allocation_step_day
(
    tenant_id        LowCardinality(String),
    project_id       LowCardinality(String),
    playbook         LowCardinality(String),
    step             LowCardinality(String),
    day              Date,
    attempts         UInt64,
    failed_attempts  UInt64,
    retries          UInt64,
    cpu_core_hours   Float64,
    ram_byte_hours   Float64,
    wall_hours       Float64,
    egress_bytes     UInt64,
    net_in_bytes     UInt64,
    net_out_bytes    UInt64,
    bytes_read       UInt64,
    bytes_written    UInt64,
    rows_moved       UInt64,
    shots            UInt64,
    qpu_seconds      Float64,
    executions       UInt64,
    duration_q       Array(Float64),
    built_at         DateTime64(6, 'UTC')
)
ENGINE = ReplacingMergeTree(built_at)
PARTITION BY toYYYYMM(day)
ORDER BY (tenant_id, project_id, playbook, step, day)
TTL day + INTERVAL 5 YEAR;

-- the old model's tables and views: tenant_cost_fact becomes a view of the priced table
DROP VIEW IF EXISTS $db.cost_lines;
DROP VIEW IF EXISTS $db.cost_usage;
DROP TABLE IF EXISTS $db.price;
DROP TABLE IF EXISTS $db.tenant_cost_fact;
DROP TABLE IF EXISTS $db.tenant_cost_fact_next;
DROP VIEW IF EXISTS $db.storage_step_day;

CREATE VIEW $db.tenant_cost_fact AS
SELECT tenant_id, project_id, playbook, day, category, item, any(unit) AS unit, sum(quantity) AS quantity,
       any(unit_price) AS unit_price, sum(amount) AS amount, any(currency) AS currency, max(built_at) AS refreshed_at
FROM $db.cost_line_day FINAL
GROUP BY tenant_id, project_id, playbook, day, category, item
HAVING NOT (category IN ('idle', 'shared') AND amount = 0);

-- per tenant / project / playbook / step / day: the priced lines pivoted by component, with the
-- usage counters; `cost` is every line of the group (idle and shared rows have step ''); idle left
-- unallocated (tenant __idle__) is not a tenant's: allocation_summary_day reports it
CREATE OR REPLACE VIEW $db.allocation_cost_day AS
SELECT if(_c.tenant_id = '', '__unallocated__', _c.tenant_id) AS tenant, _c.project_id AS project,
       if(_c.playbook = '', '(unknown)', _c.playbook) AS playbook, _c.step AS step, _c.day AS day,
       _n.attempts AS attempts, _n.failed_attempts AS failed_attempts, _n.retries AS retries,
       _n.executions AS executions, _c.cpu_core_hours AS cpu_core_hours, _c.billed_core_hours AS billed_core_hours,
       _c.ram_gb_hours * 1e9 AS ram_byte_hours, _c.gpu_hours AS gpu_hours, _n.wall_hours AS wall_hours,
       _n.egress_bytes AS egress_bytes, _n.net_in_bytes AS net_in_bytes, _n.net_out_bytes AS net_out_bytes,
       _n.bytes_read AS bytes_read, _n.bytes_written AS bytes_written, _n.rows_moved AS rows_moved,
       _n.shots AS shots, _n.qpu_seconds AS qpu_seconds,
       _c.cpu_cost AS cpu_cost, _c.ram_cost AS ram_cost, _c.gpu_cost AS gpu_cost, _c.egress_cost AS egress_cost,
       _c.storage_cost AS storage_cost, _c.call_cost AS call_cost, _c.shot_cost AS shot_cost,
       _c.qpu_cost AS qpu_cost, _c.shot_cost + _c.qpu_cost AS quantum_cost, _c.platform_cost AS platform_cost,
       _c.idle_cost AS idle_cost, _c.shared_cost AS shared_cost, _c.cost AS cost,
       _c.price_version AS price_version, _c.currency AS currency
FROM
(
    SELECT tenant_id, project_id, playbook, step, day,
           sumIf(used, category = 'compute') AS cpu_core_hours, sumIf(quantity, category = 'compute') AS billed_core_hours,
           sumIf(used, category = 'ram') AS ram_gb_hours, sumIf(quantity, category = 'gpu') AS gpu_hours,
           sumIf(amount, category = 'compute') AS cpu_cost, sumIf(amount, category = 'ram') AS ram_cost,
           sumIf(amount, category = 'gpu') AS gpu_cost, sumIf(amount, category = 'egress') AS egress_cost,
           sumIf(amount, category = 'storage') AS storage_cost, sumIf(amount, category = 'call') AS call_cost,
           sumIf(amount, category = 'quantum' AND item = 'shot') AS shot_cost,
           sumIf(amount, category = 'quantum' AND item = 'qpu_second') AS qpu_cost,
           sumIf(amount, category = 'platform') AS platform_cost, sumIf(amount, category = 'idle') AS idle_cost,
           sumIf(amount, category = 'shared') AS shared_cost, sum(amount) AS cost,
           anyIf(price_version, price_version != '') AS price_version, any(currency) AS currency
    FROM $db.cost_line_day FINAL
    GROUP BY tenant_id, project_id, playbook, step, day
    HAVING tenant_id != '__idle__'  -- idle no tenant carries: the cluster view (allocation_summary_day)
) AS _c
LEFT JOIN (SELECT * FROM $db.allocation_step_day FINAL) AS _n
    ON _n.tenant_id = _c.tenant_id AND _n.project_id = _c.project_id AND _n.playbook = _c.playbook
   AND _n.step = _c.step AND _n.day = _c.day;

CREATE OR REPLACE VIEW $db.allocation_cost_line_day AS
SELECT if(tenant_id = '', '__unallocated__', tenant_id) AS tenant, project_id AS project, playbook, step, day,
       category, item, unit, quantity, used, requested, amount AS cost, price_version, currency
FROM $db.cost_line_day FINAL;

CREATE OR REPLACE VIEW $db.storage_cost_day AS
SELECT if(tenant_id = '', '__unallocated__', tenant_id) AS tenant, project_id AS project, playbook, step, day,
       item AS store, quantity AS gb_months, amount AS cost, price_version
FROM $db.cost_line_day FINAL
WHERE category = 'storage';

-- per day: cost carried by tenants, by nobody, storage, provisioned capacity and idle
CREATE OR REPLACE VIEW $db.allocation_summary_day AS
SELECT _d.day AS day, allocated, unallocated, storage_cost, _v.capacity_cost_day AS capacity_cost, idle,
       if(capacity_cost > 0, idle / capacity_cost, 0) AS idle_share, _v.version AS price_version
FROM
(
    SELECT day, 1 AS k,
           sumIf(amount, tenant_id NOT IN ('', '__idle__')) AS allocated,
           sumIf(amount, tenant_id = '') AS unallocated,
           sumIf(amount, category = 'storage') AS storage_cost,
           sumIf(amount, category = 'idle') AS idle
    FROM $db.cost_line_day FINAL
    GROUP BY day
) AS _d
ASOF LEFT JOIN $db.price_version AS _v ON _d.k = _v.k AND _d.day >= _v.valid_from
