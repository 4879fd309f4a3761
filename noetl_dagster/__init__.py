"""noetl_dagster.

``noetl_dagster.NoetlPlaybooksComponent`` is the ``dg`` component (registered through the
``dagster_dg_cli.registry_modules`` entry point). It is resolved on first access so that the
engine and DSL layers import without Dagster.
"""

from typing import Any

_COMPONENTS = {"NoetlPlaybooksComponent"}


def __getattr__(name: str) -> Any:
    if (
        name == "__version__"
    ):  # one place: pyproject.toml's [project] version, read from the installed metadata
        from noetl_dagster.util.version import package_version  # noqa: PLC0415

        return package_version()
    if name in _COMPONENTS:
        from noetl_dagster.translator import component  # noqa: PLC0415 - the Dagster layer, only when asked

        return getattr(component, name)
    raise AttributeError(f"module 'noetl_dagster' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _COMPONENTS)
