"""``noetl-dagster dashboard [render options] | serve | export | demo-history``.

``dashboard`` alone (or with the render options) renders the static matplotlib pages as
before; ``serve`` runs the interactive Plotly dashboard over ClickHouse queries, ``export``
writes the same page with its data inlined, ``demo-history`` fills the facts store with a
clearly labelled SYNTHETIC 30-day history for several tenants.
"""

from __future__ import annotations

from pathlib import Path

import click

from noetl_dagster.commands.facts import _fail_input, _refresh, _store, common
from noetl_dagster.commands.facts import dashboard as render_command


class _DashboardGroup(click.Group):
    """Subcommands, and the render options directly (``dashboard --out DIR``) as before."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h")):
            args = ["render", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_DashboardGroup)
def dashboard() -> None:
    """Cost dashboards: render (static PNG/HTML), serve (interactive), export, demo-history."""


dashboard.add_command(render_command, "render")


@dashboard.command()
@common
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8765, show_default=True)
@click.option("--prices", type=click.Path(dir_okay=False), help="Price table to load before serving.")
@click.option("--no-refresh", is_flag=True, help="Serve what the rollups hold; do not refresh them first.")
def serve(clickhouse: str | None, data_dir: str | None, database: str | None, host: str, port: int,
          prices: str | None, no_refresh: bool) -> None:  # fmt: skip
    """Serve the interactive cost dashboard (filters, drill-down) until interrupted."""
    from analytics.interactive import make_server  # noqa: PLC0415

    store = _store(clickhouse, data_dir, database)
    if not no_refresh:
        _refresh(store, prices, data_dir)
    try:
        server = make_server(store, host, port)
    except OSError as e:
        _fail_input(f"cannot listen on {host}:{port}: {e.strerror or e}")
    click.echo(f"dashboard: http://{host}:{server.server_address[1]}/", err=False)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@dashboard.command("export")
@common
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Output directory (writes cost.html).")
@click.option("--prices", type=click.Path(dir_okay=False))
def export_cmd(clickhouse: str | None, data_dir: str | None, database: str | None, out: str, prices: str | None) -> None:
    """Write the interactive dashboard as one self-contained HTML file (data inlined)."""
    from analytics.interactive import export_static  # noqa: PLC0415

    store = _store(clickhouse, data_dir, database)
    _refresh(store, prices, data_dir)
    click.echo(f"dashboard: {export_static(store, Path(out))}")


@dashboard.command("demo-history")
@common
@click.option("--days", type=int, default=30, show_default=True)
@click.option("--per-day", type=int, default=4000, show_default=True, help="Candidate task attempts per day.")
@click.option("--tenants", type=int, default=4, show_default=True)
def demo_history(clickhouse: str | None, data_dir: str | None, database: str | None, days: int, per_day: int,
                 tenants: int) -> None:  # fmt: skip
    """Fill the facts store with a SYNTHETIC history (tenants `synthetic-*`, project `demo`)."""
    from analytics.demo_history import generate_history  # noqa: PLC0415

    store = _store(clickhouse, data_dir, database)
    try:
        n = generate_history(store, days=days, per_day=per_day, tenants=tenants)
    except ValueError as e:
        _fail_input(str(e))
    click.echo(f"SYNTHETIC demo history: {n} task attempts over {days} days for {tenants} tenants (synthetic-*)")
