"""archive / resume: execution archives and crash recovery."""

from __future__ import annotations

import json
import sys

import click

from noetl_dagster.commands.core import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, _fail_input
from noetl_dagster.util.jsonutil import dumps


@click.command()
@click.argument("execution_id")
@click.option(
    "--to", "to", required=True, help="Archive store URL: file:///dir, a path, or s3://bucket/prefix."
)
@click.option("--event-store", help="Event store URL (default $NOETL_DAGSTER_HOME/events.db).")
@click.option("--data-dir", type=click.Path(file_okay=False))
@click.option(
    "--registry",
    "registry_url",
    help="Registry to record the archive in (a DB URL or http://…); default: the embedded one.",
)
@click.option("--no-registry", is_flag=True, help="Do not record the archive in the registry.")
@click.option("--json", "as_json", is_flag=True)
def archive(execution_id: str, to: str, event_store: str | None, data_dir: str | None, registry_url: str | None,
            no_registry: bool, as_json: bool) -> None:  # fmt: skip
    """Write an execution's archive bundle (seed 004 §7) to a payload store."""
    from noetl_dagster.storage.archive import ArchiveConflict, archive_execution
    from noetl_dagster.storage.event_stores import open_event_store

    store = open_event_store(event_store, data_dir=data_dir)
    registry = None
    if not no_registry:
        from noetl_registry.client import open_registry

        first = store.read(execution_id)[:1]
        tenant = first[0].tenant_id if first else "default"
        project = first[0].project_id if first else "default"
        registry = open_registry(registry_url, tenant=tenant, project=project)
    try:
        manifest = archive_execution(execution_id, store, to, registry=registry)
    except KeyError as e:
        _fail_input(str(e.args[0]))
    except (ValueError, ArchiveConflict) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_FAILED)
    if as_json:
        click.echo(dumps(manifest))
    else:
        click.echo(
            f"{manifest['status']}: {manifest['uri']}  ({manifest['event_count']} events, {len(manifest['segments'])} segment(s))"
        )


@click.command()
@click.argument("execution_id")
@click.option(
    "--playbook",
    type=click.Path(dir_okay=False),
    help="The playbook file (default: the one the execution recorded).",
)
@click.option("--event-store")
@click.option("--data-dir", type=click.Path(file_okay=False))
@click.option("--catalog", "catalog_dirs", multiple=True, type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True)
def resume(execution_id: str, playbook: str | None, event_store: str | None, data_dir: str | None,
           catalog_dirs: tuple[str, ...], as_json: bool) -> None:  # fmt: skip
    """Finish an execution whose process died, from its event log (nothing that finished runs again)."""
    from noetl_dagster.dsl import PlaybookInvalid
    from noetl_dagster.engine.ports import ExecutionLeased
    from noetl_dagster.runners.local import resume_execution

    try:
        result = resume_execution(execution_id, playbook=playbook, event_store=event_store, data_dir=data_dir,
                                  catalog_dirs=catalog_dirs)  # fmt: skip
    except (KeyError, FileNotFoundError, ExecutionLeased) as e:
        _fail_input(str(e.args[0]) if e.args else str(e))
    except PlaybookInvalid as e:
        for i in e.issues:
            click.echo(str(i), err=True)
        sys.exit(EXIT_BAD_INPUT)
    if as_json:
        click.echo(dumps(result.to_json()))
    else:
        click.echo(
            json.dumps({"execution_id": result.execution_id, "status": result.status, "runs": result.runs})
        )
    sys.exit(EXIT_OK if result.status == "completed" else EXIT_FAILED)
