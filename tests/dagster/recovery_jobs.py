"""A job Dagster can reconstruct by reference (re-execution from failure needs one).

The playbook and the NoETL data directory come from environment variables the
test sets, so the re-executed run rebuilds exactly the same job and resource.
"""

from __future__ import annotations

import os

import dagster as dg

from noetl_dagster.resources.noetl import NoetlResource
from noetl_dagster.translator import compile_playbooks


def hello_job() -> dg.JobDefinition:
    resource = NoetlResource(data_dir=os.environ["RECOVERY_TEST_DATA_DIR"])
    loc = compile_playbooks(os.environ["RECOVERY_TEST_PLAYBOOK"], resource=resource, include_sensor=False)
    return loc.definitions.resolve_job_def(loc.index.playbooks[0].job_name)


def frames_job() -> dg.JobDefinition:
    resource = NoetlResource(data_dir=os.environ["RECOVERY_TEST_DATA_DIR"])
    loc = compile_playbooks(
        os.environ["RECOVERY_TEST_FRAMES_PLAYBOOK"], resource=resource, include_sensor=False
    )
    return loc.definitions.resolve_job_def(loc.index.playbooks[0].job_name)


def frames_job_multiprocess() -> dg.JobDefinition:
    from noetl_dagster.translator import NoetlTranslator

    class Multiprocess(NoetlTranslator):
        def get_job_spec(self, data):  # noqa: ANN001
            return super().get_job_spec(data).replace_attributes(executor="multiprocess")

    resource = NoetlResource(data_dir=os.environ["RECOVERY_TEST_DATA_DIR"])
    loc = compile_playbooks(os.environ["RECOVERY_TEST_FRAMES_PLAYBOOK"], Multiprocess(), resource=resource,
                            include_sensor=False)  # fmt: skip
    return loc.definitions.resolve_job_def(loc.index.playbooks[0].job_name)
