"""``noetl-dagster dashboard [render options] | serve | export | grafana | demo-history``.

``dashboard`` alone (or with the render options, ``--tenant T`` or ``--all-tenants`` among them)
renders the static matplotlib pages; ``grafana`` writes the Grafana JSON of one tenant or all;
``serve`` runs the interactive Plotly dashboard over ClickHouse queries (signed in with
registry API keys, each key seeing its tenant's rows), ``export`` writes the same page with one
tenant's data (or, ``--all-tenants``, everyone's) inlined, ``demo-history`` fills the facts store with a
clearly labelled SYNTHETIC 30-day history for several tenants.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
@click.option(
    "--registry",
    "registry_url",
    default=None,
    help="Registry whose API keys sign in: a DB URL or path, or http(s)://… of `noetl-registry serve` "
    "(default: $NOETL_REGISTRY_URL, else $NOETL_DAGSTER_HOME/registry.db).",
)
@click.option(
    "--admin-tenant",
    "admin_tenants",
    multiple=True,
    envvar="NOETL_DASHBOARD_ADMIN_TENANT",
    help="Keys of this tenant (not project-scoped) see every tenant and the cluster view; repeatable.",
)
@click.option("--secure-cookie", is_flag=True, help="Mark the session cookie Secure (serving behind HTTPS).")
@click.option(
    "--event-store",
    help="Event store of the execution pages /executions/<id> and /diff "
    "(default: $NOETL_EVENT_STORE_URL, else <data dir>/events.db).",
)
@click.option(
    "--warm",
    type=click.IntRange(0, 10_000),
    default=20,
    show_default=True,
    help="Write the execution summaries of this many recent executions recorded without one "
    "(before summaries), in the background.",
)
@click.option(
    "--export-every",
    type=click.FloatRange(0, 86_400),
    default=15,
    show_default=True,
    help="Export the event store's new events into the facts every this many seconds (0: never; "
    "exports handed over by `facts export` and the Dagster sensor run either way).",
)
def serve(clickhouse: str | None, data_dir: str | None, database: str | None, host: str, port: int,
          prices: str | None, no_refresh: bool, registry_url: str | None, admin_tenants: tuple[str, ...],
          secure_cookie: bool, event_store: str | None, warm: int, export_every: float) -> None:  # fmt: skip
    """Serve the interactive cost dashboard (filters, drill-down) until interrupted.

    Every page and API request needs a registry API key (Authorization: Bearer <key>, or sign in
    at /login or /?key=<key> for an HttpOnly session cookie); each key sees its own tenant's rows.
    On the embedded store it is the store's owner: `facts export` and the Dagster export runs hand
    their exports to it, and it exports new events itself every --export-every seconds."""
    from noetl_analytics.dashboard_access import KeyAuth  # noqa: PLC0415
    from noetl_analytics.interactive import make_server  # noqa: PLC0415
    from noetl_analytics.store_owner import set_process_kind  # noqa: PLC0415
    from noetl_registry.errors import RegistryError  # noqa: PLC0415

    try:
        auth = KeyAuth(registry_url, admin_tenants=admin_tenants)
        auth.check()
    except RegistryError as e:
        _fail_input(e.message)
    except Exception as e:  # noqa: BLE001 - a bad URL or unreachable database: one line, exit 2
        _fail_input(f"cannot open the registry {registry_url or '(default)'}: {type(e).__name__}: {e}")
    set_process_kind(f"dashboard serve on {host}:{port}")
    store = _store(clickhouse, data_dir, database)
    if not no_refresh:
        _refresh(store, prices, data_dir)
    import threading  # noqa: PLC0415

    store_lock = threading.Lock()
    try:
        views = _execution_views(event_store, data_dir, prices)
        server = make_server(store, host, port, auth=auth, secure_cookie=secure_cookie, executions=views,
                             store_lock=store_lock)  # fmt: skip
    except OSError as e:
        _fail_input(f"cannot listen on {host}:{port}: {e.strerror or e}")
    live = _live_exports(store, store_lock, event_store, data_dir, prices, export_every)

    # the store keeps each execution's summary as it appends; recent executions recorded before
    # summaries get theirs now, in the background, so their pages open without reading the log
    if warm:
        threading.Thread(target=views.warm, args=(warm,), daemon=True, name="explain-warm").start()
    admins = f"; admin tenants: {', '.join(sorted(auth.admin_tenants))}" if auth.admin_tenants else ""
    click.echo(
        f"dashboard: http://{host}:{server.server_address[1]}/ (sign in with a registry API key{admins})"
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        for part in live:
            part.stop()
        server.server_close()


def _live_exports(store: Any, store_lock: Any, event_store: str | None, data_dir: str | None,
                  prices: str | None, seconds: float) -> list[Any]:  # fmt: skip
    """The embedded store's owner endpoint (other processes hand it their exports) and the export loop."""
    from noetl_analytics.export_handoff import ExportLoop, InProcessStore, OwnerService  # noqa: PLC0415
    from noetl_analytics.pricing import PriceTable  # noqa: PLC0415

    if store.embedded:
        service = OwnerService(store, store_lock, data_dir=data_dir).start()
        click.echo(f"facts store owner: {service.endpoint} takes exports for {store.url}")
    else:  # a server: every process writes itself; the loop exports straight into it
        service = InProcessStore(store, store_lock, data_dir=data_dir)
    parts: list[Any] = [service]
    if seconds:
        table = PriceTable.load(prices, data_dir=data_dir) if prices else None
        parts.insert(0, ExportLoop(service, event_store, seconds, prices=table).start())
        click.echo(f"exporting new events every {seconds:g}s")
    return parts


def _execution_views(event_store: str | None, data_dir: str | None, prices: str | None) -> Any:
    from noetl_analytics.execution_view import ExecutionViews  # noqa: PLC0415
    from noetl_dagster.storage.event_stores import open_event_store  # noqa: PLC0415

    try:
        return ExecutionViews(
            open_event_store(event_store, data_dir=data_dir), prices=prices, data_dir=data_dir
        )
    except ValueError as e:
        _fail_input(str(e))


@dashboard.command("export")
@common
@click.option(
    "--out", type=click.Path(file_okay=False), required=True, help="Output directory (writes cost.html)."
)
@click.option("--prices", type=click.Path(dir_okay=False))
@click.option(
    "--tenant", default=None, help="Write only this tenant's rows (the file can go to that tenant)."
)
@click.option("--project", default=None, help="With --tenant: only this project's rows.")
@click.option(
    "--all-tenants", is_flag=True, help="Write every tenant's rows and the cluster view (operators only)."
)
def export_cmd(clickhouse: str | None, data_dir: str | None, database: str | None, out: str, prices: str | None,
               tenant: str | None, project: str | None, all_tenants: bool) -> None:  # fmt: skip
    """Write the interactive dashboard as one self-contained HTML file (one tenant's data inlined)."""
    from noetl_analytics.dashboard_access import viewer_of  # noqa: PLC0415
    from noetl_analytics.interactive import export_static  # noqa: PLC0415

    try:
        viewer = viewer_of(tenant, project, all_tenants)
    except ValueError as e:
        _fail_input(str(e))
    store = _store(clickhouse, data_dir, database)
    _refresh(store, prices, data_dir)
    if tenant and not _has_rows(store, tenant, project):
        _fail_input(f"no cost rows for tenant {tenant!r}" + (f" project {project!r}" if project else ""))
    click.echo(f"dashboard: {export_static(store, Path(out), viewer=viewer)} ({viewer.name})")


def _has_rows(store: Any, tenant: str, project: str | None) -> bool:
    sql = "SELECT count() FROM $db.allocation_step_day WHERE tenant_id = {t:String}"
    if project:
        sql += " AND project_id = {p:String}"
    _, rows = store.query(sql, {"t": tenant, "p": project or ""})
    return bool(rows[0][0])


@dashboard.command("grafana")
@click.option("--out", "-o", type=click.Path(dir_okay=False), required=True, help="Output file (JSON).")
@click.option("--database", default=None, help="Facts database the panels query (default: noetl).")
@click.option("--tenant", default=None, help="One tenant's dashboard: its rows only.")
@click.option("--project", default=None, help="With --tenant: only this project's rows.")
@click.option("--all-tenants", is_flag=True, help="Every tenant's rows (operators only).")
def grafana_cmd(
    out: str, database: str | None, tenant: str | None, project: str | None, all_tenants: bool
) -> None:
    """Write the Grafana dashboard JSON (ClickHouse data source) of one tenant or of all tenants."""
    from noetl_analytics.dashboard_access import viewer_of  # noqa: PLC0415
    from noetl_analytics.grafana import render_json  # noqa: PLC0415
    from noetl_analytics.store import DEFAULT_DATABASE  # noqa: PLC0415

    try:
        viewer = viewer_of(tenant, project, all_tenants)
    except ValueError as e:
        _fail_input(str(e))
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_json(database or DEFAULT_DATABASE, viewer=viewer))
    click.echo(f"grafana dashboard: {path} ({viewer.name})")


@dashboard.command("demo-history")
@common
@click.option("--days", type=int, default=30, show_default=True)
@click.option("--per-day", type=int, default=4000, show_default=True, help="Candidate task attempts per day.")
@click.option("--tenants", type=int, default=4, show_default=True)
def demo_history(clickhouse: str | None, data_dir: str | None, database: str | None, days: int, per_day: int,
                 tenants: int) -> None:  # fmt: skip
    """Fill the facts store with a SYNTHETIC history (tenants `synthetic-*`, project `demo`)."""
    from noetl_analytics.demo_history import generate_history  # noqa: PLC0415

    store = _store(clickhouse, data_dir, database)
    try:
        n = generate_history(store, days=days, per_day=per_day, tenants=tenants)
    except ValueError as e:
        _fail_input(str(e))
    click.echo(
        f"SYNTHETIC demo history: {n} task attempts over {days} days for {tenants} tenants (synthetic-*)"
    )
