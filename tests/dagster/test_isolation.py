"""Issue 22.1: one broken playbook never takes the code location down.

Loaded the way ``dagster dev`` / ``dg`` load a project (``load_from_defs_folder`` over a
defs.yaml of the component): every valid playbook keeps its jobs, the router sensor keeps
routing, and the broken file is an asset whose description and failing check carry
``FILE:LINE: RULE: message``, with one warning line in the load log. A reload after the
file breaks (or is fixed) shows the new state.
"""

from __future__ import annotations

import logging
import sys
import textwrap
import uuid

import dagster as dg
import pytest
from dagster_helpers import EXAMPLES

from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.translator.build import INVALID_CHECK, compile_playbooks
from noetl_dagster.translator.runner import run_playbook_dagster

BAD = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: bad, path: t/bad}\nworkflow:\n  - step: start\n    tool: {kind: teleport}\n"
BAD_ISSUE = "bad.yaml:6: unknown-tool-kind: workflow[0].tool.kind: tool kind 'teleport' is not recognized"


@pytest.fixture
def project(tmp_path, dagster_data):
    """A dg project on disk (pyproject [tool.dg], <module>/defs/playbooks/defs.yaml) with one good playbook."""
    module = f"isoproj_{uuid.uuid4().hex[:8]}"
    root = tmp_path / "proj"
    (root / module / "defs" / "playbooks" / "playbooks").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "{module}"\nversion = "0"\n\n[tool.dg]\ndirectory_type = "project"\n\n'
        f'[tool.dg.project]\nroot_module = "{module}"\n'
    )
    (root / module / "__init__.py").write_text("")
    (root / module / "defs" / "__init__.py").write_text("")
    (root / module / "defs" / "playbooks" / "defs.yaml").write_text(textwrap.dedent(f"""\
        type: noetl_dagster.NoetlPlaybooksComponent
        attributes:
          playbooks_dir: playbooks
          data_dir: {dagster_data}
          tenant: acme
          project: iso
        """))  # fmt: skip
    pbs = root / module / "defs" / "playbooks" / "playbooks"
    (pbs / "hello.yaml").write_text((EXAMPLES / "hello_dagster.yaml").read_text())
    sys.path.insert(0, str(root))
    yield root / module, pbs
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m.startswith(module)]:
        del sys.modules[name]


def _load(module_dir) -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=module_dir)


def _check_result(defs: dg.Definitions, key: dg.AssetKey):
    job = defs.resolve_implicit_global_asset_job_def()
    with dg.instance_for_test() as instance:
        res = job.execute_in_process(instance=instance, raise_on_error=False)  # the checks of the location
        evals = [e for e in res.get_asset_check_evaluations() if e.asset_key == key]
    assert res.success  # the check ran; it is the check that fails, not the run
    return evals


def test_a_broken_playbook_is_an_asset_with_a_failing_check(project, dagster_data, caplog):
    module_dir, pbs = project
    (pbs / "bad.yaml").write_text(BAD)
    with caplog.at_level(logging.WARNING, logger="noetl_dagster.translator"):
        defs = _load(module_dir)
    jobs = {j.name for j in defs.resolve_all_job_defs()}
    assert "hello_dagster" in jobs and not any("bad" in j for j in jobs)
    assert "noetl_router" in {s.name for s in defs.sensors}

    key = dg.AssetKey(["noetl_invalid_playbook", "bad"])
    spec = defs.resolve_assets_def(key).specs_by_key[key]
    assert BAD_ISSUE in spec.description and "INVALID" in spec.description
    assert BAD_ISSUE in spec.metadata["noetl/errors"].value
    (ev,) = _check_result(defs, key)
    assert ev.check_name == INVALID_CHECK and not ev.passed and BAD_ISSUE in ev.description

    lines = [r.getMessage() for r in caplog.records if "bad.yaml" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0] and BAD_ISSUE in lines[0]
    assert "Traceback" not in caplog.text

    # the router still routes the valid playbook's detached executions
    eid = run_playbook_dagster(
        pbs / "hello.yaml", {"name": "iso"}, data_dir=dagster_data, detach=True
    ).execution_id
    sensor = next(s for s in defs.sensors if s.name == "noetl_router")
    with dg.instance_for_test() as instance:
        ctx = dg.build_sensor_context(
            instance=instance, resources={"noetl": NoetlResource(data_dir=str(dagster_data))}
        )
        result = sensor(ctx)
    (req,) = result.run_requests
    assert req.job_name == "hello_dagster" and req.tags["noetl/execution_id"] == eid


def test_reload_shows_a_playbook_that_breaks_and_heals(project):
    module_dir, pbs = project
    good = (pbs / "hello.yaml").read_text()
    assert "hello_dagster" in {j.name for j in _load(module_dir).resolve_all_job_defs()}

    (pbs / "hello.yaml").write_text(good.replace("kind: python", "kind: teleport", 1))  # broken while running
    defs = _load(module_dir)
    assert "hello_dagster" not in {j.name for j in defs.resolve_all_job_defs()}
    key = dg.AssetKey(["noetl_invalid_playbook", "hello"])
    assert "unknown-tool-kind" in defs.resolve_assets_def(key).specs_by_key[key].description

    (pbs / "hello.yaml").write_text(good)  # fixed: the job is back, the invalid asset gone
    defs = _load(module_dir)
    assert "hello_dagster" in {j.name for j in defs.resolve_all_job_defs()}
    assert key not in defs.resolve_asset_graph().get_all_asset_keys()


def test_on_error_modes_and_compile_errors(tmp_path, dagster_data, caplog):
    (tmp_path / "good.yaml").write_text((EXAMPLES / "hello_dagster.yaml").read_text())
    (tmp_path / "bad.yaml").write_text(BAD)
    # a file that parses but does not compile (bad dagster mode) is contained the same way
    (tmp_path / "odd.yaml").write_text((EXAMPLES / "hello_dagster.yaml").read_text()
                                       .replace("name: hello_dagster", "name: odd")
                                       .replace("path: examples/hello_dagster", "path: t/odd")
                                       + "\nexecutor:\n  spec:\n    dagster: {mode: sideways}\n")  # fmt: skip
    res = NoetlResource(data_dir=str(dagster_data))
    with caplog.at_level(logging.WARNING, logger="noetl_dagster.translator"):
        skipped = compile_playbooks(tmp_path, on_error="skip", include_sensor=False, resource=res)
    assert [c.path for c in skipped.index.playbooks] == ["examples/hello_dagster"]
    assert len(skipped.index.errors) == 2
    assert sum("skipped" in r.getMessage() for r in caplog.records) == 2  # not silent
    assert not skipped.definitions.resolve_asset_graph().get_all_asset_keys()

    reported = compile_playbooks(tmp_path, on_error="report", include_sensor=False, resource=res)
    keys = {k.path[-1] for k in reported.definitions.resolve_asset_graph().get_all_asset_keys()}
    assert keys == {"bad", "odd"}
    assert (
        reported.index.find_invalid(str(tmp_path / "odd.yaml"))
        .issues[0]
        .startswith(str(tmp_path / "odd.yaml"))
    )
