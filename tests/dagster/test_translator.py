"""The translator: job layout (SCC condensation, fan-in joins), names, tags,
descriptions, code references, kinds, schedules, customisation, the per-step
layout and the code location (component + ``dagster definitions validate``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import pytest
from dagster_helpers import EXAMPLES, REPO

from noetl_dagster.dsl import PlaybookInvalid, load_playbook
from noetl_dagster.translator import NoetlTranslator, build_playbook_definitions, compile_playbooks
from noetl_dagster.translator.naming import NAME_RE
from noetl_dagster.translator.plan import plan_job


def _location(*paths, **kw):
    kw.setdefault("include_sensor", False)
    return compile_playbooks(list(paths), **kw)


def _job(loc, name: str) -> dg.JobDefinition:
    return loc.definitions.resolve_job_def(name)


def _upstream(job: dg.JobDefinition, op: str) -> set[str]:
    return {h.node_name for h in job.dependency_structure.all_upstream_outputs_from_node(op)}


def test_cycle_condenses_to_one_region_op():
    loc = _location(EXAMPLES / "countdown_cycle.yaml")
    job = _job(loc, "countdown_cycle")
    names = {n.name for n in job.nodes}  # readable in the job: no <job>__ prefix
    assert names == {"noetl_start", "start", "cycle__check", "liftoff"}
    assert {n.definition.name for n in job.nodes} == {  # definitions stay unique in the code location
        "countdown_cycle__noetl_start",
        "countdown_cycle__start",
        "countdown_cycle__cycle__check",
        "countdown_cycle__liftoff",
    }
    region = job.graph.node_named("cycle__check").definition
    assert region.tags["noetl/step"] == "check,tick"
    assert _upstream(job, "liftoff") == {"cycle__check"}


def test_join_is_one_fan_in_input_over_every_predecessor():
    loc = _location(EXAMPLES / "fanout_join.yaml")
    job = _job(loc, "fanout_join")
    merge = "merge"
    assert _upstream(job, merge) == {"count_regions", "name_regions", "fast", "slow"}
    deps = {getattr(k, "alias", None) or getattr(k, "name", k): v for k, v in job.graph.dependencies.items()}
    fan_in = deps[merge]["after"]
    # one fan-in input, so Dagster runs the join when at least one branch yields (and skips it when none does)
    assert isinstance(fan_in, dg.MultiDependencyDefinition)
    assert len(fan_in.get_dependencies_and_mappings()) == 4
    outs = {o.name: o for o in job.graph.node_named("choose").definition.output_defs}
    assert set(outs) == {"to_fast", "to_slow", "result"}
    assert all(not o.is_required for o in outs.values())


def test_tags_descriptions_kinds_and_code_references():
    loc = _location(EXAMPLES / "customers_http.yaml")
    job = _job(loc, "customers_http")
    assert job.tags["noetl/playbook"] == "examples/customers_http"
    assert {"noetl/tenant", "noetl/project"} <= set(job.tags)
    assert "loopback stub" in job.description
    refs = job.metadata["dagster/code_references"].code_references
    assert refs[0].file_path == str((EXAMPLES / "customers_http.yaml").resolve())
    pb = load_playbook(EXAMPLES / "customers_http.yaml")
    op = job.graph.node_named("customer_stats").definition
    assert op.description == "One GET per customer, in parallel"
    assert op.tags["noetl/step"] == "customer_stats"
    assert op.tags["noetl/kind"] == "http"
    assert op.tags["noetl/source"] == f"customers_http.yaml:{pb.step('customer_stats').line}"
    assert "dagster/kind/http" in op.tags and "dagster/kind/noetl" in op.tags
    start = job.graph.node_named("noetl_start").definition
    assert set(start.config_schema.config_type.fields) == {"workload", "workload_json", "execution_id"}


def test_launchpad_config_is_typed_from_the_workload():
    loc = _location(EXAMPLES / "hello_dagster.yaml")
    start = _job(loc, "hello_dagster").graph.node_named("noetl_start").definition
    fields = start.config_schema.config_type.fields["workload"].config_type.fields
    assert fields["name"].config_type.given_name == "String" and fields["name"].default_value == "Dagster"
    assert fields["times"].config_type.given_name == "Int" and fields["times"].default_value == 3


def test_fifty_playbooks_with_clashing_names_load_together(tmp_path):
    steps = ["start", "load data", "load-data", "noetl_start", "2nd step", "x" * 80]
    body = ""
    for i, s in enumerate(steps):
        nxt = f"\n    next: {{arcs: [{{step: {steps[i + 1]!r}}}]}}" if i + 1 < len(steps) else ""
        body += f"  - step: {s!r}\n    tool: {{kind: noop}}{nxt}\n"
    for i in range(50):
        name = ["etl", "etl__x", "etl x", "Ünïcode-job", "job"][i % 5]
        (tmp_path / f"p{i}.yaml").write_text(
            f"apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {{name: {name!r}, path: p/{i}}}\nworkflow:\n{body}"
        )
    loc = compile_playbooks(tmp_path, include_sensor=True)
    defs = loc.definitions
    dg.Definitions.validate_loadable(defs)
    jobs = defs.resolve_all_job_defs()
    assert len(jobs) == 50
    ops = [n.definition.name for j in jobs for n in j.nodes]
    assert len(ops) == len(set(ops)) == 50 * (len(steps) + 1)
    assert all(NAME_RE.match(n) for n in ops + [j.name for j in jobs])


def test_translator_customisation_with_replace_and_merge():
    class Custom(NoetlTranslator):
        def get_job_spec(self, data):
            return (
                super().get_job_spec(data).replace_attributes(description="custom", executor="multiprocess")
            )

        def get_op_spec(self, data):
            spec = super().get_op_spec(data)
            if "duckdb" in data.kinds:
                spec = spec.merge_attributes(tags={"team": "analytics"}, kinds={"sql"})
            return spec

    loc = _location(EXAMPLES / "orders_duckdb.yaml", translator=Custom())
    job = _job(loc, "orders_duckdb")
    assert job.description == "custom"
    assert job.executor_def.name == "multiprocess"
    op = job.graph.node_named("by_region").definition
    assert op.tags["team"] == "analytics" and "dagster/kind/sql" in op.tags
    assert "team" not in job.graph.node_named("report").definition.tags


def test_schedule_from_executor_spec():
    loc = _location(EXAMPLES / "nightly_report.yaml")
    (sched,) = loc.definitions.schedules
    assert sched.name == "nightly_report__schedule"
    assert sched.cron_schedule == "0 2 * * *" and sched.execution_timezone == "UTC"
    assert sched.job_name == "nightly_report"
    cfg = sched.evaluate_tick(dg.build_schedule_context()).run_requests[0].run_config
    assert cfg["ops"]["noetl_start"]["config"]["workload_json"] == '{"days": 7}'


@pytest.mark.parametrize(
    ("schedule", "message"),
    [("{cron: '* * * * *', every: 5}", "unknown keys ['every']"), ("{timezone: UTC}", "needs `cron`")],
)
def test_bad_schedule_is_a_clear_error(tmp_path, schedule, message):
    p = tmp_path / "s.yaml"
    p.write_text(
        textwrap.dedent(f"""
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {{name: s, path: t/s}}
        executor: {{spec: {{schedule: {schedule}}}}}
        workflow:
          - step: start
            tool: {{kind: noop}}
    """)
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        _location(p)


def test_per_step_mode_gives_each_step_its_own_job():
    loc = _location(EXAMPLES / "fanout_join.yaml", mode="per_step")
    names = sorted(j.name for j in loc.definitions.resolve_all_job_defs())
    pb = load_playbook(EXAMPLES / "fanout_join.yaml")
    assert names == sorted(["fanout_join", *(f"fanout_join__step__{s.name}" for s in pb.workflow)])
    assert [n.name for n in _job(loc, "fanout_join").nodes] == ["noetl_start"]
    step_job = _job(loc, "fanout_join__step__merge")
    assert step_job.tags["noetl/step"] == "merge"


def test_a_separate_step_leaves_the_main_job():
    plan = plan_job(load_playbook(EXAMPLES / "failure_recovery.yaml"))
    assert plan.separate == ["archive"]
    assert "step:archive" not in plan.nodes
    assert "step:audit" in plan.roots  # reached again through a resumed run


def test_invalid_playbook_raises_or_is_skipped(tmp_path):
    good = (EXAMPLES / "hello_dagster.yaml").read_text()
    (tmp_path / "good.yaml").write_text(good)
    (tmp_path / "bad.yaml").write_text(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: bad, path: t/bad}\nworkflow:\n"
        "  - step: start\n    tool: {kind: teleport}\n"
    )
    (tmp_path / "not_a_playbook.yaml").write_text("load_from: []\n")
    (tmp_path / "worse.yaml").write_text((tmp_path / "bad.yaml").read_text())
    with pytest.raises(PlaybookInvalid) as e:
        build_playbook_definitions(tmp_path)
    assert "bad.yaml:6" in str(e.value.issues[0]) and "worse.yaml:6" in str(
        e.value
    )  # every broken file at once
    (tmp_path / "worse.yaml").unlink()
    loc = compile_playbooks(tmp_path, on_error="skip", include_sensor=False)
    assert [c.path for c in loc.index.playbooks] == ["examples/hello_dagster"]
    assert len(loc.index.errors) == 1 and "teleport" in loc.index.errors[0]


def test_example_code_location_through_its_component():
    import example_project.definitions as ep

    defs = ep.defs()
    jobs = {j.name for j in defs.resolve_all_job_defs()}
    assert {"hello_dagster", "countdown_cycle", "per_step_pipeline__step__combine"} <= jobs
    assert "noetl_router" in {s.name for s in defs.sensors}
    assert "nightly_report__schedule" in {s.name for s in defs.schedules}
    assert len(list(EXAMPLES.glob("*.yaml"))) >= 8


@pytest.mark.slow
def test_dagster_definitions_validate_on_the_example_project(tmp_path):
    bindir = Path(sys.executable).parent
    env = {**os.environ, "NOETL_DAGSTER_HOME": str(tmp_path / "noetl")}
    env.pop("DAGSTER_HOME", None)
    out = subprocess.run(
        [str(bindir / "dagster"), "definitions", "validate", "-w", str(REPO / "example_project" / "workspace.yaml")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "All code locations passed validation" in out.stdout + out.stderr


def test_stored_tables_are_assets_with_lineage():
    loc = _location(EXAMPLES / "sales_tables.yaml")
    specs = {s.key.to_user_string(): s for s in loc.definitions.resolve_all_asset_specs()}
    daily, totals = specs["sales/daily_sales"], specs["sales/region_totals"]
    assert [d.asset_key for d in totals.deps] == [daily.key]  # read first in the same step
    assert daily.metadata["noetl/uri"] == "noetl://demo/examples/sales/dataset/daily_sales"
    assert "parquet" in daily.kinds and daily.group_name == "sales"  # executor.spec.dagster.group
    pb = load_playbook(EXAMPLES / "sales_tables.yaml")
    ref = daily.metadata["dagster/code_references"].code_references[0]
    assert ref.line_number == pb.step("store_daily").outputs[0].line  # the outputs entry declaring it


def test_kubernetes_placement_becomes_op_tags(tmp_path):
    p = tmp_path / "k.yaml"
    p.write_text(
        textwrap.dedent("""
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: k, path: t/k}
        executor:
          spec:
            profiles: {big: {resources: {cpu: 2, memory: 4Gi}}}
        workflow:
          - step: start
            spec: {profile: big}
            tool: {kind: noop}
            next: {arcs: [{step: light}]}
          - step: light
            tool: {kind: noop}
    """)
    )
    job = _job(_location(p), "k")
    heavy = job.graph.node_named("start").definition.tags
    cfg = json.loads(heavy["dagster-k8s/config"])
    assert cfg["container_config"]["resources"]["requests"] == {"cpu": "2", "memory": "4Gi"}
    assert "dagster-k8s/config" not in job.graph.node_named("light").definition.tags


def _table_playbook(path: Path, name: str, uri: str) -> Path:
    path.write_text(textwrap.dedent(f"""\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {{name: {name}, path: tests/{name}}}
        workflow:
          - step: start
            outputs:
              - uri: {uri}
            tool:
              - store: {{kind: python, code: "result = 1"}}
        """))  # fmt: skip
    return path


def test_asset_keys_leave_out_tenant_and_project_by_default_and_the_scope_is_a_translator_option(tmp_path):
    p = _table_playbook(tmp_path / "a.yaml", "a", "noetl://acme/lab/sales/dataset/daily/orders")

    def keys(translator=None):
        return {k.to_user_string() for k in compile_playbooks([p], translator, include_sensor=False)
                .definitions.resolve_all_asset_keys()}  # fmt: skip

    assert keys() == {"sales/daily/orders"}
    assert keys(NoetlTranslator(asset_key_scope="name")) == {"daily/orders"}
    assert keys(NoetlTranslator(asset_key_scope="tenant", asset_key_prefix=["lake"])) == {
        "lake/acme/lab/sales/daily/orders"
    }
    with pytest.raises(ValueError, match="asset_key_scope 'tenants'"):
        NoetlTranslator(asset_key_scope="tenants")


def test_two_tenants_tables_under_one_key_fail_the_load_naming_both(tmp_path):
    a = _table_playbook(tmp_path / "a.yaml", "a", "noetl://acme/lab/sales/dataset/orders")
    b = _table_playbook(tmp_path / "b.yaml", "b", "noetl://other/lab/sales/dataset/orders")
    with pytest.raises(ValueError, match=r"noetl://acme/lab/sales/dataset/orders and noetl://other/lab/sales/"
                       r"dataset/orders both have asset key sales/orders"):  # fmt: skip
        compile_playbooks([a, b], include_sensor=False)
    both = compile_playbooks([a, b], NoetlTranslator(asset_key_scope="tenant"), include_sensor=False)
    assert {k.to_user_string() for k in both.definitions.resolve_all_asset_keys()} == {
        "acme/lab/sales/orders",
        "other/lab/sales/orders",
    }
