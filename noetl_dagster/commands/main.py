"""The ``noetl-dagster`` command.

Sub-commands live in their own modules and are attached here by name, so each
capability owns its command; importing is lazy to keep ``--help`` fast.
Exit codes: 0 ok, 1 failed/invalid playbook, 2 bad input (usage, missing file,
malformed YAML or JSON).
"""

from __future__ import annotations

import importlib
import sys

import click

from noetl_dagster.commands.errors import GuardedGroup

# name -> "module:attribute" of a click command
COMMANDS: dict[str, str] = {
    "validate": "noetl_dagster.commands.core:validate",
    "run": "noetl_dagster.commands.core:run",
    "replay": "noetl_dagster.commands.core:replay",
    "events": "noetl_dagster.commands.core:events",
    "executions": "noetl_dagster.commands.core:executions",
    "explain": "noetl_dagster.commands.explain:explain",
    "diff": "noetl_dagster.commands.explain:diff",
    "conformance": "noetl_dagster.commands.conformance:conformance",
    "migrate": "noetl_dagster.commands.migrate:migrate",
    "flow": "noetl_dagster.commands.flow:flow",
    "facts": "noetl_dagster.commands.facts:facts",
    "dashboard": "noetl_dagster.commands.dashboard:dashboard",
    "lineage": "noetl_dagster.commands.lineage:lineage",
    "archive": "noetl_dagster.commands.archive:archive",
    "resume": "noetl_dagster.commands.archive:resume",
    "demo": "noetl_dagster.commands.demo:demo",
    "tools": "noetl_dagster.commands.tools:tools",
    "schema": "noetl_dagster.commands.schema:schema",
}


class LazyGroup(GuardedGroup):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in COMMANDS if self._load(name) is not None)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return self._load(name)

    @staticmethod
    def _load(name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if not target:
            return None
        mod_name, _, attr = target.partition(":")
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name == mod_name:  # command not built yet
                return None
            raise
        return getattr(mod, attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="noetl-dagster")
def cli() -> None:
    """Run NoETL playbooks locally or on Dagster."""


def main() -> None:
    try:
        cli.main(prog_name="noetl-dagster", standalone_mode=True)
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
