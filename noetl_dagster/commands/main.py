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

# name -> ("module:attribute" of a click command, the first paragraph of its help). `--help` lists
# the commands from this table without importing one (each module pulls in its own layers: the DSL,
# pydantic, Jinja, ...); tests/commands/test_cli_startup.py keeps the texts equal to the commands'.
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("noetl_dagster.commands.core:validate",
                 "Validate playbooks: one `FILE:LINE: RULE: message` line per error; exit 1 if any."),
    "run": ("noetl_dagster.commands.core:run",
            "Run a playbook to completion. Exit 0 completed, 1 failed, 2 invalid input."),
    "replay": ("noetl_dagster.commands.core:replay", "Rebuild an execution's final state from its events alone."),
    "events": ("noetl_dagster.commands.core:events", "Print an execution's event log."),
    "executions": ("noetl_dagster.commands.core:executions", "List recent executions in the event store."),
    "explain": ("noetl_dagster.commands.explain:explain",
                "What happened inside an execution: step runs, retries, loops, arcs, cost."),
    "diff": ("noetl_dagster.commands.explain:diff",
             "Where execution B first diverges from A (arc, status, retries, result) and why."),
    "conformance": ("noetl_dagster.commands.conformance:conformance",
                    "Parse, validate and (for the core list) run every playbook under DIRECTORY."),
    "migrate": ("noetl_dagster.commands.migrate:migrate",
                "Rewrite legacy NoETL playbooks (v1, early v2) to the standard noetl.io/v2 form."),
    "flow": ("noetl_dagster.commands.flow:flow",
             "Compact workflow syntax: `A → B → C` compiled to playbooks and diagrams."),
    "facts": ("noetl_dagster.commands.facts:facts",
              "Event-log facts in ClickHouse: export, query, refresh the cost rollups."),
    "dashboard": ("noetl_dagster.commands.dashboard:dashboard",
                  "Cost dashboards: render (static PNG/HTML), serve (interactive), export, demo-history."),
    "lineage": ("noetl_dagster.commands.lineage:lineage", "OpenLineage RunEvents for NoETL executions."),
    "archive": ("noetl_dagster.commands.archive:archive",
                "Write an execution's archive bundle (seed 004 §7) to a payload store."),
    "verify": ("noetl_dagster.commands.verify:verify",
               "Check an execution's tamper-evident event log (or an archive): OK and its head hash, or the first bad event."),
    "push": ("noetl_dagster.commands.push:push_command",
             "Append a local execution (run's default) to the event store in one transaction."),
    "resume": ("noetl_dagster.commands.archive:resume",
               "Finish an execution whose process died, from its event log (nothing that finished runs again)."),
    "projector": ("noetl_dagster.commands.nats_tiers:projector",
                  "Keep the Postgres projections of the NATS event streams (warm tier)."),
    "archiver": ("noetl_dagster.commands.nats_tiers:archiver",
                 "Write finished executions from the NATS event streams to archive bundles (cold tier)."),
    "retention": ("noetl_dagster.commands.nats_tiers:retention",
                  "Evict archived, projected, old event-stream ranges no running execution needs."),
    "demo": ("noetl_dagster.commands.demo:demo",
             "Run every example playbook through Dagster (embedded defaults) and show where to look next."),
    "tools": ("noetl_dagster.commands.tools:tools", "Tool kinds (built in and plugins)."),
    "worker": ("noetl_dagster.commands.worker:worker",
               "Pull tool commands from the NATS command streams and run them (the worker pool)."),
    "schema": ("noetl_dagster.commands.schema:schema",
               "Write the JSON Schema of the playbooks this project accepts (tool configs from the kinds' "
               "models); map it to playbooks in your editor (YAML extension: `yaml.schemas`)."),
}  # fmt: skip


class LazyGroup(GuardedGroup):
    """Imports a command's module only when that command runs (or its own --help is asked for)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return self._load(name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing (same limit, same truncation) from the table's texts: no command imported."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = [(n, click.Command(n, help=COMMANDS[n][1]).get_short_help_str(limit)) for n in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    @staticmethod
    def _load(name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if not target:
            return None
        mod_name, _, attr = target[0].partition(":")
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name == mod_name:  # command not built yet
                return None
            raise
        return getattr(mod, attr)


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """click's version_option message, with the version read without importlib.metadata (~20 ms)."""
    if not value or ctx.resilient_parsing:
        return
    from noetl_dagster.util.version import package_version  # noqa: PLC0415

    click.echo(f"{ctx.find_root().info_name}, version {package_version()}")
    ctx.exit()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version and exit.")  # fmt: skip
def cli() -> None:
    """Run NoETL playbooks locally or on Dagster."""


def main() -> None:
    try:
        cli.main(prog_name="noetl-dagster", standalone_mode=True)
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
