"""Versioned ClickHouse DDL for the facts database.

Migrations are the files ``analytics/noetl_analytics/sql/V<NNN>__<name>.sql`` applied in order;
each applied version is recorded with its checksum in ``schema_migrations``,
and an edited, already-applied migration is refused (add a new one instead).
``$db`` in a file stands for the target database.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from clickhouse_connect.driver.client import Client

SQL_DIR = Path(__file__).parent / "sql"
_NAME = re.compile(r"^V(\d{3})__([a-z0-9_]+)\.sql$")


class MigrationError(RuntimeError):
    pass


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    def statements(self, database: str) -> list[str]:
        # comments go first: they may hold semicolons (the DDL has no "--" inside strings)
        text = re.sub(r"--[^\n]*", "", self.sql)
        return [s.strip().replace("$db", database) for s in text.split(";") if s.strip()]


def migrations() -> list[Migration]:
    found = []
    for path in sorted(SQL_DIR.glob("*.sql")):
        m = _NAME.match(path.name)
        if not m:
            raise MigrationError(f"bad migration file name {path.name} (want V001__name.sql)")
        found.append(Migration(int(m.group(1)), m.group(2), path.read_text()))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise MigrationError(f"migration versions must be 1..N without gaps, got {versions}")
    return found


def latest_version() -> int:
    return len(migrations())


def apply_migrations(client: Client, database: str) -> list[int]:
    """Bring ``database`` to the latest schema; returns the versions applied now."""
    client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    client.command(
        f"CREATE TABLE IF NOT EXISTS {database}.schema_migrations"
        " (version UInt32, name String, checksum String, applied_at DateTime64(6, 'UTC'))"
        " ENGINE = MergeTree ORDER BY version"
    )
    done = {
        int(v): c
        for v, c in client.query(f"SELECT version, checksum FROM {database}.schema_migrations").result_rows
    }
    applied = []
    for mig in migrations():
        if mig.version in done:
            if done[mig.version] != mig.checksum:
                raise MigrationError(
                    f"migration V{mig.version:03d}__{mig.name} was changed after it was applied to"
                    f" {database}; add a new migration instead of editing an applied one"
                )
            continue
        for stmt in mig.statements(database):
            client.command(stmt)
        client.insert(
            f"{database}.schema_migrations",
            [[mig.version, mig.name, mig.checksum, datetime.now(UTC)]],
            column_names=["version", "name", "checksum", "applied_at"],
        )
        applied.append(mig.version)
    return applied
