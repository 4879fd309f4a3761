"""``noetl-dagster migrate FILE... [-o OUT | --in-place] [--check]``.

Rewrites legacy playbooks (v1, early v2) to the standard form. Without ``-o``
or ``--in-place`` the migrated YAML of a single file goes to stdout. Notes
(``FILE:LINE: refused|warning: rule: message``) go to stderr, and so do the
validation errors of a migrated document that still does not validate.

Exit codes: 0 all files are (now) standard; 1 ``--check`` found files that
need migration, or something was refused or still does not validate; 2 bad
input (missing file, malformed YAML, not a playbook, bad options).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from noetl_dagster.commands.errors import one_line
from noetl_dagster.dsl.loader import YamlSyntaxError, check_yaml_limits, load_yaml_text, read_text_file
from noetl_dagster.dsl.migrate import MigrationInputError, MigrationResult, migrate_text


def _validation_issues(result: MigrationResult, label: str) -> list[str]:
    """The validator's verdict on the migrated text (in memory, nothing written)."""
    from noetl_dagster.dsl import load_yaml_text, parse_playbook
    from noetl_dagster.dsl.loader import YamlSyntaxError

    try:
        raw, sm = load_yaml_text(result.text, label)
    except YamlSyntaxError as e:  # pragma: no cover - the dumper writes valid YAML
        return [str(e)]
    _, issues = parse_playbook(raw, source_map=sm, source_file=label)
    return [str(i) for i in issues]


def _unmigratable(text: str, f: Path, exc: Exception) -> str:
    """The loader's own diagnosis when it has one (file:line: rule: message), else the exception in one line."""
    try:
        load_yaml_text(text, str(f))
    except YamlSyntaxError as e:
        return str(e)
    except Exception:  # noqa: BLE001, S110 - fall through to the original error
        pass
    return f"{f}:1: migrate-input: cannot migrate: {one_line(exc)}"


@click.command("migrate")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", "output", type=click.Path(path_type=Path),
              help="Write here: a file (one input) or a directory (one file per input).")  # fmt: skip
@click.option("--in-place", is_flag=True, help="Rewrite each file in place (only files that change).")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 when a file needs migration.")
@click.option("-v", "--verbose", is_flag=True, help="Also print informational notes.")
def migrate(files: tuple[Path, ...], output: Path | None, in_place: bool, check: bool, verbose: bool) -> None:
    """Rewrite legacy NoETL playbooks (v1, early v2) to the standard noetl.io/v2 form.

    Comments and key order are kept; anything that cannot be translated
    faithfully is reported with its file and line and left as written.
    """
    if sum([output is not None, in_place, check]) > 1:
        click.echo("migrate: use only one of -o/--output, --in-place and --check", err=True)
        sys.exit(2)
    if len(files) > 1 and not (in_place or check or output is not None):
        click.echo("migrate: several files need -o DIR, --in-place or --check", err=True)
        sys.exit(2)
    out_dir = output is not None and (len(files) > 1 or output.is_dir())
    if out_dir:
        names = [f.name for f in files]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            click.echo(f"migrate: several inputs are named {dupes}; write them with separate runs", err=True)
            sys.exit(2)
    code = 0
    for f in files:
        try:  # the same limits as every other command (size, depth, nodes, aliases) before ruamel sees it
            text = read_text_file(f, what="playbook")
            check_yaml_limits(text, str(f))
        except YamlSyntaxError as e:
            click.echo(str(e), err=True)
            code = 2
            continue
        try:
            result = migrate_text(text, str(f))
        except MigrationInputError as e:
            click.echo(str(e), err=True)
            code = 2
            continue
        except Exception as e:  # noqa: BLE001 - input the round-trip parser cannot handle: say why in one line
            click.echo(_unmigratable(text, f, e), err=True)
            code = 2
            continue
        for n in result.notes:
            if n.level != "info" or verbose:
                click.echo(str(n), err=True)
        if result.refused:
            code = max(code, 1)
        if check:
            if result.changed:
                click.echo(f"{f}: needs migration", err=True)
                code = max(code, 1)
            continue
        issues = _validation_issues(result, f"{f} (migrated)")
        for line in issues:
            click.echo(line, err=True)
        if issues:
            code = max(code, 1)
        if in_place:
            if result.changed:
                f.write_text(result.text, encoding="utf-8")
                click.echo(f"{f}: migrated", err=True)
        elif output is not None:
            target = output / f.name if out_dir else output
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(result.text, encoding="utf-8")
            click.echo(f"{f} -> {target}", err=True)
        else:
            click.echo(result.text, nl=False)
    sys.exit(code)
