"""One line per error, never a traceback, and the same exit codes everywhere.

Exit codes: 0 ok, 1 an invalid or failed playbook (or an internal error),
2 bad input (usage, missing or unreadable file, malformed YAML/JSON, bad
option values, an unreachable or unusable store). ``GuardedGroup`` wraps
every sub-command so an exception that escapes a command becomes one
``error: ...`` line on stderr with the right exit code.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import click

from noetl_dagster.util.cli import OneLineUsageGroup
from noetl_dagster.util.extras import MissingExtra, extra_for_module, install_hint

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2

# what a user can get wrong: files, values, stores (exit 2)
_BAD_INPUT: tuple[type[BaseException], ...] = (
    OSError,
    ValueError,  # includes UnicodeError, json.JSONDecodeError, YAML errors, pydantic errors
    TypeError,
    KeyError,
    LookupError,
    OverflowError,
    RecursionError,
    MemoryError,
)


class BadInput(click.ClickException):
    """A refused input: ``error: message`` on stderr, exit 2."""

    exit_code = EXIT_BAD_INPUT

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class Failed(click.ClickException):
    """An invalid or failed playbook, or an internal error: exit 1."""

    exit_code = EXIT_FAILED

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def one_line(exc: BaseException, limit: int = 400) -> str:
    """``Type: first line of the message`` (truncated), without secrets in URLs."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, KeyError) and exc.args:
        text = str(exc.args[0])
    text = re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", text)  # user:password@host
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


def _is_sqlite_error(exc: BaseException) -> bool:
    """sqlite3.Error, without importing sqlite3 for a command that never opened a database."""
    sqlite3 = sys.modules.get("sqlite3")
    return sqlite3 is not None and isinstance(exc, sqlite3.Error)


def _is_store_error(exc: BaseException) -> bool:
    """A database or object store the user pointed at that cannot be used (unreachable, wrong kind)."""
    mod = type(exc).__module__ or ""
    name = type(exc).__name__
    return mod.startswith(("psycopg", "sqlalchemy", "botocore", "noetl_dagster.storage")) or name.endswith(
        "Unavailable"
    )


def convert(exc: BaseException, command: str | None = None) -> click.ClickException:
    from noetl_dagster.engine.recorder import RecordingFailed  # noqa: PLC0415 - only when a command failed

    if isinstance(exc, RecordingFailed):  # the execution failed and not even that could be recorded (exit 1)
        return Failed(one_line(exc, limit=1000).removeprefix("RecordingFailed: "))
    chain = sys.modules.get("noetl_dagster.engine.chain")
    if chain is not None and isinstance(exc, chain.LogTampered):  # an altered log or archive (exit 1)
        return Failed(str(exc).strip().splitlines()[0])
    if isinstance(exc, MissingExtra):  # already the one-line hint, naming the capability
        return BadInput(str(exc))
    extra = extra_for_module(exc.name) if isinstance(exc, ModuleNotFoundError) else None
    if extra:  # an optional capability that is not installed: say which extra, not the ImportError
        what = f"`noetl-dagster {command}`" if command else "this command"
        return BadInput(
            f"{what} needs the {extra!r} extra: {install_hint(extra)} (module {exc.name} is missing)"
        )
    if isinstance(exc, RecursionError):
        return BadInput("input is nested too deeply")
    if isinstance(exc, _BAD_INPUT) or _is_sqlite_error(exc) or _is_store_error(exc):
        return BadInput(one_line(exc))
    return Failed(f"internal error: {one_line(exc)}")


class GuardedGroup(OneLineUsageGroup):
    """A click group whose sub-commands never end in a traceback (and whose usage errors are one line)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - the last line of defence; see module docstring
            raise convert(e, ctx.invoked_subcommand) from None
