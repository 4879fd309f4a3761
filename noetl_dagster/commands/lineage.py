"""``noetl-dagster lineage export|validate``: OpenLineage from the stored event log.

``export`` replays the local event log (or some executions of it) through the
same converter the live listener uses and emits the RunEvents: to ``--out`` (a
JSON-lines file), else to the configured OpenLineage transport (openlineage.yml,
OPENLINEAGE_CONFIG, OPENLINEAGE__TRANSPORT__*), else to the embedded default
``<data dir>/lineage/openlineage.jsonl``. ``validate`` checks JSON-lines files
offline against the OpenLineage spec schemas. Exit codes: 0 ok, 1 invalid
events, 2 bad input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

EXIT_INVALID, EXIT_BAD_INPUT = 1, 2
# `lineage validate`: a JSON-lines file is read whole by the bounded reader, at most this many bytes
EVENTS_FILE_MAX_BYTES = 256 * 1024 * 1024


def _fail_input(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def _validator(spec_dir: str | None) -> Any:
    from noetl_lineage.validate import LineageValidator, SpecNotFound  # noqa: PLC0415

    try:
        return LineageValidator(spec_dir)
    except SpecNotFound as e:
        _fail_input(str(e))


@click.group()
def lineage() -> None:
    """OpenLineage RunEvents for NoETL executions."""


@lineage.command()
@click.option(
    "--events", "--event-store", "events_url", help="Event log URL (default: the local SQLite log)."
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    help="Data directory (default $NOETL_DAGSTER_HOME or ./.noetl).",
)
@click.option(
    "--execution",
    "executions",
    multiple=True,
    help="Only these executions (and the sub-executions they started).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    help="Write JSON lines here instead of the configured transport.",
)
@click.option(
    "--validate", "check", is_flag=True, help="Validate every event against the OpenLineage spec first."
)
@click.option(
    "--spec-dir", type=click.Path(file_okay=False), help="OpenLineage spec/ directory for --validate."
)
def export(
    events_url: str | None,
    data_dir: str | None,
    executions: tuple[str, ...],
    out: str | None,
    check: bool,
    spec_dir: str | None,
) -> None:
    """Convert stored events to OpenLineage and emit them."""
    from openlineage.client import OpenLineageClient  # noqa: PLC0415
    from openlineage.client.serde import Serde  # noqa: PLC0415

    from noetl_dagster.runners.local import default_data_dir  # noqa: PLC0415
    from noetl_dagster.storage.event_stores import open_event_store
    from noetl_lineage.config import is_configured  # noqa: PLC0415
    from noetl_lineage.convert import LineageConverter  # noqa: PLC0415
    from noetl_lineage.emitter import file_client, registry_describer_from_env  # noqa: PLC0415

    try:
        log = open_event_store(events_url, data_dir=data_dir)
    except Exception as e:  # noqa: BLE001 - any open failure is bad input
        _fail_input(f"cannot open the event log: {e}")
    validator = _validator(spec_dir) if check else None
    wanted = set(executions)
    converter = LineageConverter(describe=registry_describer_from_env(data_dir))
    run_events = []
    for stored in log.iter_all():
        e = stored.event
        if wanted and e.execution_id not in wanted:
            if e.parent_execution_id in wanted:
                wanted.add(e.execution_id)  # follow sub-playbooks
            else:
                continue
        run_events.extend(converter.convert(e))
    log.close()
    if validator is not None:
        bad = [
            (i, errs)
            for i, ev in enumerate(run_events)
            if (errs := validator.errors(json.loads(Serde.to_json(ev))))
        ]
        for i, errs in bad[:20]:
            click.echo(f"event {i}: {'; '.join(errs)}", err=True)
        if bad:
            click.echo(f"{len(bad)} of {len(run_events)} OpenLineage events are invalid", err=True)
            sys.exit(EXIT_INVALID)
    if out:
        target, client = out, file_client(out)
    elif is_configured():
        target, client = "the configured OpenLineage transport", OpenLineageClient()
    else:
        path = Path(data_dir or default_data_dir()) / "lineage" / "openlineage.jsonl"
        target, client = str(path), file_client(path)
    for ev in run_events:
        client.emit(ev)
    client.close(10)
    click.echo(f"emitted {len(run_events)} OpenLineage events to {target}")


@lineage.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--spec-dir", type=click.Path(file_okay=False), help="OpenLineage spec/ directory.")
def validate(files: tuple[str, ...], spec_dir: str | None) -> None:
    """Validate JSON-lines OpenLineage events offline: each against OpenLineage.json and the
    facet schemas, and the stream against the rules across events (run lifecycles, parents
    that exist, stable dataset identities)."""
    from noetl_dagster.dsl.files import InputFileError, read_bounded_text  # noqa: PLC0415
    from noetl_lineage.validate import semantic_errors  # noqa: PLC0415 - keeps the CLI quick to start

    validator = _validator(spec_dir)
    total = bad = 0
    problems = 0
    for name in files:
        parsed: list[dict] = []
        try:
            text = read_bounded_text(name, EVENTS_FILE_MAX_BYTES, what="events file")
        except InputFileError as e:
            _fail_input(str(e))
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            total += 1
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as e:
                bad += 1
                click.echo(f"{name}:{n}: not JSON: {e}", err=True)
                continue
            errs = validator.errors(doc)
            if errs:
                bad += 1
                click.echo(f"{name}:{n}: {'; '.join(errs)}", err=True)
            elif isinstance(doc, dict) and "run" in doc:
                parsed.append(doc)
        # each file is one stream: run lifecycles, parents that exist, stable datasets
        stream = semantic_errors(parsed)
        problems += len(stream)
        for err in stream[:50]:
            click.echo(f"{name}: {err}", err=True)
    click.echo(f"{total - bad} of {total} events valid")
    if problems:
        click.echo(f"{problems} problems across events")
    if bad or problems:
        sys.exit(EXIT_INVALID)
