-- Quantum in the tenant-cost model too (issue 20.4): the shots and QPU seconds of each attempt
-- (task_fact, V004) become `quantum` usage lines, item = unit = shot | qpu_second, priced by the
-- price file's `quantum:` section (no `default` item: an unpriced unit costs nothing).
-- The view is V002's cost_usage with the two quantum branches added.

CREATE OR REPLACE VIEW $db.cost_usage AS
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
FROM $db.task_fact FINAL
UNION ALL
SELECT tenant_id, project_id, execution_id, toDate(ts), 'quantum', 'shot', 'shot', toFloat64(shots)
FROM $db.task_fact FINAL
WHERE shots > 0
UNION ALL
SELECT tenant_id, project_id, execution_id, toDate(ts), 'quantum', 'qpu_second', 'qpu_second', qpu_seconds
FROM $db.task_fact FINAL
WHERE qpu_seconds > 0
