"""``noetl-dagster conformance DIR``: parse, validate and run the NoETL e2e corpus here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


def _overrides(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        host, sep, url = pair.partition("=")
        if not sep or not host or not url.startswith(("http://", "https://")):
            raise click.BadParameter(
                f"{pair!r}: expected HOST=URL, e.g. httpbin.org=http://127.0.0.1:8080",
                param_hint="--http-override",
            )
        out[host.lower()] = url
    return out


@click.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the whole report as one JSON object.")
@click.option(
    "--http-override",
    "overrides",
    multiple=True,
    metavar="HOST=URL",
    help="Send requests for HOST (or HOST:PORT) to URL; adds to / replaces the built-in stub servers.",
)
@click.option(
    "--core",
    "core_list",
    type=click.Path(exists=True, dir_okay=False),
    help="List of fixtures to run (default: core_fixtures.txt above DIR).",
)
@click.option(
    "--pg-url",
    default="postgresql://postgres@127.0.0.1:5432/noetl_conformance",
    show_default=True,
    help="Database the fixtures' pg_local / pg_k8s credentials point at (created if missing).",
)
@click.option(
    "--only", multiple=True, help="Run only core fixtures whose path contains this text (repeatable)."
)
@click.option("--no-run", is_flag=True, help="Only parse and validate; run nothing.")
@click.option(
    "--markdown",
    "markdown_out",
    type=click.Path(dir_okay=False),
    help="Also write the report as Markdown here.",
)
@click.option(
    "--work-dir", type=click.Path(file_okay=False), help="Keep each fixture's event log and payloads here."
)
def conformance(
    directory, as_json, overrides, core_list, pg_url, only, no_run, markdown_out, work_dir
) -> None:
    """Parse, validate and (for the core list) run every playbook under DIRECTORY.

    Network calls go to local stub servers; Postgres credentials to the local
    server. Exit 0 when every core fixture that ran completed, else 1."""
    from noetl_dagster.conformance.report import markdown, print_table
    from noetl_dagster.conformance.runner import ERROR, FAILED, TIMEOUT, run_conformance
    from noetl_dagster.dsl.loader import YamlSyntaxError

    def progress(rep):
        if not as_json:
            click.echo(f"  {rep.outcome:<18} {rep.path}", err=True)

    try:
        report = run_conformance(
            directory, core_list=core_list, http_overrides=_overrides(overrides), pg_url=pg_url,
            only=list(only) or None, run_core=not no_run, work_dir=work_dir, progress=progress,
        )  # fmt: skip
    except YamlSyntaxError as e:  # the --core list cannot be read (not a regular file, too large, binary)
        click.echo(str(e), err=True)
        sys.exit(2)
    if markdown_out:
        Path(markdown_out).write_text(markdown(report))
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        print_table(report)
    broken = [f for f in report.fixtures if f.core and f.outcome in (FAILED, TIMEOUT, ERROR)]
    sys.exit(1 if broken else 0)
