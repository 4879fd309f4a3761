"""``noetl-dagster tools list``: every tool kind from the ``noetl_dagster.tools`` entry points."""

from __future__ import annotations

import json
import sys

import click


@click.group()
def tools() -> None:
    """Tool kinds (built in and plugins)."""


@tools.command("list")
@click.option(
    "--json", "as_json", is_flag=True, help="Every kind with its config JSON schema, as one JSON object."
)
@click.option(
    "--schema", "with_schema", is_flag=True, help="Also print each kind's config schema (text output)."
)
def list_kinds(as_json: bool, with_schema: bool) -> None:
    """List the tool kinds, their source and config schema. Exit 1 when a plugin failed to load."""
    from noetl_dagster.tools.registry import all_kinds

    kinds = all_kinds()
    broken = [k for k in kinds if k.error]
    if as_json:
        out = {
            k.name: {
                "source": k.source,
                "distribution": k.distribution,
                "description": k.description,
                "raw_keys": sorted(k.raw_keys),
                "config_model": f"{k.config.__module__}.{k.config.__qualname__}" if k.config else None,
                "config_schema": k.config_schema(),
                "status": "error" if k.error else "ok",
                "error": k.error,
            }
            for k in kinds
        }
        click.echo(json.dumps({"kinds": out}, indent=2, default=str))
    else:
        width = max((len(k.name) for k in kinds), default=4)
        for k in kinds:
            if k.error:
                click.echo(f"{k.name:<{width}}  BROKEN  {k.error}")
                continue
            fields = ", ".join(
                (i.alias or f) for f, i in (k.config.model_fields if k.config else {}).items() if f != "input"
            )
            click.echo(f"{k.name:<{width}}  {k.source}  [{k.distribution or 'in-process'}]")
            if k.description:
                click.echo(f"{'':<{width}}  {k.description}")
            click.echo(f"{'':<{width}}  config: {k.config.__name__ if k.config else '(untyped)'}({fields})")
            if with_schema and k.config is not None:
                click.echo(json.dumps(k.config_schema(), indent=2))
    for k in broken:
        click.echo(f"error: {k.error}", err=True)
    sys.exit(1 if broken else 0)
