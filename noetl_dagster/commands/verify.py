"""verify: check an execution's hash chain in the event store, or an archive bundle (issue 41)."""

from __future__ import annotations

import sys
from typing import Any

import click

from noetl_dagster.commands.core import EXIT_FAILED, EXIT_OK, _fail_input
from noetl_dagster.util.jsonutil import dumps


@click.command()
@click.argument("execution_id", required=False)
@click.option("--archive", "archive_uri", help="Verify an execution archive bundle instead (its URI).")
@click.option("--event-store", help="Event store URL (default $NOETL_DAGSTER_HOME/events.db).")
@click.option("--data-dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True)
def verify(execution_id: str | None, archive_uri: str | None, event_store: str | None, data_dir: str | None,
           as_json: bool) -> None:  # fmt: skip
    """Check an execution's tamper-evident event log (or an archive): OK and its head hash, or the first bad event."""
    from noetl_dagster.engine.chain import ChainBroken, LogTampered  # noqa: PLC0415

    if bool(execution_id) == bool(archive_uri):
        _fail_input("give an EXECUTION_ID or --archive URI (one of them)")
    try:
        if archive_uri:
            from noetl_dagster.storage.archive import verify_archive  # noqa: PLC0415

            report: dict[str, Any] = verify_archive(archive_uri)
            line = _archive_line(report)
        else:
            from noetl_dagster.engine.replay import verify_chain  # noqa: PLC0415
            from noetl_dagster.storage.event_stores import open_event_store  # noqa: PLC0415

            try:
                chain, _events = verify_chain(
                    open_event_store(event_store, data_dir=data_dir), str(execution_id)
                )
            except KeyError as e:
                _fail_input(str(e.args[0]))
            chain.raise_if_broken()
            report = chain.to_json()
            line = _chain_line(report)
    except LogTampered as e:
        msg = str(e).strip().splitlines()[0]
        if as_json:
            out = {"status": "broken", "error": msg}
            if isinstance(e, ChainBroken):
                out.update(execution_id=e.execution_id, sequence=e.sequence, reason=e.reason)
            click.echo(dumps(out))
        click.echo(f"error: {msg}", err=True)
        sys.exit(EXIT_FAILED)
    click.echo(dumps(report) if as_json else line)
    sys.exit(EXIT_OK)


def _chain_line(r: dict[str, Any]) -> str:
    if r["status"] == "unchained":
        return f"unchained: execution {r['execution_id']}: {r['events']} events written before the hash chain"
    since = f", chained from sequence {r['chained_from']}" if r.get("chained_from", 1) != 1 else ""
    return f"OK: execution {r['execution_id']}: {r['events']} events, head {r['head']}{since}"


def _archive_line(r: dict[str, Any]) -> str:
    heads = ", ".join(f"{x['execution_id']} head {x.get('head') or '(unchained)'}" for x in r["executions"])
    return f"OK: archive {r['uri']}: signature {r['signature']}; {heads}"
