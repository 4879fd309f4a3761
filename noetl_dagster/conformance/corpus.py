"""What the conformance run knows about individual fixtures.

Nothing here edits a fixture. A fixture's run may get:

* ``workload`` — documented overrides passed as ``--workload`` (for example
  the host of a database the fixture's own Python code connects to);
* ``seeds`` — SQL run on the conformance database first, standing in for the
  tables another playbook of NoETL's regression run would have created;
* ``after`` — fixtures that must run before it (a parent that creates its tables);
* ``not_runnable`` — the concrete reason it cannot run on this machine.

Hosts are never patched here: every stubbed host is rewritten by the run's
``--http-override`` map, in tool URLs and in workload values alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The e2e payload every regression run passes: it points pg_auth at the local credential.
PG_PAYLOAD = {"pg_auth": "pg_local"}

# Credentials the fixtures name; all point at the local conformance database.
PG_CREDENTIAL_NAMES = ("pg_local", "pg_k8s", "pg_noetl_k8s")


@dataclass
class FixtureSetup:
    workload: dict[str, Any] = field(default_factory=dict)
    seeds: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)
    not_runnable: str | None = None
    timeout: float = 180.0
    note: str = ""


def _stress_items_seed(total: int = 3000, batch: int = 50) -> list[str]:
    # the setup_test_data step of batch_execution/server_oom_stress_test_v2 (not a core fixture)
    return [
        """CREATE TABLE IF NOT EXISTS public.stress_test_items (
             item_id INTEGER PRIMARY KEY, group_id INTEGER NOT NULL, payload TEXT NOT NULL,
             created_at TIMESTAMPTZ DEFAULT NOW())""",
        """CREATE TABLE IF NOT EXISTS public.stress_test_results (
             item_id INTEGER PRIMARY KEY, result_data JSONB NOT NULL, processed_at TIMESTAMPTZ DEFAULT NOW())""",
        "DELETE FROM public.stress_test_results",
        "DELETE FROM public.stress_test_items",
        f"""INSERT INTO public.stress_test_items (item_id, group_id, payload)
             SELECT i, ((i - 1) / {batch}) + 1, 'synthetic_payload_' || i || '_' || repeat('x', 64)
             FROM generate_series(1, {total}) AS i""",
    ]


# from the setup step of pft_flow_test/test_pft_flow_v2 (not a core fixture)
PFT_QUEUE_TABLE = """CREATE TABLE IF NOT EXISTS public.pft_test_patient_work_queue (
    execution_id TEXT NOT NULL, facility_mapping_id INTEGER NOT NULL, data_type TEXT NOT NULL,
    patient_id INTEGER NOT NULL, status TEXT NOT NULL, attempt_count INTEGER NOT NULL DEFAULT 0,
    worker_id TEXT, claimed_at TIMESTAMPTZ, done_at TIMESTAMPTZ, next_retry_at TIMESTAMPTZ, last_error TEXT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT NOW(), updated_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    PRIMARY KEY (execution_id, facility_mapping_id, data_type, patient_id))"""


# NoETL's catalog table (noetl/database/ddl/postgres/schema_ddl.sql, without the FK to noetl.resource) and
# the row a NoETL server holds for postgres_test once it is registered (a playbook runs from the catalog)
NOETL_CATALOG_SEED = [
    "CREATE SCHEMA IF NOT EXISTS noetl",
    """CREATE TABLE IF NOT EXISTS noetl.catalog (
         catalog_id BIGINT PRIMARY KEY, path TEXT NOT NULL, version SMALLSERIAL NOT NULL, kind VARCHAR NOT NULL,
         content TEXT, layout JSONB, payload JSONB, meta JSONB,
         created_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, UNIQUE (path, version))""",
    "DELETE FROM noetl.catalog WHERE path = 'test/postgres'",
    "INSERT INTO noetl.catalog (catalog_id, path, version, kind) VALUES (1, 'test/postgres', 1, 'Playbook') "
    "ON CONFLICT (catalog_id) DO NOTHING",
]


def _pg_conninfo_workload(keys: dict[str, str], pg: dict[str, str]) -> dict[str, Any]:
    """Workload keys a fixture's own Python code reads to connect to Postgres."""
    return {wk: pg[field_name] for wk, field_name in keys.items()}


def fixture_setups(pg: dict[str, str]) -> dict[str, FixtureSetup]:
    """Per-fixture setup, keyed by the path under ``fixtures/playbooks``. ``pg`` holds
    the local database's host, port, user, password and dbname."""
    pg_python = _pg_conninfo_workload(
        {
            "pg_host": "host",
            "pg_port": "port",
            "pg_user": "user",
            "pg_password": "password",
            "pg_database": "dbname",
        },
        pg,
    )
    return {
        "keychain/google_id_token/google_id_token_test.yaml": FixtureSetup(
            not_runnable="needs Google Cloud: the keychain entry (kind google_id_token) mints an ID token from a "
            "service-account key kept in Google Secret Manager, and the playbook calls a private Cloud Run service"
        ),
        "keychain/google_id_token/google_id_token_comparison_test.yaml": FixtureSetup(
            not_runnable="needs Google Cloud: two google_id_token keychain entries (Secret Manager service-account "
            "key, and a stored service-account credential) and a private Cloud Run service"
        ),
        "api_integration/auth0/auth0_login.yaml": FixtureSetup(
            not_runnable="needs an Auth0 tenant (JWKS download and RS256 token verification) and the NoETL gateway "
            "callback service"
        ),
        "batch_execution/heavy_payload_pipeline_chunk_worker/heavy_payload_pipeline_chunk_worker.yaml": FixtureSetup(
            after=["batch_execution/heavy_payload_pipeline_in_step/heavy_payload_pipeline_in_step.yaml"],
            note="runs after heavy_payload_pipeline_in_step, which creates and seeds public.heavy_payload_source",
        ),
        "batch_execution/server_oom_stress_chunk_worker/server_oom_stress_chunk_worker.yaml": FixtureSetup(
            seeds=_stress_items_seed(),
            note="public.stress_test_items seeded as server_oom_stress_test_v2's setup step does (3000 rows)",
        ),
        "batch_execution/server_oom_stress_chunk_worker_v2/server_oom_stress_chunk_worker_v2.yaml": FixtureSetup(
            seeds=_stress_items_seed(),
            note="public.stress_test_items seeded as server_oom_stress_test_v2's setup step does (3000 rows)",
        ),
        "batch_execution/kind_playbook_lease_expiry/kind_playbook_lease_expiry.yaml": FixtureSetup(
            seeds=_stress_items_seed(),
            workload={"api_delay_seconds": 0, "item_delay_seconds": 0},
            note="public.stress_test_items seeded (3000 rows); api_delay_seconds 130 -> 0 and item_delay_seconds "
            "1 -> 0: those sleeps (about 2 h over 60 batches) exist to outlast NoETL's 120 s NATS lease, which "
            "this engine does not have",
        ),
        "postgres_test.yaml": FixtureSetup(
            seeds=NOETL_CATALOG_SEED,
            note="reads the NoETL server's catalog: noetl.catalog created with NoETL's DDL (schema_ddl.sql) and "
            "holding the row NoETL writes when this playbook is registered to run (path test/postgres, kind Playbook)",
        ),
        "retry_test/python_retry_exception.yaml": FixtureSetup(
            note="random by design: each attempt fails with probability 0.7, so even with its retries a run fails now and then"
        ),
        "pft_flow_test/pft_queue_db_maintenance.yaml": FixtureSetup(
            workload=pg_python,
            seeds=[PFT_QUEUE_TABLE],
            note="its Python code connects to Postgres itself: pg_* workload keys point at the local server; "
            "public.pft_test_patient_work_queue created as test_pft_flow_v2 does",
        ),
        "python_psycopg/http_to_postgres_bulk/http_to_postgres_bulk_python.yaml": FixtureSetup(
            workload=pg_python,
            note="its Python code connects to Postgres itself: pg_* workload keys point at the local server",
        ),
    }
