-- Tenant-cost model: a price table (loaded from the price config on every refresh),
-- the usage each fact implies, priced lines, and the materialized tenant_cost_fact
-- with its rollup views. Quantities: compute in CPU-seconds, storage in GB-months
-- (1 GB = 1e9 bytes; each stored result billed once, at creation, for `multiplier`
-- months), egress in GB, calls in task attempts.

CREATE TABLE IF NOT EXISTS $db.price
(
    category   LowCardinality(String),  -- compute | storage | egress | call
    item       String,                  -- worker class | storage class | region | tool kind; 'default' = fallback
    unit       LowCardinality(String),
    price      Float64,                 -- currency per unit
    multiplier Float64 DEFAULT 1,       -- billed units per quantity (storage: months retained)
    currency   LowCardinality(String)
)
ENGINE = MergeTree
ORDER BY (category, item);

-- Tool kind -> worker class, for tasks whose events name no worker class.
CREATE TABLE IF NOT EXISTS $db.worker_class_map
(
    kind         String,
    worker_class String
)
ENGINE = MergeTree
ORDER BY kind;

CREATE VIEW IF NOT EXISTS $db.cost_usage AS
SELECT _comp.tenant_id AS tenant_id, _comp.project_id AS project_id, _comp.execution_id AS execution_id,
       toDate(_comp.ts) AS day, 'compute' AS category,
       if(_comp.worker_class != '', _comp.worker_class, if(_class.worker_class != '', _class.worker_class, 'default')) AS item,
       'cpu_second' AS unit, _comp.cpu_seconds AS quantity
FROM $db.compute_fact AS _comp FINAL
LEFT JOIN $db.worker_class_map AS _class ON _class.kind = _comp.kind
UNION ALL
SELECT tenant_id, project_id, execution_id, toDate(ts), 'egress', if(region != '', region, 'default'),
       'GB', egress_bytes / 1e9
FROM $db.compute_fact FINAL
WHERE egress_bytes > 0
UNION ALL
SELECT tenant_id, project_id, execution_id, day, 'storage', if(store != '', store, 'default'), 'GB-month', size_bytes / 1e9
FROM
(
    -- a reference is billed once, to the execution that created it first
    SELECT uri, argMin(tenant_id, ts) AS tenant_id, argMin(project_id, ts) AS project_id,
           argMin(execution_id, ts) AS execution_id, toDate(min(ts)) AS day,
           argMin(store, ts) AS store, argMin(size_bytes, ts) AS size_bytes
    FROM $db.resource_fact FINAL
    WHERE action = 'created'
    GROUP BY uri
)
UNION ALL
SELECT tenant_id, project_id, execution_id, toDate(ts), 'call', kind, 'call', 1
FROM $db.task_fact FINAL;

CREATE VIEW IF NOT EXISTS $db.cost_lines AS
SELECT
    _use.tenant_id AS tenant_id,
    _use.project_id AS project_id,
    if(_dim.playbook = '', '(unknown)', _dim.playbook) AS playbook,
    _use.day AS day,
    _use.category AS category,
    _use.item AS item,
    any(_use.unit) AS unit,
    sum(_use.quantity) AS quantity,
    any(if(_price.item != '', _price.price, _fallback.price)) AS unit_price,
    sum(_use.quantity) * any(if(_price.item != '', _price.price * _price.multiplier, _fallback.price * _fallback.multiplier)) AS amount,
    any(if(_price.item != '', _price.currency, _fallback.currency)) AS currency
FROM $db.cost_usage AS _use
LEFT JOIN $db.execution_dim AS _dim ON _dim.execution_id = _use.execution_id
LEFT JOIN $db.price AS _price ON _price.category = _use.category AND _price.item = _use.item
LEFT JOIN (SELECT * FROM $db.price WHERE item = 'default') AS _fallback ON _fallback.category = _use.category
GROUP BY tenant_id, project_id, playbook, day, category, item;

-- Materialized by analytics.rollups.refresh_rollups (the Dagster asset `noetl_cost_rollups`).
CREATE TABLE IF NOT EXISTS $db.tenant_cost_fact
(
    tenant_id    LowCardinality(String),
    project_id   LowCardinality(String),
    playbook     LowCardinality(String),
    day          Date,
    category     LowCardinality(String),
    item         String,
    unit         LowCardinality(String),
    quantity     Float64,
    unit_price   Float64,
    amount       Float64,
    currency     LowCardinality(String),
    refreshed_at DateTime64(6, 'UTC')
)
ENGINE = MergeTree
ORDER BY (tenant_id, project_id, playbook, day, category, item);

CREATE VIEW IF NOT EXISTS $db.cost_by_tenant_day AS
SELECT tenant_id, day, sum(amount) AS amount, any(currency) AS currency
FROM $db.tenant_cost_fact
GROUP BY tenant_id, day;

CREATE VIEW IF NOT EXISTS $db.cost_by_project_day AS
SELECT tenant_id, project_id, day, sum(amount) AS amount, any(currency) AS currency
FROM $db.tenant_cost_fact
GROUP BY tenant_id, project_id, day;

CREATE VIEW IF NOT EXISTS $db.cost_by_playbook_day AS
SELECT tenant_id, project_id, playbook, day, sum(amount) AS amount, any(currency) AS currency
FROM $db.tenant_cost_fact
GROUP BY tenant_id, project_id, playbook, day;
