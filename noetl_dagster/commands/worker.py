"""worker: a pool worker pulling tool commands from NATS JetStream (issue 45, runners/pool_worker.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import click

from noetl_dagster.commands.core import EXIT_OK, _fail_input

HELP = "Pull tool commands from the NATS command streams and run them (the worker pool)."


@click.command(help=HELP)
@click.option("--nats", "nats_url", help="NATS server (default $NOETL_NATS_URL, else nats://127.0.0.1:4222).")
@click.option("--event-store", help="The executions' event store URL (default $NOETL_EVENT_STORE_URL).")
@click.option(
    "--data-dir", type=click.Path(file_okay=False), help="Data directory (payloads of spilled results)."
)
@click.option("--region", help="Region whose command streams to serve (default $NOETL_REGION, else local).")
@click.option("--shard", "shards", multiple=True,
              help="A shard (s0042) or TENANT/PROJECT (its shard) to serve; repeatable. Default: every "
                   "command stream of the region.")  # fmt: skip
@click.option("--concurrency", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Commands one process runs at once.")  # fmt: skip
@click.option("--processes", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Worker processes to start (each with --concurrency).")  # fmt: skip
@click.option("--ack-wait", type=click.FloatRange(1, 3600), default=30.0, show_default=True,
              help="Seconds a command stays with a worker that stopped heartbeating before redelivery.")  # fmt: skip
@click.option("--max-deliver", type=click.IntRange(1, 1000), default=5, show_default=True,
              help="Deliveries before a command goes to the dead-letter stream.")  # fmt: skip
def worker(nats_url: str | None, event_store: str | None, data_dir: str | None, region: str | None,
           shards: tuple[str, ...], concurrency: int, processes: int, ack_wait: float, max_deliver: int) -> None:  # fmt: skip
    nats_url = nats_url or os.environ.get("NOETL_NATS_URL") or "nats://127.0.0.1:4222"
    _check_url(nats_url)
    from noetl_dagster.storage import nats_streams as streams  # noqa: PLC0415

    region = region or streams.default_region()
    try:
        shard_ids = [_shard(s, streams) for s in shards]
        streams.Placement(region, f"{region}-a", shard_ids[0] if shard_ids else "s0000")  # names it can form
    except ValueError as e:
        _fail_input(str(e))
    if processes > 1:
        args = [f"--nats={nats_url}", f"--region={region}", f"--concurrency={concurrency}",
                f"--ack-wait={ack_wait}", f"--max-deliver={max_deliver}", *(f"--shard={s}" for s in shard_ids),
                *([f"--event-store={event_store}"] if event_store else []),
                *([f"--data-dir={data_dir}"] if data_dir else [])]  # fmt: skip
        sys.exit(_supervise(processes, args))
    from noetl_dagster.runners.pool_worker import PoolWorker  # noqa: PLC0415

    try:
        pool = PoolWorker(nats_url, event_store, region=region, shards=shard_ids, concurrency=concurrency,
                          ack_wait=ack_wait, max_deliver=max_deliver, data_dir=data_dir,
                          log=lambda line: click.echo(f"worker: {line}", err=True))  # fmt: skip
    except ConnectionError as e:
        _fail_input(f"cannot reach NATS: {str(e).splitlines()[0]}")
    signal.signal(signal.SIGTERM, lambda *_: pool.stop.set())
    signal.signal(signal.SIGINT, lambda *_: pool.stop.set())
    bound = pool.bind()
    click.echo(f"worker {pool.worker_id}: region {region}, concurrency {concurrency}, "
               f"streams {', '.join(bound) or '(none yet: bound as they appear)'}", err=True)  # fmt: skip
    counts = pool.run()
    click.echo(
        f"worker {pool.worker_id}: stopped ({', '.join(f'{k} {v}' for k, v in counts.items())})", err=True
    )
    sys.exit(EXIT_OK)


def _check_url(url: str) -> None:
    """A URL the client can use, and a server listening there (nats-py retries a refused first
    connection for seconds, logging a traceback each time: a plain TCP probe answers in one line)."""
    parts = urlsplit(url)
    try:
        port = parts.port or 4222
        ok = parts.scheme in ("nats", "tls") and bool(parts.hostname)
    except ValueError:
        ok = False
    if not ok:
        _fail_input(f"--nats {url!r}: use nats://host:port")
    try:
        socket.create_connection((parts.hostname, port), timeout=5).close()
    except OSError as e:
        _fail_input(f"cannot reach NATS at {parts.hostname}:{port}: {e.strerror or type(e).__name__}")


def _shard(value: str, streams: Any) -> str:
    if "/" in value:
        tenant, _, project = value.partition("/")
        return streams.shard_of(tenant, project)
    if not (len(value) == 5 and value[0] == "s" and value[1:].isdigit()):
        raise ValueError(f"--shard {value!r}: a shard is s0000..s9999, or TENANT/PROJECT")
    return value


def _supervise(processes: int, args: list[str]) -> int:
    """Start ``processes`` single-process workers with ``args``; SIGTERM/SIGINT reach them all."""
    cmd = [sys.executable, "-m", "noetl_dagster.commands.main", "worker", *args]
    children = [subprocess.Popen(cmd) for _ in range(processes)]

    def forward(signum: int, _frame: Any) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while any(c.poll() is None for c in children):
        time.sleep(0.2)
    return max(c.returncode or 0 for c in children)
