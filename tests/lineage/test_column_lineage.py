"""columnLineage from a SQL step's statement (issue 18.5), parsed by openlineage-sql and
validated against the bundled OpenLineage spec (the facet's own JSON Schema)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

from openlineage.client.event_v2 import Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.serde import Serde

from noetl_lineage.sql import column_lineage
from noetl_lineage.validate import LineageValidator

SQL = """INSERT INTO analytics.daily_orders (day, customer_id, total)
SELECT o.created_at::date AS day, c.id AS customer_id, sum(o.amount * o.qty) AS total
FROM public.orders o JOIN public.customers c ON c.id = o.customer_id
GROUP BY 1, 2"""


def test_insert_select_gives_per_column_inputs_and_validates():
    facets = column_lineage(SQL, "postgres://127.0.0.1:5432", kind="postgres", default_schema="public")
    assert list(facets) == ["analytics.daily_orders"]
    doc = json.loads(Serde.to_json(facets["analytics.daily_orders"]))
    fields = doc["fields"]
    assert {(f["name"], f["field"]) for f in fields["total"]["inputFields"]} == {
        ("public.orders", "amount"),
        ("public.orders", "qty"),
    }
    assert fields["customer_id"]["inputFields"][0]["field"] == "id"
    # a renamed column is still the exact input value: IDENTITY (facet spec); a cast transforms; sum aggregates
    assert fields["customer_id"]["inputFields"][0]["transformations"][0]["subtype"] == "IDENTITY"
    assert fields["day"]["inputFields"][0]["transformations"][0]["subtype"] == "TRANSFORMATION"
    assert {t["subtype"] for f in fields["total"]["inputFields"] for t in f["transformations"]} == {
        "AGGREGATION"
    }
    event = RunEvent(
        eventType=RunState.COMPLETE,
        eventTime=datetime.now(UTC).isoformat(),
        run=Run(runId=str(uuid.uuid4())),
        job=Job(namespace="noetl://t/p", name="playbooks/orders.load"),
        producer="https://github.com/noetl/noetl-dagster",
        outputs=[OutputDataset(namespace="postgres://127.0.0.1:5432", name="analytics.daily_orders",
                               facets={"columnLineage": facets["analytics.daily_orders"]})],
    )  # fmt: skip
    assert LineageValidator().errors(json.loads(Serde.to_json(event))) == []


def test_identity_copy_and_unparsable_sql():
    facets = column_lineage("CREATE TABLE t2 AS SELECT id, name FROM t1", "duckdb", kind="duckdb")
    f = json.loads(Serde.to_json(facets["t2"]))["fields"]
    assert f["id"]["inputFields"][0]["transformations"] == [{"type": "DIRECT", "subtype": "IDENTITY"}]
    assert column_lineage("SELEC garbage FROM", "x") == {}
    assert column_lineage("SELECT 1", "x") == {}  # reads nothing, writes nothing
