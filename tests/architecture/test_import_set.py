"""What a command imports (issue 35): a command line that starts like a native tool imports only
what the command and the playbook need. Each case runs the real ``noetl-dagster`` entry point in a
fresh interpreter (``sys.modules`` read at exit by a tiny wrapper) and fails when a module outside
the command's needs was imported. Structural, not timed: docs/capacity.md "Start-up" has the
figures, benchmarks/bench_startup.py measures them.

The heavy modules, and why none belongs in these commands:

* ``dagster`` (~1 s, the Dagster runner and code location only), ``pyarrow``, ``polars``,
  ``pandas``, ``numpy``, ``duckdb``, ``sqlalchemy``, ``pyiceberg`` (storage and data tools),
  ``psycopg`` (the postgres tool and store), ``httpx`` (the http tool and registry client),
  ``openlineage`` (a configured lineage listener), ``ruamel`` (migrate), ``jsonpath_ng``
  (flow guards): tools, stores and runners a core one-step playbook does not use;
* ``lark`` (the ``.flow`` parser): only ``.flow`` files need it;
* ``rich`` (tables and colour): neither ``--help`` nor a run whose output is not a terminal;
* ``importlib.metadata`` and ``email`` (entry-point scans, distribution metadata): ``--help`` and
  ``--version`` (which reads the version file directly);
* for ``--help`` and ``--version`` additionally the DSL (``pydantic``, ``jinja2``, ``yaml``,
  ``noetl_dagster.dsl``), ``sqlite3`` and every command module but ``main``;
* tool config models of kinds the playbook does not name (``noetl_dagster.tools.configs`` holds
  every built-in kind's model: a noop run builds no validator at all, its model accepting any mapping);
* ``jinja2`` (the template gate) for a run whose playbook renders no template, or only quick
  expressions (a dotted name, alone or with an integer literal: ``{{ workload.n * 2 }}``): the
  engine holds ``dsl.template_front``, which imports the gate at the first other template;
* ``logging`` for a run that logs nothing: the run path's loggers are ``util.lazylog.LazyLogger``;
* ``sqlite3``, ``storage.events`` and ``engine.explain`` for a local run: the local-first store opens
  the SQLite store only when it needs it;
* for ``run`` of an unchanged playbook (the parse cache answers) additionally the parser: PyYAML,
  ``noetl_dagster.dsl.parse`` and the modules only it uses (``PARSER``), and ``importlib.metadata``
  and ``email`` (pydantic's plugin scan, run when a first validator is built);
* ``socket`` (the lease's host is ``os.uname().nodename``) and ``tools.pycontext`` (a python task's
  context) for a cached one-step run;
* and ``pydantic`` itself (with ``pydantic_core``, ``annotated_types``, ``typing_inspection``), the
  ``dsl.model`` classes and the tool config models: the local runner gets the cached playbook in its
  ready-to-run form (``dsl/ready.py``) and the noop kind's config is declared to accept any mapping.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cli_probe import ONE_STEP, ROOT, probe

# heavy for every command here
HEAVY = {
    "dagster", "pyarrow", "polars", "pandas", "numpy", "duckdb", "sqlalchemy", "pyiceberg", "psycopg",
    "httpx", "openlineage", "ruamel", "jsonpath_ng", "lark", "rich",
}  # fmt: skip
# heavy for --help and --version: no playbook, no store, no metadata scan
NOT_FOR_HELP = HEAVY | {"pydantic", "jinja2", "yaml", "sqlite3", "importlib.metadata", "email"}
# the playbook parser and what only it imports: not for a run the parse cache answers
PARSER = {
    "yaml", "noetl_dagster.dsl.parse", "noetl_dagster.dsl.parse_rules", "noetl_dagster.dsl.legacy",
    "noetl_dagster.dsl.outputs", "noetl_dagster.dsl.serialize", "noetl_dagster.dsl.upstream_kinds",
    "noetl_dagster.dsl.files", "noetl_dagster.dsl.loader",
}  # fmt: skip
# the models and what defines them: not for a run of core kinds the parse cache answers
MODELS = {
    "pydantic", "pydantic_core", "annotated_types", "typing_inspection", "noetl_dagster.dsl.model",
    "noetl_dagster.tools.configs",
}  # fmt: skip


def _modules(tmp_path: Path, *args: str) -> tuple[set[str], list[str], str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")
    }
    env.update(NOETL_DAGSTER_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT),
               NOETL_DAGSTER_PLAYBOOK_CACHE=str(tmp_path / "playbook-cache"))  # fmt: skip
    env.pop("NOETL_LINEAGE_URL", None)
    _, report, out, err = probe(list(args), env)
    return set(report["modules"]), report["built"]["noetl_dagster.tools.configs"], out + err


def _loaded(modules: set[str], names: set[str]) -> list[str]:
    return sorted(m for m in modules if m in names or m.split(".")[0] in names)


def _noetl_modules(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.startswith("noetl_dagster"))


@pytest.mark.parametrize("args", [["--help"], ["--version"]], ids=["help", "version"])
def test_help_and_version_import_no_command_and_no_dsl(tmp_path, args):
    modules, _, out = _modules(tmp_path, *args)
    assert "Usage: noetl-dagster" in out or "version" in out, out
    assert _loaded(modules, NOT_FOR_HELP) == []
    assert [m for m in _noetl_modules(modules) if m.startswith("noetl_dagster.commands.")] == [
        "noetl_dagster.commands.errors",
        "noetl_dagster.commands.main",
    ]
    assert not [m for m in _noetl_modules(modules) if m.startswith("noetl_dagster.dsl")]


def test_one_step_run_imports_only_what_it_needs(tmp_path):
    pb = tmp_path / "one_step.yaml"
    pb.write_text(ONE_STEP)
    modules, configs, out = _modules(tmp_path, "run", str(pb))
    assert "completed" in out, out
    assert _loaded(modules, HEAVY) == []
    assert not [m for m in modules if m.startswith("noetl_dagster.dsl.flow")]
    assert not [m for m in modules if m.startswith(("noetl_dagster.translator", "noetl_dagster.sensors"))]
    assert "noetl_dagster.tools.kind_configs" not in modules  # the other kinds' models are not even defined
    assert "noetl_dagster.dsl.builder" not in modules  # the builder API: generated playbooks only
    assert configs == [], configs  # the noop model accepts any mapping: no validator built


def test_a_cached_one_step_run_imports_no_parser_and_no_metadata_scan(tmp_path):
    pb = tmp_path / "one_step.yaml"
    pb.write_text(ONE_STEP)
    first, _, out = _modules(tmp_path, "run", str(pb))  # a miss: parsed, validated, cached
    assert "completed" in out, out
    assert "noetl_dagster.dsl.parse" in first
    modules, configs, out = _modules(tmp_path, "run", str(pb))  # a hit
    assert "completed" in out, out
    assert _loaded(modules, PARSER | {"importlib.metadata", "email", "pydantic.plugin._loader"}) == []
    assert _loaded(modules, HEAVY) == []
    assert configs == [], configs
    assert _loaded(modules, MODELS) == []  # the ready-to-run form: no pydantic at all
    assert "noetl_dagster.dsl.ready" in modules
    # the lease's host is uname's nodename (socket's enums ~1.5 % of the run); a python task's context
    assert _loaded(modules, {"socket", "_socket", "selectors", "noetl_dagster.tools.pycontext"}) == []
    # the template gate (Jinja2, ~25 ms): `{{ workload.n * 2 }}` is a quick expression (dsl/template_front.py);
    # logging (~4 ms): the run path's loggers are util.lazylog's, `logging` imported at a first record
    assert _loaded(modules, {"jinja2", "markupsafe", "noetl_dagster.dsl.templates", "logging"}) == []
    # SQLite and its store (with the explain summaries it maintains): a local run opens none (~5 ms)
    assert _loaded(modules, {"sqlite3", "noetl_dagster.storage.events", "noetl_dagster.engine.explain"}) == []
    # decimal (jsonutil checks a Decimal only once decimal exists), base64 and secrets (signed references
    # and a python task's base64 code import them when used)
    assert _loaded(modules, {"decimal", "_decimal", "base64", "secrets"}) == []


def test_a_cached_run_of_core_kinds_imports_no_pydantic(tmp_path):
    """Control flow, a loop, a policy, `set:`, a workbook entry and a python task, in the form the
    cache hands the runner: the core kinds' configs are declared plain (dsl/kinds.py ``plain_config``),
    so none is validated by pydantic unless a value falls outside the declaration."""
    pb = tmp_path / "core.yaml"
    pb.write_text(CORE_KINDS)
    for _ in range(2):  # a miss, then a hit
        modules, _, out = _modules(tmp_path, "run", "--json", str(pb))  # no table: rich is not the point
        assert '"completed"' in out and '"twice":4' in out, out
    assert _loaded(modules, MODELS | PARSER | HEAVY) == []
    assert "noetl_dagster.tools.core" in modules and "noetl_dagster.dsl.ready" in modules


CORE_KINDS = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: core_kinds, path: tests/core_kinds}
workload: {items: [1, 2, 3], limit: 2}
workbook:
  - name: echo
    tool: {kind: noop, result: "{{ input.v }}"}
workflow:
  - step: start
    tool: {kind: noop, result: {n: "{{ workload.limit }}"}}
    set: {ctx.seen: 0}
    next:
      arcs:
        - {step: each, when: "{{ workload.limit > 1 }}"}
        - {step: done}
  - step: each
    loop: {in: "{{ workload.items }}", iterator: item}
    tool:
      - kind: noop
        result: "{{ item * 10 }}"
        policy:
          - when: "{{ outcome.status == 'error' }}"
            then: {do: retry, attempts: 2}
    next: {arcs: [{step: lookup}]}
  - step: lookup
    tool: {kind: workbook, name: echo, input: {v: "{{ workload.limit }}"}}
    next: {arcs: [{step: compute}]}
  - step: compute
    tool:
      kind: python
      input: {n: "{{ workload.limit }}"}
      code: |
        result = {"twice": n * 2}
    next: {arcs: [{step: done}]}
  - step: done
    tool: {kind: noop}
"""


def test_validate_imports_no_tool_and_no_engine(tmp_path):
    pb = tmp_path / "one_step.yaml"
    pb.write_text(ONE_STEP)
    modules, _, out = _modules(tmp_path, "validate", str(pb))
    assert "1 playbook(s) valid" in out, out
    assert _loaded(modules, HEAVY | {"sqlite3"}) == []
    assert not [
        m for m in _noetl_modules(modules) if m.startswith(("noetl_dagster.tools", "noetl_dagster.engine"))
    ]


def test_a_run_that_renders_no_template_imports_no_jinja2(tmp_path):
    pb = tmp_path / "no_template.yaml"
    pb.write_text(ONE_STEP.replace('"{{ workload.n * 2 }}"', "4"))
    for _ in range(2):  # a miss (the parser checks templates: Jinja2) and a hit
        modules, _, out = _modules(tmp_path, "run", str(pb))
        assert "completed" in out, out
    assert _loaded(modules, {"jinja2", "markupsafe", "noetl_dagster.dsl.templates"}) == []
    assert _loaded(modules, HEAVY | PARSER) == []
    pb.write_text(ONE_STEP)  # a quick expression (`{{ workload.n * 2 }}`): rendered without the gate
    for _ in range(2):
        modules, _, out = _modules(tmp_path, "run", str(pb))
    assert "completed" in out and "│ 4 " in out, out
    assert _loaded(modules, {"jinja2", "markupsafe", "noetl_dagster.dsl.templates"}) == []
    pb.write_text(
        ONE_STEP.replace("workload.n * 2", "workload.n | string")
    )  # a filter: the gate, at its render
    for _ in range(2):
        modules, _, out = _modules(tmp_path, "run", str(pb))
    assert "completed" in out and "jinja2" in modules and "noetl_dagster.dsl.templates" in modules
