"""A fresh NATS tier per test: its own region (so its own streams) on the machine's nats-server, its own
projection schema in the ``nats_tiers`` database and its own payload directory; all removed after."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg

from noetl_dagster.storage.nats_streams import Placement, connect, placement_of

NATS_URL = os.environ.get("NOETL_TEST_NATS_URL", "nats://127.0.0.1:4222")
PG_ADMIN = os.environ.get("NOETL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
DB = "nats_tiers"
PG_DB = PG_ADMIN.rsplit("/", 1)[0] + "/" + DB


def ensure_db() -> None:
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB,)).fetchone():
            try:
                conn.execute(f'CREATE DATABASE "{DB}"')
            except psycopg.errors.DuplicateDatabase:
                pass


@dataclass
class Tier:
    region: str
    schema: str
    payload: Path
    nats_url: str = NATS_URL

    @property
    def projection_url(self) -> str:
        return f"{PG_DB}?schema={self.schema}"

    @property
    def url(self) -> str:
        return (f"{self.nats_url}?projection={quote(self.projection_url, safe='')}"
                f"&payload={quote('file://' + str(self.payload), safe='')}&region={self.region}")  # fmt: skip

    def placement(self, tenant: str = "default", project: str = "default") -> Placement:
        return placement_of(tenant, project, region=self.region)

    def cleanup(self) -> None:
        try:
            with connect(self.nats_url) as client:
                infos = client.call(client.js.streams_info())
                for info in infos:
                    if f"_{self.region}_s" in info.config.name:
                        client.call(client.js.delete_stream(info.config.name))
        except ConnectionError:
            pass
        with psycopg.connect(PG_DB, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


def new_tier(tmp_path: Path, nats_url: str = NATS_URL) -> Tier:
    ensure_db()
    tag = uuid.uuid4().hex[:10]
    return Tier(region=f"t{tag}", schema=f"nt_{tag}", payload=tmp_path / f"archive-{tag}", nats_url=nats_url)
