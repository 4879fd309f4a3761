-- Facts derived from the NoETL event log (one row per fact event, keyed on event_id).
-- ReplacingMergeTree collapses rows re-sent by the exporter (same sorting key); every
-- reader uses FINAL (the store sets `final = 1` on its client, views say FINAL), so a
-- re-export never changes a total. Partitions are by event month, so a re-sent row
-- always lands in the partition of its first copy.

CREATE TABLE IF NOT EXISTS $db.execution_fact
(
    event_id            String,
    ts                  DateTime64(6, 'UTC'),
    tenant_id           LowCardinality(String),
    project_id          LowCardinality(String),
    execution_id        String,
    parent_execution_id String,
    playbook            LowCardinality(String),  -- metadata.path, on the `requested` row
    playbook_name       LowCardinality(String),
    transition          LowCardinality(String),  -- requested | started | finished | processed
    status              LowCardinality(String),  -- requested | running | completed | failed
    duration_ms         Float64,
    region              LowCardinality(String),
    shard               LowCardinality(String)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (tenant_id, project_id, execution_id, event_id);

CREATE TABLE IF NOT EXISTS $db.step_fact
(
    event_id      String,
    ts            DateTime64(6, 'UTC'),
    tenant_id     LowCardinality(String),
    project_id    LowCardinality(String),
    execution_id  String,
    step          LowCardinality(String),
    step_run_id   String,
    outcome       LowCardinality(String),  -- done | failed | skipped
    duration_ms   Float64,
    error_kind    LowCardinality(String),
    error_message String
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (tenant_id, project_id, execution_id, event_id);

CREATE TABLE IF NOT EXISTS $db.task_fact
(
    event_id      String,
    ts            DateTime64(6, 'UTC'),
    tenant_id     LowCardinality(String),
    project_id    LowCardinality(String),
    execution_id  String,
    step          LowCardinality(String),
    step_run_id   String,
    task_run_id   String,
    task          LowCardinality(String),
    kind          LowCardinality(String),
    attempt       UInt32,
    status        LowCardinality(String),  -- ok | error
    duration_ms   Float64,
    error_kind    LowCardinality(String),
    error_message String,
    retryable     UInt8,
    directive     LowCardinality(String),  -- continue | retry | jump | break | fail | ...
    loop_id       String,
    iteration     Nullable(Int64),
    -- what the attempt consumed (outcome.meta), projected into compute_fact below
    worker_class  LowCardinality(String),
    resource_type LowCardinality(String) DEFAULT 'cpu',
    units         Float64 DEFAULT 1,
    cpu_ms        Nullable(Float64),
    egress_bytes  UInt64,
    provider      LowCardinality(String),
    region        LowCardinality(String)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (tenant_id, project_id, execution_id, event_id);

-- Loop lifecycle: one row per loop.started / loop.iteration.done|failed / loop.done.
CREATE TABLE IF NOT EXISTS $db.frame_fact
(
    event_id      String,
    ts            DateTime64(6, 'UTC'),
    tenant_id     LowCardinality(String),
    project_id    LowCardinality(String),
    execution_id  String,
    step          LowCardinality(String),
    loop_id       String,
    transition    LowCardinality(String),  -- started | iteration_done | iteration_failed | done
    iteration     Nullable(Int64),
    total         Nullable(UInt64),
    ok            Nullable(UInt64),
    failed        Nullable(UInt64),
    mode          LowCardinality(String),
    max_in_flight Nullable(UInt32),
    duration_ms   Float64
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (tenant_id, project_id, execution_id, event_id);

-- Result references seen in the log: `created` when a result was stored by
-- reference, `read` when a reference was handed to a step as an argument.
CREATE TABLE IF NOT EXISTS $db.resource_fact
(
    event_id           String,
    ordinal            UInt16,
    ts                 DateTime64(6, 'UTC'),
    tenant_id          LowCardinality(String),
    project_id         LowCardinality(String),
    execution_id       String,
    step               LowCardinality(String),
    task               LowCardinality(String),
    event_name         LowCardinality(String),
    action             LowCardinality(String),  -- created | read
    uri                String,
    store              LowCardinality(String),
    format             LowCardinality(String),
    size_bytes         UInt64,
    rows               Nullable(Int64),
    checksum           String,
    schema_fingerprint String
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (tenant_id, project_id, execution_id, event_id, ordinal);

-- One row per task attempt as compute usage (the cost model's compute/egress input),
-- filled by ClickHouse from every insert into task_fact (compute_fact_mv).
CREATE TABLE IF NOT EXISTS $db.compute_fact
(
    event_id      String,
    ts            DateTime64(6, 'UTC'),
    tenant_id     LowCardinality(String),
    project_id    LowCardinality(String),
    execution_id  String,
    step          LowCardinality(String),
    task          LowCardinality(String),
    kind          LowCardinality(String),
    attempt       UInt32,
    worker_class  LowCardinality(String),  -- '' = resolved from worker_class_map / 'default'
    resource_type LowCardinality(String) DEFAULT 'cpu',  -- cpu | gpu | tpu | qpu
    units         Float64 DEFAULT 1,       -- cores (or devices) the attempt held
    runtime_ms    Float64,
    cpu_ms        Nullable(Float64),       -- measured CPU time when the worker reports it
    cpu_seconds   Float64 MATERIALIZED coalesce(cpu_ms, runtime_ms * units) / 1000,
    egress_bytes  UInt64,
    provider      LowCardinality(String),
    region        LowCardinality(String)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (tenant_id, project_id, execution_id, event_id);

CREATE MATERIALIZED VIEW IF NOT EXISTS $db.compute_fact_mv TO $db.compute_fact AS
SELECT event_id, ts, tenant_id, project_id, execution_id, step, task, kind, attempt, worker_class,
       resource_type, units, duration_ms AS runtime_ms, cpu_ms, egress_bytes, provider, region
FROM $db.task_fact;

-- Where each exporter stopped in each event log (highest exported global cursor).
CREATE TABLE IF NOT EXISTS $db.export_cursor
(
    source     String,
    cursor     UInt64,
    updated_at DateTime64(6, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY source;

-- One row per execution: playbook and final status (the dimension rollups join on).
CREATE VIEW IF NOT EXISTS $db.execution_dim AS
SELECT
    execution_id,
    any(tenant_id) AS tenant_id,
    any(project_id) AS project_id,
    if(anyIf(playbook, transition = 'requested') = '', '(unknown)', anyIf(playbook, transition = 'requested')) AS playbook,
    anyIf(playbook_name, transition = 'requested') AS playbook_name,
    anyIf(parent_execution_id, transition = 'requested') AS parent_execution_id,
    min(ts) AS started_at,
    maxIf(ts, transition = 'finished') AS finished_at,
    if(countIf(transition = 'finished') > 0, anyIf(status, transition = 'finished'), 'running') AS status,
    -- the engine may leave duration_ms out of workflow.finished: fall back to the event times
    if(maxIf(duration_ms, transition = 'finished') > 0, maxIf(duration_ms, transition = 'finished'),
       if(countIf(transition = 'finished') > 0,
          dateDiff('microsecond', min(ts), maxIf(ts, transition = 'finished')) / 1000, 0)) AS duration_ms
FROM $db.execution_fact FINAL
GROUP BY execution_id;
