"""Rewrite legacy NoETL playbooks to the standard form (``noetl.io/v2``).

The document is edited in place on a ruamel.yaml round-trip tree, so comments,
key order and scalar styles survive wherever the construct itself survives.
Every rule is listed in ``docs/migrate.md``; in short:

* v1: ``apiVersion`` / root ``name``, ``path`` -> ``metadata``; ``workbooks``
  -> ``workbook`` entries ``{name, tool: {kind}}``; step ``type`` / ``task`` /
  ``with`` and inline tool keys -> ``tool``; ``next`` lists of ``{when, then}``
  / ``{else}`` / ``{step, with}`` -> ``next: {spec, arcs}`` with ``args``; a
  loop step whose ``next`` chain ends at an ``end_loop`` step -> one loop step
  whose pipeline holds the chain (routing inside it becomes policy rules); the
  ``end_loop`` step's ``result`` -> a task computing it; ``save`` -> storage
  tasks.
* early v2: ``case`` -> arcs + storage tasks + task policy rules; ``next``
  lists and names -> routers; ``sink`` -> a storage task; ``retry`` ->
  ``do: retry`` rules; step ``vars`` -> step ``set: {ctx.*}``; root ``vars``
  -> ``workload`` defaults; ``args`` / ``with`` -> ``input``; ``loop.mode`` ->
  ``loop.spec.mode``; ``eval`` / ``expr`` / ``set_vars`` -> ``spec.policy.rules``
  / ``when`` / ``set_ctx``; step ``when`` -> ``spec.policy.admit.rules``.
* template references are rewritten where the eras differ (``vars.x``,
  ``response`` / ``result`` in conditions and sinks, v1 task-name results,
  ``<loop>_results``).

A construct that cannot be translated faithfully is left exactly as written
and reported (file, line, reason) as ``refused``; nothing is dropped. A file
with no legacy construct comes back byte for byte, so migrating twice changes
nothing.

Package layout (one module per era or construct; see docs/migrate.md):

* ``driver``: ``_Migrator`` (rule order, scan, one step) and ``migrate_text`` / ``migrate_file``
* ``base``: ``MigratorBase``, the shared per-document state and ``note`` / ``refuse``
* ``root``, ``steps``, ``routing``, ``policies``, ``storage``, ``case``, ``loops``, ``loop_body``: the
  rules, as mixins of ``_Migrator``
* ``templates``, ``yamltree``, ``pieces``, ``sql``, ``constants``: shared helpers
* ``report``: ``MigrationNote`` / ``MigrationResult`` / ``MigrationInputError``
"""

from __future__ import annotations

from .constants import OLD_APIS, STANDARD_API
from .driver import iter_notes, migrate_file, migrate_text
from .report import MigrationInputError, MigrationNote, MigrationResult
from .templates import (
    NameRef,
    Resolver,
    TemplateRewriteError,
    conjoin,
    free_names,
    rewrite_event_names,
    rewrite_template,
    single_expression,
)

__all__ = [
    "OLD_APIS",
    "STANDARD_API",
    "MigrationInputError",
    "MigrationNote",
    "MigrationResult",
    "NameRef",
    "Resolver",
    "TemplateRewriteError",
    "conjoin",
    "free_names",
    "iter_notes",
    "migrate_file",
    "migrate_text",
    "rewrite_event_names",
    "rewrite_template",
    "single_expression",
]
