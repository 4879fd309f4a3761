"""Real runs for the dashboard: run the example playbooks for a few tenants,
export their events as facts and render the dashboard.

    .venv/bin/python -m noetl_dagster.commands.facts_demo --out docs/img [--data-dir DIR]

Tests use :func:`run_playbooks` to build event logs from real executions.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "example_project" / "playbooks"
DEFAULT_TENANTS: tuple[tuple[str, str], ...] = (("acme", "sales"), ("globex", "research"))


def example_playbooks(directory: Path = EXAMPLES) -> list[Path]:
    return sorted(directory.glob("*.yaml"))


def run_playbooks(
    playbooks: Iterable[Path],
    data_dir: Path,
    *,
    tenants: Sequence[tuple[str, str]] = DEFAULT_TENANTS,
    event_store: Any = None,
) -> list[tuple[Path, str, str, Any]]:
    """Run every playbook once per (tenant, project) with the local runner.

    Returns (playbook, tenant, project, ExecutionResult or the exception it raised)."""
    from noetl_dagster.runners.local import run_playbook  # noqa: PLC0415

    out = []
    for path in playbooks:
        for tenant, project in tenants:
            try:
                result: Any = run_playbook(
                    path, data_dir=data_dir, event_store=event_store, tenant=tenant, project=project
                )
            except Exception as e:  # noqa: BLE001 - reported to the caller, the others still run
                result = e
            out.append((path, tenant, project, result))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "docs" / "img"), help="where the PNGs go")
    ap.add_argument("--data-dir", help="keep the run's data here (default: a temporary directory)")
    ap.add_argument("--html", action="store_true", help="also keep index.html next to the PNGs")
    ap.add_argument("--extra", action="append", default=[], help="another directory of playbooks to run too")
    args = ap.parse_args()

    from noetl_analytics.dashboard import render_dashboard  # noqa: PLC0415
    from noetl_analytics.dashboard_access import Viewer  # noqa: PLC0415
    from noetl_analytics.exporter import FactExporter  # noqa: PLC0415
    from noetl_analytics.rollups import refresh_rollups  # noqa: PLC0415
    from noetl_analytics.store import FactsStore, close_all  # noqa: PLC0415
    from noetl_dagster.storage.events import SqliteEventStore  # noqa: PLC0415

    data_dir = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="noetl_demo_"))
    log = SqliteEventStore(data_dir / "events.db")
    playbooks = example_playbooks() + [p for d in args.extra for p in example_playbooks(Path(d))]
    for path, tenant, project, result in run_playbooks(playbooks, data_dir, event_store=log):
        status = getattr(result, "status", f"error: {result}")
        print(f"{tenant}/{project} {path.name}: {status}")
    store = FactsStore(f"chdb://{data_dir / 'facts'}")
    report = FactExporter(store, log).export()
    print(f"exported {report.events} events")
    rollup = refresh_rollups(store)
    render_dir = data_dir / "dashboard"
    dash = render_dashboard(  # the demo's own store: the operator's view of every tenant
        store,
        render_dir,
        viewer=Viewer.everyone(),
        title="NoETL facts — example playbooks",
        currency=rollup.currency,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for png in dash.pngs:
        shutil.copy(png, out / f"dashboard_{png.name}")
        print(out / f"dashboard_{png.name}")
    if args.html:
        shutil.copy(dash.html, out / "dashboard.html")
    log.close()
    close_all()


if __name__ == "__main__":
    main()
