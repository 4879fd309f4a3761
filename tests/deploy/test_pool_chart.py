"""deploy/helm/noetl-pool: the worker pool's chart (issue 45). Its values validate against the chart's own
values.schema.json (Helm enforces it at install), and every flag its template passes is one the
`noetl-dagster worker` command takes."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "noetl-pool"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
TEMPLATE = (CHART / "templates" / "workers.yaml").read_text()


def _errors(values):
    return list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(values))


def test_values_validate():
    assert _errors(VALUES) == []


@pytest.mark.parametrize(
    "mutate",
    [
        lambda v: v["nats"].update(url="http://nats:4222"),
        lambda v: v.update(region="us.west"),
        lambda v: v["workers"][0].update(concurrency=0),
        lambda v: v["workers"][0].update(shards=["shard-7"]),
        lambda v: v["workers"][0].pop("ackWaitSeconds"),
        lambda v: v["workers"][0].update(replica=3),
    ],
)
def test_schema_catches_mistakes(mutate):
    v = copy.deepcopy(VALUES)
    mutate(v)
    assert _errors(v)


def test_every_flag_of_the_template_is_a_worker_option():
    from noetl_dagster.commands.worker import worker

    help_text = CliRunner().invoke(worker, ["--help"]).output
    flags = set(re.findall(r"- (--[a-z-]+)=", TEMPLATE))
    assert flags == {"--nats", "--region", "--concurrency", "--ack-wait", "--max-deliver", "--shard"}
    assert all(f in help_text for f in flags)
    # every value a worker group sets reaches the template
    for key in VALUES["workers"][0]:
        assert f".{key}" in TEMPLATE, key
    assert 'command: ["noetl-dagster", "worker"]' in TEMPLATE
