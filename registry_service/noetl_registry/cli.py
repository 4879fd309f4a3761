"""``noetl-registry``: serve the registry, manage API keys, apply migrations.

noetl-registry serve --db postgresql://... --host 127.0.0.1 --port 8780
noetl-registry keys create --db sqlite:///reg.db --tenant acme [--project lab]   # prints the key
"""

from __future__ import annotations

import json
import sqlite3
import sys
from typing import Any

import click

from noetl_dagster.util.cli import OneLineUsageGroup
from noetl_dagster.util.extras import extra_for_module, install_hint
from noetl_registry.errors import RegistryError

# the same exit codes as noetl-dagster: 0 ok, 1 failed, 2 bad input (options, database URL, unreachable database)
EXIT_BAD_INPUT = 2
CONNECT_TIMEOUT_S = 10


class BadInput(click.ClickException):
    exit_code = EXIT_BAD_INPUT

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def _one_line(e: BaseException) -> str:
    text = (str(e).strip().splitlines() or [""])[0][:400]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class _Guarded(OneLineUsageGroup):
    """No traceback from any sub-command: one ``error:`` line, exit 2 (bad input, usage) or 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit, KeyboardInterrupt):
            raise
        except RegistryError as e:
            raise BadInput(e.message) from None
        except ModuleNotFoundError as e:  # an extra that is not installed (serve: [registry-server])
            extra = extra_for_module(e.name)
            if extra is None:
                raise click.ClickException(f"internal error: {_one_line(e)}") from None
            what = f"`noetl-registry {ctx.invoked_subcommand}`" if ctx.invoked_subcommand else "this command"
            raise BadInput(f"{what} needs the {extra!r} extra: {install_hint(extra)}") from None
        except (
            OSError,
            ValueError,
            TypeError,
            LookupError,
            OverflowError,
            RecursionError,
            sqlite3.Error,
        ) as e:
            raise BadInput(_one_line(e)) from None
        except Exception as e:  # noqa: BLE001 - the last line of defence
            mod = type(e).__module__ or ""
            if mod.startswith(("psycopg", "psycopg_pool")):
                raise BadInput(_one_line(e)) from None
            raise click.ClickException(f"internal error: {_one_line(e)}") from None


def _preflight(db: str) -> None:
    """An unreachable Postgres fails here after CONNECT_TIMEOUT_S, not in a pool that retries for ever."""
    if not db.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
        return
    import psycopg  # noqa: PLC0415

    dsn = db.replace("postgresql+psycopg://", "postgresql://", 1)
    try:
        psycopg.connect(dsn, connect_timeout=CONNECT_TIMEOUT_S).close()
    except Exception as e:  # noqa: BLE001
        raise BadInput(f"cannot reach registry database: {_one_line(e)}") from None


DB_HELP = "sqlite:///path, a path, or postgresql://... (default: $NOETL_DAGSTER_HOME/registry.db)"


def _registry(db: str | None):
    from noetl_registry.service import Registry  # noqa: PLC0415

    if db:
        _preflight(db)
    try:
        return Registry(db or None)
    except Exception as e:  # noqa: BLE001 - bad URL, unreachable server: one clear line, exit 2
        raise BadInput(f"cannot open registry database {db or '(default)'}: {_one_line(e)}") from None


@click.group(cls=_Guarded, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """NoETL Resource Registry service."""


@cli.command()
@click.option("--db", default=None, help=DB_HELP)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8780, type=click.IntRange(1, 65535), show_default=True)
@click.option("--log-level", default="warning", show_default=True)
def serve(db: str | None, host: str, port: int, log_level: str) -> None:
    """Run the HTTP service (OpenAPI docs at /docs)."""
    import uvicorn  # noqa: PLC0415

    from noetl_registry.app import create_app  # noqa: PLC0415

    app = create_app(_registry(db))
    click.echo(f"noetl-registry on http://{host}:{port} (docs: /docs)", err=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level)


@cli.command()
@click.option("--db", default=None, help=DB_HELP)
def migrate(db: str | None) -> None:
    """Create or upgrade the schema and print its version."""
    reg = _registry(db)
    click.echo(f"schema version {reg.store.schema_version()} ({reg.store.dialect})")
    reg.close()


@cli.group()
def keys() -> None:
    """API keys: each is bound to one tenant and optionally one project."""


@keys.command("create")
@click.option("--db", default=None, help=DB_HELP)
@click.option("--tenant", required=True)
@click.option("--project", default=None, help="restrict the key to one project")
@click.option("--label", default=None)
def keys_create(db: str | None, tenant: str, project: str | None, label: str | None) -> None:
    """Create a key and print it (only its hash is stored; it cannot be shown again)."""
    reg = _registry(db)
    try:
        _, key = reg.create_api_key(tenant, project, label=label)
    except RegistryError as e:
        raise BadInput(e.message) from None
    finally:
        reg.close()
    click.echo(key)


@keys.command("list")
@click.option("--db", default=None, help=DB_HELP)
@click.option("--tenant", default=None)
def keys_list(db: str | None, tenant: str | None) -> None:
    """List keys (ids and scopes, never secrets) as JSON lines."""
    reg = _registry(db)
    for info in reg.list_api_keys(tenant):
        click.echo(json.dumps(info.model_dump()))
    reg.close()


@keys.command("revoke")
@click.option("--db", default=None, help=DB_HELP)
@click.argument("key_id")
def keys_revoke(db: str | None, key_id: str) -> None:
    """Revoke a key by its id (the part after 'nrk_')."""
    reg = _registry(db)
    try:
        reg.revoke_api_key(key_id)
    except RegistryError as e:
        raise BadInput(e.message) from None
    finally:
        reg.close()
    click.echo(f"revoked {key_id}")


def main() -> None:
    try:
        cli.main(prog_name="noetl-registry", standalone_mode=True)
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
