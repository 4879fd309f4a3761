"""``noetl-dagster schema``: the playbook JSON Schema for editors (noetl_dagster.dsl.jsonschema)."""

from __future__ import annotations

import json
from pathlib import Path

import click


def schema_text() -> str:
    from noetl_dagster.dsl.jsonschema import playbook_schema  # noqa: PLC0415 - loads every tool kind

    return json.dumps(playbook_schema(), indent=2, sort_keys=True) + "\n"


@click.command("schema")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the schema here (default: stdout).")  # fmt: skip
def schema(output: Path | None) -> None:
    """Write the JSON Schema of the playbooks this project accepts (tool configs from the kinds'
    models); map it to playbooks in your editor (YAML extension: `yaml.schemas`)."""
    text = schema_text()
    if output is None:
        click.echo(text, nl=False)
        return
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
    except OSError as e:
        raise click.ClickException(f"cannot write {output}: {e.strerror or e}") from None
    click.echo(f"wrote {output}", err=True)
