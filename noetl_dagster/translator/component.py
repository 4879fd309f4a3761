"""A Dagster Component: add playbooks to a ``dg`` project without Python.

Scaffold one with ``dg scaffold defs noetl_dagster.NoetlPlaybooksComponent my_playbooks``
(a ``defs.yaml`` and a sample playbook), or write ``defs/<name>/defs.yaml``::

    type: noetl_dagster.NoetlPlaybooksComponent
    attributes:
      playbooks_dir: playbooks          # relative to this defs.yaml; every *.yaml of kind Playbook
      mode: default                     # or per_step
      on_error: report                  # report (default) | skip | raise
      data_dir: .noetl                  # optional; default $NOETL_DAGSTER_HOME, else <project root>/.noetl
      tenant: default
      project: default
      translation:                      # like DbtProjectComponent's translation: block
        job_tags: {team: data}
        op_tags: {dagster/concurrency_key: noetl}
        group_name: noetl_tables        # for the tables playbooks declare
        asset_tags: {layer: bronze}
        kinds: [postgres]
        asset_key_scope: namespace      # table keys sales/daily_sales; tenant: demo/examples/sales/daily_sales
        asset_key_prefix: [lake]        # optional: lake/sales/daily_sales

Drop a playbook file into the directory and the code location has its job,
its schedule (``executor.spec.schedule``) and the ``noetl_router`` sensor. A
broken file never takes the location down: with ``on_error: report`` it is an
asset ``noetl_invalid_playbook/<stem>`` whose description and failing
``playbook_is_valid`` check carry ``FILE:LINE: RULE: message``.
"""

from __future__ import annotations

import os
from importlib import resources as importlib_resources
from pathlib import Path
from typing import Annotated, Literal

import dagster as dg
from pydantic import BaseModel, Field

from noetl_dagster.dsl import PlaybookInvalid
from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.translator.build import compile_playbooks
from noetl_dagster.translator.declare import automation_condition
from noetl_dagster.translator.naming import DEFAULT_KEY_SCOPE, KEY_SCOPES
from noetl_dagster.translator.translator import (
    NoetlAssetData,
    NoetlJobSpec,
    NoetlNodeData,
    NoetlOpSpec,
    NoetlPlaybookData,
    NoetlTranslator,
)

SAMPLE_PLAYBOOK = "hello_noetl.yaml"
SAMPLE_TENANT, SAMPLE_PROJECT = "demo", "examples"  # the scope of the sample's table and of the examples


def _enum(*values: str) -> dg.Resolver:
    """A plain string field limited to ``values`` in the component's JSON schema: ``dg check yaml``
    rejects ``mode: defualt`` at its line (a resolvable field otherwise also accepts any template string)."""
    return dg.Resolver.default(model_field_type=str, json_schema_extra={"enum": list(values)})


class NoetlTranslation(dg.Model, dg.Resolvable):
    """Attributes merged into what the default translator produces (jobs, ops, declared assets)."""

    job_tags: dict[str, str] = Field(default_factory=dict, description="tags added to every playbook job")
    op_tags: dict[str, str] = Field(
        default_factory=dict, description="tags added to every op (the Materialize op <job>__tables too)"
    )
    pool: str | None = Field(default=None, description="concurrency pool of every op that names none")
    group_name: str | None = Field(default=None, description="asset group of the tables playbooks declare")
    asset_tags: dict[str, str] = Field(default_factory=dict, description="tags added to every declared asset")
    kinds: list[str] = Field(default_factory=list, description="kinds added to every declared asset")
    owners: list[str] = Field(
        default_factory=list,
        description="owners (emails, team:<name>) of declared assets whose playbook names none",
    )
    automation: str | dict[str, str] | None = Field(
        default=None,
        description="automation of declared assets that declare none: eager, on_missing or {on_cron: '<cron>'}",
    )
    asset_key_scope: Annotated[str, _enum(*KEY_SCOPES)] = Field(
        default=DEFAULT_KEY_SCOPE,
        description="how much of noetl://<tenant>/<project>/<namespace>/<type>/<name> a table's asset key carries:"
        " namespace (sales/daily_sales), name, project, or tenant (keys unique across tenants and projects)",
    )
    asset_key_prefix: list[str] = Field(
        default_factory=list, description="path put before every table's asset key"
    )
    asset_metadata: dict[str, str] = Field(
        default_factory=dict,
        description="metadata added to every declared asset; values are templates over {playbook}, {step}, {uri}",
    )


class _ConfiguredTranslator(NoetlTranslator):
    def __init__(self, translation: NoetlTranslation):
        super().__init__(
            asset_key_scope=translation.asset_key_scope, asset_key_prefix=translation.asset_key_prefix
        )
        self.translation = translation

    def get_job_spec(self, data: NoetlPlaybookData) -> NoetlJobSpec:
        return super().get_job_spec(data).merge_attributes(tags=self.translation.job_tags)

    def get_op_spec(self, data: NoetlNodeData) -> NoetlOpSpec:
        return self._op(super().get_op_spec(data))

    def get_asset_op_spec(self, data: NoetlPlaybookData) -> NoetlOpSpec:
        return self._op(super().get_asset_op_spec(data))

    def _op(self, spec: NoetlOpSpec) -> NoetlOpSpec:
        spec = spec.merge_attributes(tags=self.translation.op_tags)
        if self.translation.pool and spec.pool is None:
            spec = spec.replace_attributes(pool=self.translation.pool)
        return spec

    def get_asset_spec(self, data: NoetlAssetData) -> dg.AssetSpec | None:
        spec = super().get_asset_spec(data)
        if spec is None:
            return None
        t = self.translation
        if t.group_name:
            spec = spec.replace_attributes(group_name=t.group_name)
        if t.asset_tags or t.kinds:
            spec = spec.merge_attributes(tags=t.asset_tags, kinds=set(t.kinds))
        if t.owners and not spec.owners:
            spec = spec.replace_attributes(owners=t.owners)
        if t.automation and spec.automation_condition is None:
            spec = spec.replace_attributes(automation_condition=automation_condition(t.automation))
        if t.asset_metadata:
            names = {"playbook": data.step.playbook.path, "step": data.step.name, "uri": data.uri}
            spec = spec.merge_attributes(metadata={k: v.format(**names) for k, v in t.asset_metadata.items()})
        return spec


def _known_keys(model: type[BaseModel]) -> dg.Resolver:
    """``dg check yaml`` names an unknown key inside a block (``'op_tgas' is not one of [...]``); the
    block's schema is a union with a template string, whose own error names no key."""
    return dg.Resolver.default(json_schema_extra={"propertyNames": {"enum": sorted(model.model_fields)}})


class NoetlScaffoldParams(BaseModel):
    playbooks_dir: str = Field(
        default="playbooks", description="folder (relative to defs.yaml) for the playbooks"
    )
    mode: Literal["default", "per_step"] = "default"


class NoetlPlaybooksScaffolder(dg.Scaffolder[NoetlScaffoldParams]):
    """``dg scaffold defs noetl_dagster.NoetlPlaybooksComponent NAME``: defs.yaml plus a sample playbook."""

    @classmethod
    def get_scaffold_params(cls) -> type[NoetlScaffoldParams]:
        return NoetlScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[NoetlScaffoldParams]) -> None:
        params = request.params or NoetlScaffoldParams()
        dg.scaffold_component(  # tenant/project: the scope the sample's table (noetl://demo/examples/...) is in
            request, {"playbooks_dir": params.playbooks_dir, "mode": params.mode, "on_error": "report",
                      "tenant": SAMPLE_TENANT, "project": SAMPLE_PROJECT},
        )  # fmt: skip
        target = Path(request.target_path) / params.playbooks_dir
        target.mkdir(parents=True, exist_ok=True)
        sample = target / SAMPLE_PLAYBOOK
        if not sample.exists():
            sample.write_text(
                importlib_resources.files("noetl_dagster.translator")
                .joinpath(SAMPLE_PLAYBOOK)
                .read_text("utf-8"),
                encoding="utf-8",
            )


@dg.scaffold_with(NoetlPlaybooksScaffolder)
class NoetlPlaybooksComponent(dg.Component, dg.Resolvable, dg.Model):
    """NoETL playbooks (YAML, apiVersion noetl.io/v2) as Dagster jobs, schedules and a token-routing sensor."""

    playbooks_dir: str = Field(description="directory of playbook files, relative to the defs.yaml")
    mode: Annotated[Literal["default", "per_step"], _enum("default", "per_step")] = Field(
        default="default", description="default (one run per execution) or per_step (one run per step)"
    )
    event_store_url: str | None = Field(
        default=None, description="EventStore URL; default <data_dir>/events.db"
    )
    data_dir: str | None = Field(
        default=None,
        description="NoETL data directory; default $NOETL_DAGSTER_HOME, else <project root>/.noetl",
    )
    tenant: str = "default"
    project: str = "default"
    include_sensor: bool = Field(
        default=True, description="add the noetl_router sensor (one per code location)"
    )
    sensor_interval_seconds: int = Field(
        default=5,
        ge=1,
        description="router tick interval: the latency of each per-step hop and detached launch",
    )
    sensor_wait_seconds: float = Field(
        default=0.0,
        ge=0,
        description="a router tick with nothing to route keeps watching the event store this long"
        " and routes a new request at once (a detached launch in ~50 ms, not at the next tick); keep it under"
        " sensor_interval_seconds",
    )
    on_error: Annotated[Literal["report", "skip", "raise"], _enum("report", "skip", "raise")] = Field(
        default="report",
        description="an invalid playbook: report (an asset with a failing check; the rest loads), "
        "skip (a warning line only) or raise (the code location fails to load)",
    )
    translation: Annotated[NoetlTranslation | None, _known_keys(NoetlTranslation)] = Field(
        default=None, description="attributes merged into jobs, ops and assets"
    )

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        base = Path(context.path)  # the folder holding defs.yaml
        playbooks = Path(self.playbooks_dir)
        if not playbooks.is_absolute():
            playbooks = (base / playbooks).resolve()
        data_dir = (
            self.data_dir
            or os.environ.get("NOETL_DAGSTER_HOME")
            or str(Path(context.project_root) / ".noetl")
        )
        if not Path(data_dir).is_absolute():
            data_dir = str((base / data_dir).resolve())
        resource = NoetlResource(
            event_store_url=self.event_store_url or None,
            data_dir=data_dir,
            tenant=self.tenant,
            project=self.project,
        )
        translator = _ConfiguredTranslator(self.translation) if self.translation else None
        try:
            location = compile_playbooks(
                playbooks, translator, mode=self.mode, resource=resource, include_sensor=self.include_sensor,
                on_error=self.on_error, sensor_interval_seconds=self.sensor_interval_seconds,
                sensor_wait_seconds=self.sensor_wait_seconds,
            )  # fmt: skip
        except (
            PlaybookInvalid
        ) as e:  # on_error: raise, or dg check defs: the FILE:LINE: RULE lines, not our stack
            raise InvalidPlaybooks(e, playbooks, self.on_error) from None
        return location.definitions


class InvalidPlaybooks(Exception):
    """A playbook does not load under ``on_error: raise`` or ``dg check defs``: every broken file, one line per issue."""

    def __init__(self, error: PlaybookInvalid, folder: Path, on_error: str = "raise"):
        lines = [str(i) for i in error.issues]
        why = ("on_error: raise; on_error: report loads the rest" if on_error == "raise" else
               f"definitions validation fails on broken playbooks; with on_error: {on_error} dagster dev loads the rest")  # fmt: skip
        super().__init__(f"{len(lines)} playbook issue(s) in {folder} ({why}):\n" + "\n".join(lines))
