"""deploy/helm/noetl-events: the event-log consumers' chart (issue 45). Its values validate against the
chart's own values.schema.json (Helm enforces it at install), and every flag its template passes is one
the command it starts (`noetl-dagster projector | archiver | retention`) takes."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "noetl-events"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
TEMPLATE = (CHART / "templates" / "consumers.yaml").read_text()


def _errors(values):
    return list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(values))


def test_values_validate():
    assert _errors(VALUES) == []


@pytest.mark.parametrize(
    "mutate",
    [
        lambda v: v["projectors"][0].update(batch=0),
        lambda v: v["projectors"][0].update(shards=["shard-7"]),
        lambda v: v["retention"][0].update(minAge="a day"),
        lambda v: v["retention"][0].pop("intervalSeconds"),
        lambda v: v["archivers"][0].update(replicas=2),
        lambda v: v.pop("envFromSecret"),
    ],
)
def test_schema_catches_mistakes(mutate):
    v = copy.deepcopy(VALUES)
    mutate(v)
    assert _errors(v)


def test_every_flag_of_the_template_is_an_option_of_its_command():
    from noetl_dagster.commands.nats_tiers import archiver, projector, retention

    helps = {n: CliRunner().invoke(c, ["--help"]).output for n, c in
             (("projector", projector), ("archiver", archiver), ("retention", retention))}  # fmt: skip
    flags = set(re.findall(r"- (--[a-z-]+)=", TEMPLATE))
    assert flags == {"--shard", "--batch", "--payload", "--min-age", "--interval", "--require"}
    for flag in flags:
        assert any(flag in h for h in helps.values()), flag
    assert "--batch" in helps["projector"] and "--payload" in helps["archiver"]
    assert all(f in helps["retention"] for f in ("--min-age", "--interval", "--require"))
    for kind in ("projectors", "archivers", "retention"):  # every value a group sets reaches the template
        for key in VALUES[kind][0]:
            if key != "name":
                assert f".group.{key}" in TEMPLATE, (kind, key)
    assert 'command: ["noetl-dagster", "{{ .kind }}"]' in TEMPLATE
    assert "replicas: 1" in TEMPLATE
