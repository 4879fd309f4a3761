"""``noetl-dagster flow``: the flow syntax front end (seed 002).

Exit codes: 0 ok; 1 the flow does not describe a valid workflow (labels,
declarations, tasks that resolve to no tool); 2 bad input (no such file, a
syntax error).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.group()
def flow() -> None:
    """Compact workflow syntax: `A → B → C` compiled to playbooks and diagrams."""


@flow.command("compile")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["yaml", "mermaid"]), default="yaml", show_default=True,
              help="yaml: a playbook (standard form); mermaid: a stateDiagram-v2.")  # fmt: skip
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write here instead of standard output.")  # fmt: skip
@click.option("--direction", type=click.Choice(["LR", "TB", "RL", "BT"]), default="LR", show_default=True,
              help="Mermaid layout direction.")  # fmt: skip
def compile_cmd(file: Path, fmt: str, output: Path | None, direction: str) -> None:
    """Compile a .flow FILE to a playbook (YAML) or a mermaid diagram."""
    from noetl_dagster.dsl.flow import (
        FlowError,
        FlowSyntaxError,
        compile_flow,
        flow_to_mermaid,
        playbook_yaml,
        rebase_resources,
    )
    from noetl_dagster.dsl.loader import YamlSyntaxError, read_text_file

    try:  # the bounded reader: a regular file within the document size limit
        text = read_text_file(file, what="flow file")
    except YamlSyntaxError as e:
        click.echo(str(e), err=True)
        sys.exit(2)
    try:
        if fmt == "mermaid":
            out = flow_to_mermaid(text, file=str(file), direction=direction)
        else:
            playbook = compile_flow(text, file=str(file), name=file.stem)
            if output is not None:
                rebase_resources(playbook, file.parent, output.parent)
            out = playbook_yaml(playbook)
    except FlowError as e:
        click.echo(str(e), err=True)
        sys.exit(2 if isinstance(e, FlowSyntaxError) else 1)
    if output is None:
        click.echo(out, nl=False)
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(out, encoding="utf-8")
