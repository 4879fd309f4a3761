"""The local mode's commands (issue 46): ``run``'s local path and ``push`` of a local execution."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import click

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2  # as commands.core (which imports this module)


def _fail_input(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def _push_url(event_store: str | None) -> str | None:
    return event_store or os.environ.get("NOETL_EVENT_STORE_URL") or None


def run_local(
    pb: Any, overrides: Mapping[str, Any], *, event_store: str | None, data_dir: str | None,
    catalog_dirs: Iterable[str], tenant: str, project: str, on_step: Callable[[Any], None],
    execution_id: str, offline: bool,
) -> Any:  # fmt: skip
    """Run in the local mode: events under <data dir>/local/<execution_id>/, flushed at exit and
    before side effects; pushed at exit to the configured event store unless ``offline``."""
    from noetl_dagster.engine.ports import ExecutionLeased
    from noetl_dagster.runners.local import run_playbook
    from noetl_dagster.storage.event_stores import open_event_store
    from noetl_dagster.storage.local_mode import open_local_run

    url = _push_url(event_store)
    store = open_local_run(url, data_dir, lambda u: open_event_store(u, data_dir=data_dir))
    try:
        try:  # held while it runs: a `resume` of a running execution is refused (issue 14.7)
            store.local.acquire_lease(execution_id)
        except ExecutionLeased as e:
            _fail_input(str(e))
        result = run_playbook(
            pb, overrides, event_store=store, data_dir=data_dir, catalog_dirs=catalog_dirs, tenant=tenant,
            project=project, on_step=on_step, logger=lambda m: None, execution_id=execution_id,
        )  # fmt: skip
    finally:
        written = sorted(store.local.written)
        try:
            store.local.close()  # the exit flush (fsync'd) and the lease released
        except OSError as e:  # a full disk: the log ends at its last whole batch; say so, exit 1
            click.echo(f"error: execution {execution_id}: its last events could not be written to "
                       f"{store.local.root / execution_id} ({e.strerror or e}); resume it once there is room",
                       err=True)  # fmt: skip
            sys.exit(EXIT_FAILED)
    if url and not offline and written:
        _push_or_fail(store.local, [execution_id, *(w for w in written if w != execution_id)], url, data_dir)
        result.event_store_url = url
    return result


def _push_or_fail(local: Any, ids: list[str], url: str, data_dir: str | None) -> int:
    from noetl_dagster.engine.chain import LogTampered
    from noetl_dagster.storage.event_stores import open_event_store
    from noetl_dagster.storage.local_mode import PushRefused, push

    try:
        target = open_event_store(url, data_dir=data_dir)
    except ValueError as e:
        _fail_input(str(e))
    try:
        return push(local, ids, target)
    except (PushRefused, LogTampered) as e:
        click.echo(f"error: push refused: {e}", err=True)
        sys.exit(EXIT_FAILED)
    except Exception as e:  # noqa: BLE001 - the store is down: the execution stays local, said once
        click.echo(f"error: could not push execution {ids[0]} to {url} ({type(e).__name__}: {e}); it is kept "
                   f"under {local.root / ids[0]}; run `noetl-dagster push {ids[0]}` later", err=True)  # fmt: skip
        sys.exit(EXIT_FAILED)
    finally:
        target.close()


@click.command("push")
@click.argument("execution_id")
@click.option("--event-store", help="Event store URL to push to (default $NOETL_EVENT_STORE_URL, else "
              "SQLite <data dir>/events.db).")  # fmt: skip
@click.option("--data-dir", type=click.Path(file_okay=False))
def push_command(execution_id: str, event_store: str | None, data_dir: str | None) -> None:
    """Append a local execution (run's default) to the event store in one transaction.

    Its sub-playbook executions go with it. Pushing twice changes nothing; an altered local log
    (a broken hash chain) is refused and nothing is written."""
    from noetl_dagster.engine.ports import ExecutionLeased
    from noetl_dagster.storage.feather_events import FeatherEventStore
    from noetl_dagster.storage.local_mode import family, local_root

    local = FeatherEventStore(local_root(data_dir), idle_seconds=0)
    if not local.has(execution_id):
        _fail_input(f"no local execution {execution_id} under {local.root}")
    try:
        local.acquire_lease(execution_id)  # not while it still runs (or is being resumed)
    except ExecutionLeased as e:
        _fail_input(str(e))
    try:
        url = _push_url(event_store)
        if url is None:
            home = data_dir or os.environ.get("NOETL_DAGSTER_HOME", ".noetl")
            url = f"sqlite:///{os.path.join(home, 'events.db')}"
        ids = family(local, execution_id)
        n = _push_or_fail(local, ids, url, data_dir)
    finally:
        local.close()
    click.echo(
        f"pushed execution {execution_id} ({n} events{f', {len(ids) - 1} sub-executions' if len(ids) > 1 else ''}) to {url}"
    )
    sys.exit(EXIT_OK)
