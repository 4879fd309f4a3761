"""Commits per execution on the real Postgres server, counted by the server itself
(``pg_stat_database.xact_commit`` of a database of the test's own; issue 46): a pure five-step
execution is two commits (the request, then the rest at its end; it was seven), the same steps
with effects six (a barrier before each effect). Two batches of different sizes are compared, so
what opening and closing the store costs cancels out."""

from __future__ import annotations

import os
import time
import uuid

import psycopg
import pytest
import yaml

from benchmarks.bench_throughput import EFFECT_PLAYBOOK, PLAYBOOK
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.storage.postgres_events import PostgresEventStore

ADMIN = os.environ.get("NOETL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(scope="module")
def database():
    name = "commit_boundary_" + uuid.uuid4().hex[:8]
    with psycopg.connect(ADMIN, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    yield name, ADMIN.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(ADMIN, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _settled_commits(name: str) -> int:
    """xact_commit once it stops moving (a backend reports its counts when it exits)."""
    last, since = None, time.monotonic()
    with psycopg.connect(ADMIN, autocommit=True) as c:
        while True:
            now = c.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (name,)
            ).fetchone()[0]
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since > 1.5:
                return int(now)
            time.sleep(0.25)
            c.execute("SELECT pg_stat_clear_snapshot()")


def _batch(name: str, url: str, path, tmp_path, n: int) -> int:
    before = _settled_commits(name)
    store = PostgresEventStore(url)
    try:
        for _ in range(n):
            assert run_playbook(path, event_store=store, data_dir=tmp_path).status == "completed"
    finally:
        store.close()
    return _settled_commits(name) - before


@pytest.mark.slow
@pytest.mark.parametrize(
    ("playbook", "per_execution"), [(PLAYBOOK, 2), (EFFECT_PLAYBOOK, 6)], ids=["pure", "effects"]
)
def test_commits_per_five_step_execution_counted_by_the_server(database, tmp_path, playbook, per_execution):
    name, url = database
    path = tmp_path / "five.yaml"
    path.write_text(yaml.safe_dump(playbook, sort_keys=False))
    _batch(name, url, path, tmp_path, 1)  # the schema, and the first execution's prepared statement
    small, large = _batch(name, url, path, tmp_path, 2), _batch(name, url, path, tmp_path, 6)
    assert (large - small) == 4 * per_execution, (small, large)
