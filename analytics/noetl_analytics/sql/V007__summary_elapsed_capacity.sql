-- issue 43: today's idle is the capacity of the elapsed part of the day (rollups.elapsed_fraction);
-- the __idle__ row of each day carries that part as its quantity (unit 'day'), so the summary's
-- capacity_cost and idle_share of today cover the same hours as its idle (a day built before
-- this migration has no such row and reads as a whole day, as before)
CREATE OR REPLACE VIEW $db.allocation_summary_day AS
SELECT _d.day AS day, allocated, unallocated, storage_cost,
       _v.capacity_cost_day * if(covered_rows > 0, covered, 1) AS capacity_cost, idle,
       if(capacity_cost > 0, idle / capacity_cost, 0) AS idle_share, _v.version AS price_version
FROM
(
    SELECT day, 1 AS k,
           sumIf(amount, tenant_id NOT IN ('', '__idle__')) AS allocated,
           sumIf(amount, tenant_id = '') AS unallocated,
           sumIf(amount, category = 'storage') AS storage_cost,
           sumIf(amount, category = 'idle') AS idle,
           countIf(tenant_id = '__idle__' AND category = 'idle' AND unit = 'day') AS covered_rows,
           maxIf(quantity, tenant_id = '__idle__' AND category = 'idle' AND unit = 'day') AS covered
    FROM $db.cost_line_day FINAL
    GROUP BY day
) AS _d
ASOF LEFT JOIN $db.price_version AS _v ON _d.k = _v.k AND _d.day >= _v.valid_from;
