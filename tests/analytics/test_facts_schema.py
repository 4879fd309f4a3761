"""The versioned ClickHouse schema: migrations apply in order, once, and an
edited migration is refused."""

from __future__ import annotations

import socket

import pytest

from noetl_analytics.facts import SCHEMAS
from noetl_analytics.schema import MigrationError, apply_migrations, latest_version, migrations
from noetl_analytics.store import FactsStore, FactsStoreError, resolve_facts_url


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
    facts_store.command(
        "ALTER TABLE $db.schema_migrations UPDATE checksum = 'edited' WHERE version = 1"
        " SETTINGS mutations_sync = 1"
    )
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


def test_server_url_names_the_database_and_fails_clearly_when_unreachable(monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = FactsStore(f"http://reader:secret@127.0.0.1:{port}/analytics", migrate=False)
    assert store.database == "analytics" and not store.embedded
    with pytest.raises(
        FactsStoreError, match=r"cannot connect to ClickHouse at http://reader:\*\*\*@127"
    ) as err:
        store.migrate()
    assert "secret" not in str(err.value)
    monkeypatch.setenv("NOETL_CLICKHOUSE_URL", f"http://127.0.0.1:{port}")
    assert FactsStore(migrate=False).url == f"http://127.0.0.1:{port}"  # the documented variable


@pytest.mark.parametrize("database", ["c", "d", "u"])
def test_database_names_that_look_like_aliases_work(facts_store, database):
    from noetl_analytics.dashboard_access import TenantScope, Viewer  # noqa: PLC0415
    from noetl_analytics.facts import FactWriter  # noqa: PLC0415
    from noetl_analytics.panels import PANELS  # noqa: PLC0415
    from noetl_analytics.rollups import refresh_rollups  # noqa: PLC0415
    from noetl_analytics.synthetic import SyntheticSpec, generate  # noqa: PLC0415

    store = FactsStore(facts_store.url, database=database)
    FactWriter(store).write(generate(SyntheticSpec(executions=3, steps=3, ref_rate=1.0)))
    assert refresh_rollups(store).rows > 0
    scope = TenantScope(store, Viewer.everyone())  # the panels read through the tenancy gate only
    for panel in PANELS:
        _, rows = scope.query(panel.render_sql(database))
        assert rows, panel.key
