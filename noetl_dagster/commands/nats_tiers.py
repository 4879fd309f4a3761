"""projector / archiver / retention: the consumers of the NATS event streams (docs/events.md "Three tiers").

Each runs as its own process (one per consumer kind; restartable: the projector's durable consumer,
the archiver's checkpoint on the archive-ack stream and the retention controller's inputs all live on
the servers). ``--store`` is the ``nats://`` event-store URL (default ``$NOETL_EVENT_STORE_URL``).
Shards: ``--shard`` (repeatable), or ``--tenant``/``--project`` (their shard), else every event stream
of the region that exists when the process starts.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import click

from noetl_dagster.commands.errors import EXIT_BAD_INPUT, EXIT_FAILED
from noetl_dagster.util.jsonutil import dumps

_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _seconds(text: str) -> float:
    t = text.strip().lower()
    try:
        return float(t[:-1]) * _DURATION[t[-1]] if t and t[-1] in _DURATION else float(t)
    except ValueError:
        _fail(f"--min-age {text!r}: use seconds or a number with s, m, h or d (e.g. 6h)")
    return 0.0


def _setup(
    store: str | None, shards: tuple[str, ...], tenant: str | None, project: str | None
) -> tuple[str, list]:
    from noetl_dagster.storage.nats_events import parse_nats_url  # noqa: PLC0415
    from noetl_dagster.storage.nats_streams import Placement, StreamLayoutError, connect  # noqa: PLC0415

    url = store or os.environ.get("NOETL_EVENT_STORE_URL") or ""
    if not url.startswith(("nats://", "tls://")):
        _fail(
            f"--store {url.split('?')[0] or '(none)'!r}: a nats://…?projection=postgresql… event store URL is needed"
        )
    try:
        config = parse_nats_url(url)
        if tenant or project:
            placements = [config.placement(tenant or "default", project or "default")]
        else:
            region = config.region or os.environ.get("NOETL_REGION") or "local"
            cell = config.cell or f"{region}-a"
            names = list(shards)
            if not names:
                prefix = f"NOETL_EVT_{region}_"
                with connect(config.nats_url, name="noetl-discover") as client:
                    names = [n[len(prefix) :] for n in client.call(client.event_stream_names(region))]
            placements = [Placement(region=region, cell=cell, shard=s) for s in names]
    except (ValueError, StreamLayoutError, ConnectionError) as e:
        _fail(str(e))
    if not placements:
        _fail("no event streams in the region yet: name --shard or --tenant/--project")
    return url, placements


def _stop_flag() -> list[bool]:
    flag = [False]

    def stop(*_a: Any) -> None:
        flag[0] = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return flag


_store_opt = click.option("--store", help="The nats:// event store URL (default $NOETL_EVENT_STORE_URL).")
_shard_opt = click.option("--shard", "shards", multiple=True, help="A logical shard (s0042); repeatable.")
_tenant_opt = click.option("--tenant", help="Serve this tenant's shard (with --project).")
_project_opt = click.option("--project", help="Serve this project's shard (with --tenant).")


@click.command()
@_store_opt
@_shard_opt
@_tenant_opt
@_project_opt
@click.option("--batch", default=256, show_default=True, help="Events per transaction.")
@click.option("--once", is_flag=True, help="Apply what the streams hold, then exit.")
@click.option("--rebuild", type=click.Choice(["stream", "archive"]),
              help="Empty the projection and refill it from the stream, or from the archive bundles alone.")  # fmt: skip
@click.option("--payload", help="Payload store of the archive (default: the store URL's payload=).")
def projector(store: str | None, shards: tuple[str, ...], tenant: str | None, project: str | None, batch: int,
              once: bool, rebuild: str | None, payload: str | None) -> None:  # fmt: skip
    """Keep the Postgres projections of the NATS event streams (warm tier)."""
    from noetl_dagster.storage import nats_consumers as nc  # noqa: PLC0415

    url, placements = _setup(store, shards, tenant, project)
    if rebuild == "stream":
        n = sum(nc.rebuild_from_stream(url, p) for p in placements)
        click.echo(f"rebuilt from the stream: {n} events")
        return
    if rebuild == "archive":
        from noetl_dagster.storage.nats_events import parse_nats_url  # noqa: PLC0415

        where = payload or parse_nats_url(url).payload_url
        if not where:
            _fail("--rebuild archive needs --payload or payload= in the store URL")
        bundles = nc.archive_bundles(where)
        n = nc.rebuild_from_archive(url, bundles)
        click.echo(f"rebuilt from {len(bundles)} archive bundle(s): {n} events")
        return
    try:
        proj = nc.Projector(url, placements, batch=batch)
    except ConnectionError as e:
        _fail(str(e), EXIT_FAILED)
    flag = _stop_flag()
    try:
        if once:
            click.echo(f"projected {proj.drain()} events")
        else:
            proj.run(lambda: flag[0])
    finally:
        proj.close()


@click.command()
@_store_opt
@_shard_opt
@_tenant_opt
@_project_opt
@click.option("--payload", help="Payload store for the bundles (default: the store URL's payload=).")
@click.option("--once", is_flag=True, help="Archive what the streams hold, then exit.")
def archiver(store: str | None, shards: tuple[str, ...], tenant: str | None, project: str | None,
             payload: str | None, once: bool) -> None:  # fmt: skip
    """Write finished executions from the NATS event streams to archive bundles (cold tier)."""
    from noetl_dagster.storage import nats_consumers as nc  # noqa: PLC0415

    url, placements = _setup(store, shards, tenant, project)
    try:
        workers = [nc.Archiver(url, p, payload_url=payload) for p in placements]
    except (ValueError, ConnectionError) as e:
        _fail(str(e))
    flag = _stop_flag()
    try:
        if once:
            for w in workers:
                w.drain()
                click.echo(dumps({"shard": w.placement.shard, "archived_through": w.archived_through,
                                  "archived": w.archived}))  # fmt: skip
            return
        while not flag[0]:
            for w in workers:
                w.step(1.0)
    finally:
        for w in workers:
            w.close()


@click.command()
@_store_opt
@_shard_opt
@_tenant_opt
@_project_opt
@click.option(
    "--min-age", default="24h", show_default=True, help="Keep events younger than this (s, m, h, d)."
)
@click.option("--require", "required", multiple=True, default=("state",), show_default=True,
              help="Projections whose checkpoint must have passed a range; repeatable.")  # fmt: skip
@click.option("--interval", default=60.0, show_default=True, help="Seconds between passes.")
@click.option("--once", is_flag=True, help="One pass, then exit.")
@click.option("--dry-run", is_flag=True, help="Print the bounds; evict nothing.")
def retention(store: str | None, shards: tuple[str, ...], tenant: str | None, project: str | None, min_age: str,
              required: tuple[str, ...], interval: float, once: bool, dry_run: bool) -> None:  # fmt: skip
    """Evict archived, projected, old event-stream ranges no running execution needs."""
    from noetl_dagster.storage import nats_consumers as nc  # noqa: PLC0415

    url, placements = _setup(store, shards, tenant, project)
    age = _seconds(min_age)
    ctl = [nc.Retention(url, p, min_age_s=age, required=required) for p in placements]
    flag = _stop_flag()
    try:
        while True:
            for c in ctl:
                report = c.bound() if dry_run else c.enforce()
                click.echo(dumps({"stream": c.placement.events_stream, **report}))
            if once or dry_run or flag[0]:
                return
            end = time.monotonic() + interval
            while time.monotonic() < end and not flag[0]:
                time.sleep(0.2)
    finally:
        for c in ctl:
            c.close()
