"""``noetl-dagster facts export|query|refresh`` and ``noetl-dagster dashboard``.

Facts live in ClickHouse: embedded chdb under ``$NOETL_DAGSTER_HOME/facts`` by
default, or a server given with ``--clickhouse`` / ``$NOETL_CLICKHOUSE_URL``.
Exit codes: 0 ok, 2 bad input (URL, SQL, price table).
"""

from __future__ import annotations

import json
import sys
from datetime import date
from pathlib import Path
from typing import Any

import click

EXIT_BAD_INPUT = 2


def _fail_input(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def _fail_query(message: str) -> None:
    if "(READONLY)" in message:
        _fail_input("facts query is read-only: it runs SELECT/SHOW/DESCRIBE, not writes or DDL")
    _fail_input(message)


def _store(clickhouse: str | None, data_dir: str | None, database: str | None) -> Any:
    from noetl_analytics.store import FactsStore, FactsStoreError  # noqa: PLC0415 - keep --help fast

    try:
        return FactsStore(clickhouse, data_dir=data_dir, database=database)
    except FactsStoreError as e:
        _fail_input(str(e))


def _events(events: str | None, data_dir: str | None) -> Any:
    from noetl_dagster.storage.event_stores import open_event_store

    try:
        return open_event_store(events, data_dir=data_dir)
    except Exception as e:  # noqa: BLE001 - any open failure is bad input for the CLI
        _fail_input(f"cannot open the event log {events or '(default)'}: {e}")


_common = [
    click.option(
        "--clickhouse",
        help="Facts store: chdb:///dir or http(s)://user:pass@host:8123 (default: embedded chdb).",
    ),
    click.option(
        "--data-dir",
        type=click.Path(file_okay=False),
        help="Data directory (default $NOETL_DAGSTER_HOME or ./.noetl).",
    ),
    click.option("--database", help="ClickHouse database for the facts (default noetl)."),
]


def common(fn: Any) -> Any:
    for option in reversed(_common):
        fn = option(fn)
    return fn


@click.group()
def facts() -> None:
    """Event-log facts in ClickHouse: export, query, refresh the cost rollups."""


@facts.command()
@common
@click.option(
    "--events", "--event-store", "events_url", help="Event log URL (default: the local SQLite log)."
)
@click.option("--batch", default=20_000, show_default=True, help="Events per Arrow batch.")
@click.option(
    "--prices", type=click.Path(dir_okay=False), help="Price table for a store that has none loaded yet."
)
@click.option("--json", "as_json", is_flag=True, help="Print the export report as JSON.")
def export(
    clickhouse: str | None,
    data_dir: str | None,
    database: str | None,
    events_url: str | None,
    batch: int,
    prices: str | None,
    as_json: bool,
) -> None:
    """Export events newer than the stored cursor as facts (idempotent by event id).

    When a `dashboard serve` holds the embedded store, the export runs in that process."""
    from noetl_analytics.export_handoff import export_facts  # noqa: PLC0415
    from noetl_analytics.store import FactsStoreError  # noqa: PLC0415

    if batch <= 0:
        _fail_input("--batch must be positive")
    table = _prices(prices, data_dir)
    _events(events_url, data_dir).close()  # a bad URL fails here, with the usual message
    try:
        report = export_facts(clickhouse, database=database, events_url=events_url, data_dir=data_dir,
                              prices=table, batch_events=batch)  # fmt: skip
    except FactsStoreError as e:
        _fail_input(str(e))
    if as_json:
        click.echo(json.dumps(report))
        return
    rows = ", ".join(f"{k}={v}" for k, v in report["rows"].items() if v)
    click.echo(
        f"exported {report['events']} events (cursor {report['cursor_before']} -> {report['cursor_after']})"
        f" in {report['seconds']:.2f}s; facts: {rows or 'none'}; lag: {report['lag_events']} events"
    )
    click.echo(f"exported by {report['exported_by']}")


@facts.command()
@click.argument("sql")
@common
@click.option("--json", "as_json", is_flag=True, help="Print the rows as a JSON list of objects.")
def query(
    sql: str, clickhouse: str | None, data_dir: str | None, database: str | None, as_json: bool
) -> None:
    """Run a read-only SQL query against the facts store (`$db` stands for the facts database).

    When a `dashboard serve` holds the embedded store, the query runs in that process."""
    from noetl_analytics.export_handoff import on_store, query_into  # noqa: PLC0415
    from noetl_analytics.store import FactsStoreError  # noqa: PLC0415

    request = {"sql": sql}
    try:
        done = on_store("query", request, lambda store: query_into(store, request), url=clickhouse,
                        database=database, data_dir=data_dir)  # fmt: skip
    except FactsStoreError as e:
        _fail_query(str(e))
    except Exception as e:  # noqa: BLE001 - ClickHouse's error for the SQL: its first line, exit 2
        _fail_query(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
    columns, rows = done["columns"], done["rows"]
    if as_json:
        click.echo(json.dumps([dict(zip(columns, r, strict=True)) for r in rows]))
        return
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    table = Table(*columns, show_lines=False)
    for r in rows:
        table.add_row(*("" if v is None else str(v) for v in r))
    Console().print(table)
    click.echo(f"{len(rows)} row(s)")


@facts.command()
@common
@click.option(
    "--prices",
    type=click.Path(dir_okay=False),
    help="Price table (YAML/JSON); default analytics/noetl_analytics/prices.yaml.",
)
@click.option("--json", "as_json", is_flag=True)
def refresh(
    clickhouse: str | None, data_dir: str | None, database: str | None, prices: str | None, as_json: bool
) -> None:
    """Re-price every day of the priced table cost_line_day (every cost view reads it) with the price table.

    When a `dashboard serve` holds the embedded store, the refresh runs in that process."""
    from noetl_analytics.export_handoff import on_store, price_file, refresh_into  # noqa: PLC0415
    from noetl_analytics.store import FactsStoreError  # noqa: PLC0415

    request = {"prices": price_file(_prices(prices, data_dir))}
    try:
        done = on_store("refresh", request, lambda store: refresh_into(store, request, data_dir), url=clickhouse,
                        database=database, data_dir=data_dir)  # fmt: skip
    except FactsStoreError as e:
        _fail_input(str(e))
    report = done["report"]
    if as_json:
        click.echo(json.dumps(report))
    else:
        click.echo(
            f"cost lines: {report['rows']} rows, total {report['total']:.9f} {report['currency']}"
            f" over {report['tenants']} tenant(s); prices {report['prices']}"
        )


def _prices(prices: str | None, data_dir: str | None) -> Any:
    from noetl_analytics.pricing import PriceConfigError, PriceTable  # noqa: PLC0415

    try:
        return PriceTable.load(prices, data_dir=data_dir)
    except PriceConfigError as e:
        _fail_input(str(e))


def _refresh(store: Any, prices: str | None, data_dir: str | None) -> Any:
    from noetl_analytics.rollups import refresh_rollups  # noqa: PLC0415

    return refresh_rollups(store, _prices(prices, data_dir))


def _day_arg(value: str | None, flag: str) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        _fail_input(f"{flag} must be a date (YYYY-MM-DD), got {value!r}")
    return None


@facts.command("focus-export")
@common
@click.option("--out", required=True, type=click.Path(), help="Output file (.csv or .parquet).")
@click.option("--format", "fmt", type=click.Choice(["csv", "parquet"]), help="Default: from the file suffix.")
@click.option("--start", help="First day (YYYY-MM-DD, UTC); default: the first priced day.")
@click.option("--end", help="Last day (YYYY-MM-DD, UTC), inclusive; default: the last priced day.")
@click.option("--tenant", help="Only this tenant's charges (the file can go to that tenant).")
@click.option("--project", help="With --tenant: only this project's charges.")
@click.option(
    "--all-tenants", is_flag=True, help="Every tenant's charges, idle and shared included (operators)."
)
def focus_export(
    clickhouse: str | None,
    data_dir: str | None,
    database: str | None,
    out: str,
    fmt: str | None,
    start: str | None,
    end: str | None,
    tenant: str | None,
    project: str | None,
    all_tenants: bool,
) -> None:
    """Chargeback export of the priced table in the FinOps FOCUS column format (CSV or Parquet), of
    one tenant (--tenant) or, for an operator, of all (--all-tenants)."""
    from noetl_analytics.dashboard_access import viewer_of  # noqa: PLC0415
    from noetl_analytics.focus import FocusExportError, focus_table, write_focus  # noqa: PLC0415

    try:
        viewer = viewer_of(tenant, project, all_tenants)
    except ValueError as e:
        _fail_input(str(e))
    first, last = _day_arg(start, "--start"), _day_arg(end, "--end")
    store = _store(clickhouse, data_dir, database)
    try:
        table = focus_table(store, first, last, viewer=viewer)
        path = write_focus(table, out, fmt)
    except FocusExportError as e:
        _fail_input(str(e))
    total = sum(v for v in table.column("BilledCost").to_pylist())
    currency = (table.column("BillingCurrency").to_pylist() or [""])[0]
    click.echo(f"FOCUS export: {table.num_rows} rows, BilledCost {total:.9f} {currency} -> {path}")


@click.command()
@common
@click.option(
    "--out", type=click.Path(file_okay=False), help="Output directory (default <data dir>/dashboard)."
)
@click.option(
    "--events", "--event-store", "events_url", help="Event log to export first (default: the local log)."
)
@click.option(
    "--no-export", is_flag=True, help="Render what the store holds; do not export new events first."
)
@click.option("--prices", type=click.Path(dir_okay=False), help="Price table for the cost rollups.")
@click.option("--days", type=int, help="Only the last N days (default: all time).")
@click.option("--title", default="NoETL facts", show_default=True)
@click.option(
    "--tenant", default=None, help="Render only this tenant's rows (the page can go to that tenant)."
)
@click.option("--project", default=None, help="With --tenant: only this project's rows.")
@click.option("--all-tenants", is_flag=True, help="Render every tenant's rows (operators only).")
def dashboard(
    clickhouse: str | None,
    data_dir: str | None,
    database: str | None,
    out: str | None,
    events_url: str | None,
    no_export: bool,
    prices: str | None,
    days: int | None,
    title: str,
    tenant: str | None,
    project: str | None,
    all_tenants: bool,
) -> None:
    """Render the facts dashboard: index.html (self-contained) and one PNG per panel, of one
    tenant's rows (--tenant) or, for an operator, of every tenant's (--all-tenants)."""
    from noetl_analytics.dashboard import render_dashboard  # noqa: PLC0415
    from noetl_analytics.dashboard_access import viewer_of  # noqa: PLC0415
    from noetl_analytics.exporter import FactExporter  # noqa: PLC0415
    from noetl_dagster.runners.local import default_data_dir  # noqa: PLC0415

    try:
        viewer = viewer_of(tenant, project, all_tenants)
    except ValueError as e:
        _fail_input(str(e))
    if days is not None and days <= 0:
        _fail_input("--days must be positive")
    table = _prices(prices, data_dir)  # a bad price file is one line before anything is written
    store = _store(clickhouse, data_dir, database)
    if not no_export:
        log = _events(events_url, data_dir)
        try:
            report = FactExporter(store, log, prices=table).export()
        finally:
            log.close()
        click.echo(f"exported {report.events} new events")
    from noetl_analytics.rollups import refresh_rollups  # noqa: PLC0415

    rollup = refresh_rollups(store, table)
    out_dir = Path(out) if out else Path(data_dir or default_data_dir()) / "dashboard"
    result = render_dashboard(store, out_dir, viewer=viewer, days=days, title=title, currency=rollup.currency)
    click.echo(f"dashboard: {result.html} ({viewer.name})")
    for png in result.pngs:
        click.echo(f"  {png}")
