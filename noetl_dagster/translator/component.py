"""A Dagster Component: add playbooks to a ``dg`` project without Python.

``defs/playbooks/defs.yaml``::

    type: noetl_dagster.translator.component.NoetlPlaybooksComponent
    attributes:
      playbooks_dir: playbooks          # relative to this defs.yaml; every *.yaml of kind Playbook
      mode: default                     # or per_step
      data_dir: .noetl                  # optional; default $NOETL_DAGSTER_HOME, else <project root>/.noetl
      tenant: default
      project: default

Drop a playbook file into the directory and the code location has its job,
its schedule (``executor.spec.schedule``) and the ``noetl_router`` sensor.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
from pydantic import Field

from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.translator.build import compile_playbooks


class NoetlPlaybooksComponent(dg.Component, dg.Resolvable, dg.Model):
    """NoETL playbooks (YAML, apiVersion noetl.io/v2) as Dagster jobs, schedules and a token-routing sensor."""

    playbooks_dir: str = Field(description="directory of playbook files, relative to the defs.yaml")
    mode: str = Field(default="default", description="default (one run per execution) or per_step")
    event_store_url: str | None = Field(default=None, description="EventStore URL; default <data_dir>/events.db")
    data_dir: str | None = Field(
        default=None, description="NoETL data directory; default $NOETL_DAGSTER_HOME, else <project root>/.noetl"
    )
    tenant: str = "default"
    project: str = "default"
    include_sensor: bool = Field(default=True, description="add the noetl_router sensor (one per code location)")
    on_error: str = Field(default="raise", description="an invalid playbook: raise (default) or skip")

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        base = Path(context.path)  # the folder holding defs.yaml
        playbooks = Path(self.playbooks_dir)
        if not playbooks.is_absolute():
            playbooks = (base / playbooks).resolve()
        data_dir = self.data_dir or os.environ.get("NOETL_DAGSTER_HOME") or str(Path(context.project_root) / ".noetl")
        if not Path(data_dir).is_absolute():
            data_dir = str((base / data_dir).resolve())
        resource = NoetlResource(
            event_store_url=self.event_store_url or None,
            data_dir=data_dir,
            tenant=self.tenant,
            project=self.project,
        )
        location = compile_playbooks(
            playbooks, mode=self.mode, resource=resource, include_sensor=self.include_sensor, on_error=self.on_error
        )
        return location.definitions
