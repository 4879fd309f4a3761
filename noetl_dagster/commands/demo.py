"""``noetl-dagster demo``: run the example playbooks through Dagster, headless.

Every playbook of ``example_project/playbooks`` runs through a real Dagster
instance (SQLite under ``example_project/.dagster_home``, the in-process
executor), with the NoETL event log under ``example_project/.noetl``: the same
homes ``make dev`` starts ``dagster dev`` with, so the demo's runs are there to
look at afterwards. Nothing outside this machine is needed (the HTTP example
calls a loopback stub it starts).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import click


def _example_dir() -> Path:
    """The example project of a source checkout (it is not part of the wheel)."""
    try:
        import example_project  # noqa: PLC0415

        return Path(example_project.__file__).resolve().parent
    except ImportError:
        pass
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        if (root / "example_project" / "definitions.py").is_file():
            if str(root) not in sys.path:
                sys.path.insert(0, str(root))  # so the runs can import example_project.stub and friends
            return root / "example_project"
    raise click.ClickException(
        "the demo runs the example project of a source checkout: git clone the repository and run `make demo`"
    )


def _default_home(example_dir: Path) -> Path:
    """``example_project/`` in a source checkout (shared with ``make dev``), else the current directory."""
    if (example_dir.parent / "pyproject.toml").is_file() and os.access(example_dir, os.W_OK):
        return example_dir
    return Path.cwd()


def _scope(example_dir: Path) -> tuple[str, str]:
    """The tenant/project the example code location runs as (its component's defs.yaml), so the demo's
    executions and stored tables are the ones `make dev` shows."""
    import yaml  # noqa: PLC0415

    doc = yaml.safe_load((example_dir / "defs" / "playbooks" / "defs.yaml").read_text(encoding="utf-8")) or {}
    attrs = doc.get("attributes") or {}
    return str(attrs.get("tenant", "default")), str(attrs.get("project", "default"))


@click.command()
@click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where .dagster_home and .noetl go (default: example_project/ in a checkout, else .).",
)
@click.option(
    "--only", "only", multiple=True, help="Run only these playbooks (file stem, e.g. countdown_cycle)."
)
@click.option("--fresh", is_flag=True, help="Start from empty Dagster and NoETL homes.")
@click.option("--verbose", "-v", is_flag=True, help="Show Dagster's own log lines too.")
def demo(home: Path | None, only: tuple[str, ...], fresh: bool, verbose: bool) -> None:  # fmt: skip
    """Run every example playbook through Dagster (embedded defaults) and show where to look next."""
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    console = Console()
    if not console.is_terminal:  # piped (CI logs): wide enough for the table and full execution ids
        console = Console(width=150)
    example_dir = _example_dir()
    base = (home or _default_home(example_dir)).resolve()
    dagster_home, noetl_home = base / ".dagster_home", base / ".noetl"
    if fresh:
        shutil.rmtree(dagster_home, ignore_errors=True)
        shutil.rmtree(noetl_home, ignore_errors=True)
    dagster_home.mkdir(parents=True, exist_ok=True)
    if not (dagster_home / "dagster.yaml").exists():
        shutil.copy(example_dir / "dagster.yaml", dagster_home / "dagster.yaml")

    tenant, project = _scope(example_dir)
    files = sorted((example_dir / "playbooks").glob("*.yaml"))
    if only:
        wanted = set(only)
        files = [f for f in files if f.stem in wanted]
        missing = wanted - {f.stem for f in files}
        if missing:
            raise click.UsageError(f"no example playbook named {', '.join(sorted(missing))}")
    console.print(f"[bold]noetl-dagster demo[/]: {len(files)} example playbooks through Dagster "
                  f"(in-process executor)\n  Dagster instance: {dagster_home}\n  NoETL data:       {noetl_home}\n")  # fmt: skip

    from noetl_dagster.dsl import PlaybookInvalid, load_playbook  # noqa: PLC0415
    from noetl_dagster.resources.noetl import close_all_services  # noqa: PLC0415
    from noetl_dagster.translator.runner import DagsterRunError, open_instance, run_playbook_dagster  # noqa: PLC0415

    rows: list[dict[str, Any]] = []
    instance = open_instance(dagster_home)  # Dagster's first-use telemetry notice goes to the log
    t_all = time.perf_counter()
    try:
        for f in files:
            t0 = time.perf_counter()
            row: dict[str, Any] = {
                "playbook": f.stem,
                "status": "error",
                "steps": 0,
                "runs": 0,
                "id": "",
                "mode": "",
            }
            with console.status(f"running {f.stem} ..."):
                try:
                    pb = load_playbook(f)
                    dag = pb.executor.spec.get("dagster") or {}
                    row["mode"] = dag.get("mode", "default") if isinstance(dag, dict) else "default"
                    r = run_playbook_dagster(pb, data_dir=noetl_home, instance=instance, tenant=tenant,
                                             project=project, log_level="INFO" if verbose else "CRITICAL")  # fmt: skip
                    row.update(status=r.status, steps=sum(r.runs.values()), runs=len(r.extra["dagster"]["run_ids"]),
                               id=r.execution_id)  # fmt: skip
                except (PlaybookInvalid, DagsterRunError, OSError, ValueError) as e:
                    row["error"] = str(e).splitlines()[0][:200]
            row["seconds"] = time.perf_counter() - t0
            rows.append(row)
            color = "green" if row["status"] == "completed" else "red"
            console.print(f"  [{color}]{row['status']:<9}[/] {f.stem:<22} {row['steps']:>3} step runs in "
                          f"{row['runs']} Dagster run(s), {row['seconds']:.1f}s"
                          + (f"  [red]{row['error']}[/]" if row.get("error") else ""))  # fmt: skip
    finally:
        instance.dispose()
        close_all_services()

    table = Table(title=f"{len(rows)} playbooks in {time.perf_counter() - t_all:.1f}s", header_style="bold")
    for col, just in (("playbook", "left"), ("mode", "left"), ("status", "left"), ("step runs", "right"),
                      ("runs", "right"), ("seconds", "right"), ("execution id", "left")):  # fmt: skip
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in rows:
        color = "green" if r["status"] == "completed" else "red"
        table.add_row(r["playbook"], r["mode"], f"[{color}]{r['status']}[/]", str(r["steps"]), str(r["runs"]),
                      f"{r['seconds']:.1f}", r["id"])  # fmt: skip
    console.print()
    console.print(table)
    sample = next(
        (r["id"] for r in rows if r["playbook"] == "countdown_cycle" and r["id"]),
        rows[0]["id"] if rows else "ID",
    )
    dev = (
        "make dev"
        if base == example_dir
        else (
            f"DAGSTER_HOME={dagster_home} NOETL_DAGSTER_HOME={noetl_home} dagster dev -m example_project.definitions"
        )
    )
    console.print(f"""
[bold]Where to look next[/]
  UI:          {dev}   then open http://127.0.0.1:3000 (Runs: filter by tag noetl/execution_id)
  Event log:   sqlite:///{noetl_home / "events.db"}
  One execution:   noetl-dagster events {sample} --data-dir {noetl_home}
  All executions:  noetl-dagster executions --data-dir {noetl_home}
  Run one yourself: noetl-dagster run --runner dagster example_project/playbooks/hello_dagster.yaml
  Let the sensor run it (with `make dev` running):
      noetl-dagster run --runner dagster --detach --data-dir {noetl_home} example_project/playbooks/hello_dagster.yaml
  Docs:        docs/dagster.md (the mapping), docs/example_project.md (this demo)
""")
    failed = [r for r in rows if r["status"] != "completed"]
    if failed:
        console.print(
            f"[red]{len(failed)} playbook(s) did not complete: {', '.join(r['playbook'] for r in failed)}[/]"
        )
        sys.exit(1)
