"""The warm tier (seed 004 §6): Postgres projections of the NATS event streams, and reads from them.

Tables, in one schema (the projection URL's ``schema=``, default ``noetl_projection``):

* ``event_projection``   every event (its stored form and chain hash), for ``read``/``tail``/archives;
  ``gid`` is the projection's own commit order (the cursor of ``tail``), ``stream_seq`` where it came from
* ``execution_projection`` current status and summary per (tenant_id, project_id, execution_id), with
  the stream range it spans (``first_stream_seq``..``last_stream_seq``, the retention controller's input)
* ``task_projection``    current status per (execution_id, step_id, task_id, attempt); the step itself
  is the row with ``task_id = ''``
* ``resource_index``     result references (``$ref``) and archive manifests, keyed (resource_uri, version)
* ``archive_manifest_index`` the archive bundles written (one row per event segment), by the archiver
* ``projection_checkpoint`` per (projection_name, region, shard, stream_name): the last stream sequence applied
* ``processed_event``    the idempotency ledger: (projection_name, event_id)

``apply`` takes a batch of (stream sequence, envelope) and writes ledger, projections and checkpoint in
one transaction: a consumer killed mid-batch leaves nothing of it, and a batch delivered twice (its
acks lost) changes nothing the second time (the ledger skips every event already applied).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from noetl_dagster.engine.events import Event
from noetl_dagster.engine.ports import ExecutionInfo, StoredEvent
from noetl_dagster.storage.event_codec import _execution_update, decode_body
from noetl_dagster.storage.nats_streams import event_of
from noetl_dagster.storage.payload import iter_ref_dicts
from noetl_dagster.storage.postgres_events import split_schema
from noetl_dagster.util.jsonutil import dumps, sorted_json

DEFAULT_SCHEMA = "noetl_projection"
STATE = "state"  # the projection this module keeps (events, executions, tasks, resources)

DDL = [
    "CREATE SCHEMA IF NOT EXISTS {schema}",
    """CREATE TABLE IF NOT EXISTS {schema}.event_projection (
        gid BIGSERIAL PRIMARY KEY,
        event_id TEXT NOT NULL UNIQUE,
        execution_id TEXT NOT NULL,
        sequence BIGINT NOT NULL,
        name TEXT NOT NULL,
        ts TEXT NOT NULL,
        body TEXT NOT NULL,
        hash TEXT,
        region TEXT NOT NULL,
        shard TEXT NOT NULL,
        stream_seq BIGINT,
        UNIQUE (execution_id, sequence))""",
    """CREATE TABLE IF NOT EXISTS {schema}.execution_projection (
        tenant_id TEXT NOT NULL,
        project_id TEXT NOT NULL,
        execution_id TEXT NOT NULL,
        playbook TEXT,
        status TEXT NOT NULL DEFAULT '',
        parent_execution_id TEXT,
        started_at TEXT,
        finished_at TEXT,
        last_sequence BIGINT NOT NULL DEFAULT 0,
        region TEXT NOT NULL,
        shard TEXT NOT NULL,
        first_stream_seq BIGINT,
        last_stream_seq BIGINT,
        PRIMARY KEY (tenant_id, project_id, execution_id))""",
    "CREATE UNIQUE INDEX IF NOT EXISTS execution_projection_id ON {schema}.execution_projection (execution_id)",
    """CREATE TABLE IF NOT EXISTS {schema}.task_projection (
        execution_id TEXT NOT NULL,
        step_id TEXT NOT NULL,
        task_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        status TEXT NOT NULL,
        kind TEXT,
        step_run_id TEXT,
        task_run_id TEXT,
        started_at TEXT,
        finished_at TEXT,
        last_event_id TEXT NOT NULL,
        PRIMARY KEY (execution_id, step_id, task_id, attempt))""",
    """CREATE TABLE IF NOT EXISTS {schema}.resource_index (
        resource_uri TEXT NOT NULL,
        version TEXT NOT NULL,
        tenant_id TEXT NOT NULL,
        project_id TEXT,
        owner_principal TEXT NOT NULL,
        resource_kind TEXT NOT NULL,
        content_type TEXT,
        checksum_sha256 TEXT,
        size_bytes BIGINT,
        region TEXT NOT NULL,
        shard TEXT NOT NULL,
        storage_class TEXT NOT NULL,
        location_descriptor TEXT NOT NULL,
        policy_ref TEXT,
        PRIMARY KEY (resource_uri, version))""",
    """CREATE TABLE IF NOT EXISTS {schema}.archive_manifest_index (
        tenant_id TEXT NOT NULL,
        project_id TEXT NOT NULL,
        execution_id TEXT NOT NULL,
        segment_id TEXT NOT NULL,
        manifest_uri TEXT NOT NULL,
        final_state_digest TEXT,
        event_count BIGINT,
        region TEXT NOT NULL,
        shard TEXT NOT NULL,
        PRIMARY KEY (tenant_id, execution_id, segment_id))""",
    # the execution summary (engine/explain_summary.py): a cache of the log, not a projection of it
    """CREATE TABLE IF NOT EXISTS {schema}.execution_summary (
        execution_id TEXT NOT NULL,
        ord INTEGER NOT NULL,
        last_sequence BIGINT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (execution_id, ord))""",
    """CREATE TABLE IF NOT EXISTS {schema}.projection_checkpoint (
        projection_name TEXT NOT NULL,
        region TEXT NOT NULL,
        shard TEXT NOT NULL,
        stream_name TEXT NOT NULL,
        last_stream_seq BIGINT NOT NULL,
        last_event_id TEXT,
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        PRIMARY KEY (projection_name, region, shard, stream_name))""",
    """CREATE TABLE IF NOT EXISTS {schema}.processed_event (
        projection_name TEXT NOT NULL,
        event_id TEXT NOT NULL,
        stream_seq BIGINT,
        PRIMARY KEY (projection_name, event_id))""",
]
# the tables a rebuild empties and refills, in canonical_dump's order (the ledger and checkpoint go too)
PROJECTED = ("event_projection", "execution_projection", "task_projection", "resource_index")


class Projection:
    """The projection schema: ``apply`` (consumers) and the reads the event store serves from it."""

    def __init__(self, url: str, *, pool_size: int = 4):
        conninfo, schema = split_schema(url)
        if "schema=" not in url:
            schema = DEFAULT_SCHEMA
        self.url, self.schema = url, schema
        self._ident = sql.Identifier(schema)
        try:
            with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
                conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (f"noetl-projection:{schema}",))
                for stmt in DDL:
                    conn.execute(self._q(stmt))
        except psycopg.OperationalError as e:
            raise ConnectionError(f"projection database: {str(e).strip().splitlines()[0]}") from None
        self._pool = ConnectionPool(
            conninfo, min_size=1, max_size=pool_size, kwargs={"autocommit": True}, open=True
        )

    def _q(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(schema=self._ident)

    def close(self) -> None:
        self._pool.close()

    # -- writes (one transaction per batch) ----------------------------------------------------------

    def apply(
        self,
        items: Sequence[tuple[int | None, dict[str, Any]]],
        *,
        name: str = STATE,
        stream: str = "",
        hook: Callable[[], None] | None = None,
    ) -> int:
        """Apply envelopes (with their stream sequence; None when rebuilt from an archive) in one
        transaction with the ledger and the checkpoint; returns how many were new."""
        if not items:
            return 0
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.execute(
                self._q(
                    "INSERT INTO {schema}.processed_event (projection_name, event_id, stream_seq)"
                    " SELECT %s, unnest(%s::text[]), unnest(%s::bigint[])"
                    " ON CONFLICT DO NOTHING RETURNING event_id"
                ),
                (name, [r["event_id"] for _s, r in items], [s for s, _r in items]),
            )
            new = {row[0] for row in cur.fetchall()}
            fresh = [(s, r) for s, r in items if r["event_id"] in new]
            if fresh:
                self._apply_events(cur, fresh)
            last_seq, last = max(((s or 0), r) for s, r in items) if stream else (0, None)
            if stream and last is not None:
                cur.execute(
                    self._q(
                        "INSERT INTO {schema}.projection_checkpoint AS c (projection_name, region, shard,"
                        " stream_name, last_stream_seq, last_event_id) VALUES (%s, %s, %s, %s, %s, %s)"
                        " ON CONFLICT (projection_name, region, shard, stream_name) DO UPDATE SET"
                        " last_stream_seq = GREATEST(c.last_stream_seq, excluded.last_stream_seq),"
                        " last_event_id = excluded.last_event_id, updated_at = now()"
                    ),
                    (name, last["region"], last["shard"], stream, last_seq, last["event_id"]),
                )
            if hook is not None:  # fault injection (tests): a consumer killed here commits nothing
                hook()
        return len(fresh)

    def _apply_events(self, cur: psycopg.Cursor, fresh: list[tuple[int | None, dict[str, Any]]]) -> None:
        events: list[tuple[int | None, dict[str, Any], Event]] = [(s, r, event_of(r)) for s, r in fresh]
        cur.executemany(
            self._q(
                "INSERT INTO {schema}.event_projection (event_id, execution_id, sequence, name, ts, body, hash,"
                " region, shard, stream_seq) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT DO NOTHING"
            ),
            [
                (
                    e.event_id,
                    e.execution_id,
                    e.sequence,
                    e.name,
                    e.timestamp,
                    dumps(e.to_stored()),
                    r.get("hash"),
                    r["region"],
                    r["shard"],
                    s,
                )
                for s, r, e in events
            ],  # fmt: skip
        )
        execs: dict[str, list[Any]] = {}
        tasks: dict[tuple[str, str, str, int], list[Any]] = {}
        resources: list[tuple[Any, ...]] = []
        for s, r, e in events:
            x = execs.get(e.execution_id)
            if (
                x is None
            ):  # tenant, project, playbook, status, parent, started, finished, last seq, region, shard, lo, hi
                x = execs[e.execution_id] = [e.tenant_id, e.project_id, None, None, e.parent_execution_id,
                                             e.timestamp, None, 0, r["region"], r["shard"], s, s]  # fmt: skip
            pb, status, fin = _execution_update(e)
            x[2] = pb or x[2]
            x[3] = status or x[3]
            x[6] = fin or x[6]
            x[7] = max(x[7], e.sequence or 0)
            if s is not None:
                x[10] = s if x[10] is None else min(x[10], s)
                x[11] = s if x[11] is None else max(x[11], s)
            _task_row(tasks, e)
            _resource_rows(resources, e, r)
        cur.executemany(
            self._q(
                "INSERT INTO {schema}.execution_projection AS x (execution_id, tenant_id, project_id, playbook,"
                " status, parent_execution_id, started_at, finished_at, last_sequence, region, shard,"
                " first_stream_seq, last_stream_seq) VALUES (%s, %s, %s, %s, COALESCE(%s, ''), %s, %s, %s, %s,"
                " %s, %s, %s, %s) ON CONFLICT (tenant_id, project_id, execution_id) DO UPDATE SET"
                " playbook = COALESCE(excluded.playbook, x.playbook),"
                " status = CASE WHEN excluded.status = '' THEN x.status ELSE excluded.status END,"
                " parent_execution_id = COALESCE(x.parent_execution_id, excluded.parent_execution_id),"
                " started_at = LEAST(x.started_at, excluded.started_at),"
                " finished_at = COALESCE(excluded.finished_at, x.finished_at),"
                " last_sequence = GREATEST(x.last_sequence, excluded.last_sequence),"
                " first_stream_seq = LEAST(x.first_stream_seq, excluded.first_stream_seq),"
                " last_stream_seq = GREATEST(x.last_stream_seq, excluded.last_stream_seq)"
            ),
            [(eid, *x) for eid, x in execs.items()],
        )
        if tasks:
            cur.executemany(
                self._q(
                    "INSERT INTO {schema}.task_projection AS t (execution_id, step_id, task_id, attempt, status,"
                    " kind, step_run_id, task_run_id, started_at, finished_at, last_event_id)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                    " ON CONFLICT (execution_id, step_id, task_id, attempt) DO UPDATE SET"
                    " status = CASE WHEN t.finished_at IS NOT NULL AND excluded.finished_at IS NULL"
                    "   THEN t.status ELSE excluded.status END,"
                    " kind = COALESCE(excluded.kind, t.kind),"
                    " step_run_id = COALESCE(excluded.step_run_id, t.step_run_id),"
                    " task_run_id = COALESCE(excluded.task_run_id, t.task_run_id),"
                    " started_at = COALESCE(t.started_at, excluded.started_at),"
                    " finished_at = COALESCE(excluded.finished_at, t.finished_at),"
                    " last_event_id = excluded.last_event_id"
                ),
                [(*k, *v) for k, v in tasks.items()],
            )
        if resources:
            self._put_resources(cur, resources)

    def _put_resources(self, cur: psycopg.Cursor, rows: list[tuple[Any, ...]]) -> None:
        cur.executemany(
            self._q(
                "INSERT INTO {schema}.resource_index (resource_uri, version, tenant_id, project_id,"
                " owner_principal, resource_kind, content_type, checksum_sha256, size_bytes, region, shard,"
                " storage_class, location_descriptor, policy_ref)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
            ),
            rows,
        )

    def index_archive(self, manifest: dict[str, Any], region: str, shard: str) -> None:
        """archive_manifest_index rows of a written bundle: one per event segment."""
        rows = [(manifest.get("tenant_id") or "default", manifest.get("project_id") or "default",
                 manifest["execution_id"], seg["path"], manifest["uri"], manifest.get("final_state_digest"),
                 seg.get("events"), region, shard) for seg in manifest.get("segments", [])]  # fmt: skip
        with self._pool.connection() as conn, conn.cursor() as cur:
            cur.executemany(
                self._q(
                    "INSERT INTO {schema}.archive_manifest_index (tenant_id, project_id, execution_id, segment_id,"
                    " manifest_uri, final_state_digest, event_count, region, shard)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
                ),
                rows,
            )

    def checkpoint(self, name: str, region: str, shard: str, stream: str) -> int:
        with self._pool.connection() as conn:
            row = conn.execute(
                self._q(
                    "SELECT last_stream_seq FROM {schema}.projection_checkpoint"
                    " WHERE projection_name = %s AND region = %s AND shard = %s AND stream_name = %s"
                ),
                (name, region, shard, stream),
            ).fetchone()
        return int(row[0]) if row else 0

    def active_first_seq(self, region: str, shard: str) -> int | None:
        """The smallest stream sequence of an execution that has not finished (retention keeps it)."""
        with self._pool.connection() as conn:
            row = conn.execute(
                self._q(
                    "SELECT MIN(first_stream_seq) FROM {schema}.execution_projection"
                    " WHERE region = %s AND shard = %s AND finished_at IS NULL"
                ),
                (region, shard),
            ).fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def reset(self, name: str = STATE) -> None:
        """Empty this projection (tables, ledger, checkpoints) for a rebuild."""
        with self._pool.connection() as conn, conn.transaction():
            for table in PROJECTED:
                conn.execute(self._q(f"TRUNCATE {{schema}}.{table}"))
            conn.execute(self._q("DELETE FROM {schema}.processed_event WHERE projection_name = %s"), (name,))
            conn.execute(
                self._q("DELETE FROM {schema}.projection_checkpoint WHERE projection_name = %s"), (name,)
            )

    def drop_table(self, table: str) -> None:
        if table not in PROJECTED:
            raise ValueError(f"not a projection table: {table}")
        with self._pool.connection() as conn:
            conn.execute(self._q(f"DROP TABLE IF EXISTS {{schema}}.{table}"))

    def recreate(self) -> None:
        with self._pool.connection() as conn:
            for stmt in DDL:
                conn.execute(self._q(stmt))

    def canonical_dump(self) -> bytes:
        """The projected tables in a canonical form (sorted rows, sorted keys; no ``gid`` and no
        stream positions, which an archive rebuild cannot know): rebuilt == live compares these bytes."""
        out: dict[str, list[Any]] = {}
        drop = {"gid", "stream_seq", "first_stream_seq", "last_stream_seq"}
        with self._pool.connection() as conn, conn.cursor() as cur:
            for table in PROJECTED:
                cur.execute(self._q(f"SELECT * FROM {{schema}}.{table}"))
                cols = [d.name for d in cur.description or ()]
                rows = [{c: v for c, v in zip(cols, r, strict=True) if c not in drop} for r in cur.fetchall()]
                out[table] = sorted(rows, key=sorted_json)
        return sorted_json(out)

    # -- reads (the event store's port) --------------------------------------------------------------

    def read(self, execution_id: str, after_sequence: int = 0, until: int | None = None) -> list[Event]:
        with self._pool.connection() as conn:
            rows = conn.execute(
                self._q(
                    "SELECT sequence, body FROM {schema}.event_projection WHERE execution_id = %s"
                    " AND sequence > %s AND sequence <= %s ORDER BY sequence"
                ),
                (execution_id, after_sequence, until if until is not None else 2**62),
            ).fetchall()
        return [e for seq, b in rows if (e := decode_body(b, f"{execution_id}#{seq}")) is not None]

    def read_chained(self, execution_id: str, after: int = 0) -> list[tuple[int, Event | None, bytes | None]]:
        with self._pool.connection() as conn:
            rows = conn.execute(
                self._q(
                    "SELECT sequence, body, hash FROM {schema}.event_projection"
                    " WHERE execution_id = %s AND sequence > %s ORDER BY sequence"
                ),
                (execution_id, after),
            ).fetchall()
        return [(int(s), decode_body(b, f"{execution_id}#{s}"), bytes.fromhex(h) if h else None)
                for s, b, h in rows]  # fmt: skip

    def tail(self, after_gid: int = 0, limit: int = 1000) -> list[StoredEvent]:
        with self._pool.connection() as conn:
            rows = conn.execute(
                self._q(
                    "SELECT gid, body FROM {schema}.event_projection WHERE gid > %s ORDER BY gid LIMIT %s"
                ),
                (after_gid, limit),
            ).fetchall()
        return [StoredEvent(int(g), e) for g, b in rows if (e := decode_body(b, f"gid {g}")) is not None]

    def tail_last(self) -> int:
        with self._pool.connection() as conn:
            row = conn.execute(
                self._q("SELECT COALESCE(MAX(gid), 0) FROM {schema}.event_projection")
            ).fetchone()
        return int(row[0]) if row else 0

    def executions(self, limit: int = 100) -> list[ExecutionInfo]:
        with self._pool.connection() as conn:
            rows = conn.execute(
                self._q(
                    "SELECT execution_id, playbook, status, started_at, finished_at, parent_execution_id,"
                    " last_sequence FROM {schema}.execution_projection"
                    " ORDER BY started_at DESC NULLS LAST LIMIT %s"
                ),
                (limit,),
            ).fetchall()
        return [ExecutionInfo(r[0], r[1], r[2] or "unknown", r[3], r[4], r[5], int(r[6])) for r in rows]

    def locate(self, execution_id: str) -> tuple[str, str, str, str, int] | None:
        """(tenant, project, region, shard, last projected sequence) of a projected execution."""
        with self._pool.connection() as conn:
            row = conn.execute(
                self._q(
                    "SELECT tenant_id, project_id, region, shard, last_sequence"
                    " FROM {schema}.execution_projection WHERE execution_id = %s"
                ),
                (execution_id,),
            ).fetchone()
        return (row[0], row[1], row[2], row[3], int(row[4])) if row else None

    def summary(self, execution_id: str) -> tuple[int, list[tuple[int, Any]]] | None:
        with self._pool.connection() as conn:
            rows = conn.execute(
                self._q(
                    "SELECT ord, last_sequence, body FROM {schema}.execution_summary"
                    " WHERE execution_id = %s ORDER BY ord"
                ),
                (execution_id,),
            ).fetchall()
        if not rows or rows[0][0] != 0:
            return None
        return int(rows[0][1]), [(int(r[0]), r[2]) for r in rows]

    def put_summary(
        self, execution_id: str, after: int | None, last: int, rows: list[tuple[int, str]]
    ) -> bool:
        with self._pool.connection() as conn, conn.transaction():
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"noetl-summary:{self.schema}:{execution_id}",)
            )
            got = conn.execute(
                self._q(
                    "SELECT last_sequence FROM {schema}.execution_summary WHERE execution_id = %s AND ord = 0"
                ),
                (execution_id,),
            ).fetchone()
            if (int(got[0]) if got else None) != after:  # written meanwhile: leave it
                return False
            conn.execute(
                self._q("DELETE FROM {schema}.execution_summary WHERE execution_id = %s"), (execution_id,)
            )
            with conn.cursor() as cur:
                cur.executemany(
                    self._q(
                        "INSERT INTO {schema}.execution_summary (execution_id, ord, last_sequence, body)"
                        " VALUES (%s, %s, %s, %s)"
                    ),
                    [(execution_id, n, last, b) for n, b in rows],
                )
        return True

    def stream_seq_of(self, execution_id: str, sequence: int) -> int | None:
        """The stream sequence the execution's event ``sequence`` came from (None: not projected, or rebuilt
        from an archive)."""
        with self._pool.connection() as conn:
            row = conn.execute(
                self._q(
                    "SELECT stream_seq FROM {schema}.event_projection WHERE execution_id = %s AND sequence = %s"
                ),
                (execution_id, sequence),
            ).fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def rows(self, table: str) -> list[tuple[Any, ...]]:
        if table not in PROJECTED + ("projection_checkpoint", "processed_event", "archive_manifest_index"):
            raise ValueError(f"not a projection table: {table}")
        with self._pool.connection() as conn:
            return conn.execute(self._q(f"SELECT * FROM {{schema}}.{table}")).fetchall()


def _task_row(tasks: dict[tuple[str, str, str, int], list[Any]], e: Event) -> None:
    """The task_projection row an event updates (last write per key in the batch wins, in order)."""
    if e.step is None or e.name not in (
        "task.started",
        "task.done",
        "step.started",
        "step.done",
        "step.failed",
    ):
        return
    is_task = e.name.startswith("task.")
    label = str(e.data.get("task") or "") if is_task else ""
    if e.iteration is not None:
        label = f"{label}[{e.iteration}]"
    key = (e.execution_id, e.step, label, int(e.attempt or (1 if is_task else 0)))
    done = e.name in ("task.done", "step.done", "step.failed")
    prev = tasks.get(key)
    started = prev[4] if prev else (None if done else e.timestamp)  # a start earlier in the batch
    status = ("error" if e.status == "error" or e.name == "step.failed" else "success") if done else "running"
    tasks[key] = [status, e.data.get("kind") if is_task else None, e.step_run_id,
                  e.task_run_id, started, e.timestamp if done else None, e.event_id]  # fmt: skip


def _resource_rows(out: list[tuple[Any, ...]], e: Event, record: dict[str, Any]) -> None:
    """A resource_index row per stored result reference ($ref) a finished task's outcome holds."""
    if e.name != "task.done":
        return
    for ref in iter_ref_dicts(e.data.get("outcome")):
        uri = str(ref.get("uri") or "")
        if not uri:
            continue
        checksum = str(ref.get("checksum") or "")
        out.append((uri, checksum or e.event_id, e.tenant_id, e.project_id, f"execution:{e.execution_id}",
                    "result", ref.get("content_type") or ref.get("format"),
                    checksum.removeprefix("sha256:") or None, ref.get("size"), record["region"],
                    record["shard"], "payload", sorted_json(ref).decode(), None))  # fmt: skip
