"""`--help` and `--version` without importing the commands (issue 35): the listing comes from
main.COMMANDS' texts and the version from the installed metadata file, so both must say exactly
what the commands and importlib.metadata say."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys

import click
import pytest
from click.testing import CliRunner

from noetl_dagster.commands import main as cli_main
from noetl_dagster.util.version import package_version


def _command(name: str) -> click.Command:
    mod, _, attr = cli_main.COMMANDS[name][0].partition(":")
    return getattr(importlib.import_module(mod), attr)


@pytest.mark.parametrize("name", sorted(cli_main.COMMANDS))
def test_table_text_is_the_commands_short_help(name):
    cmd = _command(name)
    assert cmd.name == name and not cmd.hidden and not cmd.deprecated and cmd.short_help is None
    listed = click.Command(name, help=cli_main.COMMANDS[name][1])
    for limit in (20, 45, 62, 74, 200):
        assert listed.get_short_help_str(limit) == cmd.get_short_help_str(limit), limit


class _EagerGroup(cli_main.LazyGroup):
    """click's own listing: every command imported and asked for its short help."""

    format_commands = click.Group.format_commands


@pytest.mark.parametrize("width", [60, 80, 120])
def test_help_is_what_click_prints_for_the_loaded_commands(width):
    eager = _EagerGroup(name="cli", callback=cli_main.cli.callback, params=cli_main.cli.params,
                        help=cli_main.cli.help, context_settings=cli_main.cli.context_settings)  # fmt: skip
    runner = CliRunner()
    ours = runner.invoke(cli_main.cli, ["--help"], prog_name="noetl-dagster", terminal_width=width)
    theirs = runner.invoke(eager, ["--help"], prog_name="noetl-dagster", terminal_width=width)
    assert ours.exit_code == theirs.exit_code == 0
    assert ours.output == theirs.output
    assert "  run          Run a playbook to completion." in ours.output


def test_version_is_the_installed_metadata():
    out = CliRunner().invoke(cli_main.cli, ["--version"], prog_name="noetl-dagster")
    assert out.exit_code == 0
    assert out.output == f"noetl-dagster, version {importlib.metadata.version('noetl-dagster')}\n"


@pytest.mark.parametrize(
    "dist", ["noetl-dagster", "click", "PyYAML", "ruamel.yaml", "typing_extensions", "pydantic-core"]
)
def test_version_reader_agrees_with_importlib_metadata(dist):
    assert package_version(dist) == importlib.metadata.version(dist)


def test_version_reader_takes_the_first_on_the_path_and_falls_back(tmp_path, monkeypatch):
    first = tmp_path / "a"
    (first / "noetl_dagster-9.9.9.dist-info").mkdir(parents=True)
    (first / "noetl_dagster-9.9.9.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.4\nName: noetl-dagster\nVersion: 9.9.9\n\nbody\n"
    )
    monkeypatch.setattr(sys, "path", [str(first), *sys.path])
    importlib.invalidate_caches()
    assert package_version() == importlib.metadata.version("noetl-dagster") == "9.9.9"
    broken = tmp_path / "b"  # two candidates in one directory: importlib.metadata decides
    for v in ("1.0", "2.0"):
        (broken / f"noetl_dagster-{v}.dist-info").mkdir(parents=True)
        (broken / f"noetl_dagster-{v}.dist-info" / "METADATA").write_text(
            f"Name: noetl-dagster\nVersion: {v}\n"
        )
    monkeypatch.setattr(sys, "path", [str(broken), *sys.path])
    importlib.invalidate_caches()
    assert package_version() == importlib.metadata.version("noetl-dagster")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        package_version("no-such-distribution-here")
