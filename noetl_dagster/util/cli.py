"""Usage errors in one line, for both commands (``noetl-dagster``, ``noetl-registry``).

Click prints a usage error as three lines or more (``Usage: …``, ``Try … for help.``, a blank
line, ``Error: …``). :class:`OneLineUsageGroup` turns every usage error raised while parsing the
group's own options or any sub-command's (nested groups included: they run inside this
group's ``invoke``) into ``error: <message> (see '<command> --help')`` on stderr, exit 2.
A group called with no arguments still shows its help.
"""

from __future__ import annotations

from typing import Any

import click

EXIT_USAGE = 2


class UsageLine(click.UsageError):
    """A usage error shown as one ``error:`` line."""

    exit_code = EXIT_USAGE

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def one_line_usage(e: click.UsageError) -> click.UsageError:
    """``e`` as a :class:`UsageLine` (itself when it already is one, or when it is a request for help)."""
    if (
        isinstance(e, UsageLine) or type(e).__name__ == "NoArgsIsHelpError"
    ):  # click >= 8.2: help, not an error
        return e
    message = " ".join(e.format_message().split())  # a message never spans lines
    if e.ctx is not None:
        message += f" (see '{e.ctx.command_path} --help')"
    return UsageLine(message, e.ctx)


class OneLineUsageGroup(click.Group):
    """A click group whose usage errors, and those of every sub-command, are one line (exit 2)."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:  # fmt: skip
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as e:
            raise one_line_usage(e) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            raise one_line_usage(e) from None
