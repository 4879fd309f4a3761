"""The versioned ClickHouse schema: migrations apply in order, once, and an
edited migration is refused."""

from __future__ import annotations

import pytest

from analytics.facts import SCHEMAS
from analytics.schema import MigrationError, apply_migrations, latest_version, migrations
from analytics.store import FactsStore, FactsStoreError, resolve_facts_url


def test_migrations_are_numbered_and_applied_once(facts_store):
    versions = [m.version for m in migrations()]
    assert versions == list(range(1, latest_version() + 1))
    _, rows = facts_store.query("SELECT version FROM $db.schema_migrations ORDER BY version")
    assert [r[0] for r in rows] == versions
    assert apply_migrations(facts_store.client, facts_store.database) == []  # nothing left to apply
    _, rows = facts_store.query("SELECT count() FROM $db.schema_migrations")
    assert rows[0][0] == len(versions)


def test_fact_tables_match_the_writer_columns(facts_store):
    for table, columns in SCHEMAS.items():
        _, rows = facts_store.query(
            "SELECT name FROM system.columns WHERE database = {db:String} AND table = {t:String}"
            " AND default_kind != 'MATERIALIZED' ORDER BY position",
            {"db": facts_store.database, "t": table},
        )
        assert [r[0] for r in rows] == [name for name, _ in columns], table


def test_an_edited_applied_migration_is_refused(facts_store):
    facts_store.command("ALTER TABLE $db.schema_migrations UPDATE checksum = 'edited' WHERE version = 1"
                        " SETTINGS mutations_sync = 1")
    with pytest.raises(MigrationError, match="changed after it was applied"):
        apply_migrations(facts_store.client, facts_store.database)


def test_second_database_in_the_same_engine(facts_store):
    other = FactsStore(facts_store.url, database="noetl_other")
    _, rows = other.query("SELECT count() FROM $db.task_fact")
    assert rows[0][0] == 0
    assert other.client is facts_store.client  # one engine, one client per path in the process


def test_bad_urls_and_names_are_clear_errors(tmp_path):
    with pytest.raises(FactsStoreError, match="unsupported facts store URL"):
        resolve_facts_url("mysql://x")
    with pytest.raises(FactsStoreError, match="invalid ClickHouse database name"):
        FactsStore(f"chdb://{tmp_path}/f", database="drop table;")
    assert resolve_facts_url(None, tmp_path) == f"chdb://{(tmp_path / 'facts').resolve()}"
