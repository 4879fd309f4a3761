"""deploy/helm/values.yaml against the documented subset of the Dagster chart's schema."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
VALUES = yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())
SCHEMA = json.loads((DEPLOY / "helm" / "values.subset.schema.json").read_text())


def _errors(values):
    return sorted(jsonschema.Draft202012Validator(SCHEMA).iter_errors(values), key=lambda e: list(e.path))


def test_values_validate():
    assert _errors(VALUES) == []


def test_values_wire_every_noetl_endpoint_into_code_and_runs():
    dep = VALUES["dagster-user-deployments"]["deployments"][0]
    env = {e["name"] for e in dep["env"]}
    needed = {
        "NOETL_EVENT_STORE_URL",
        "NOETL_REGISTRY_URL",
        "NOETL_PAYLOAD_STORE_URL",
        "NOETL_CLICKHOUSE_URL",
        "OPENLINEAGE_URL",
    }
    assert needed <= env
    assert needed <= set(VALUES["runLauncher"]["config"]["k8sRunLauncher"]["envVars"])
    assert dep["dagsterApiGrpcArgs"] == ["-m", "example_project.definitions"]
    assert VALUES["postgresql"]["postgresqlScheme"] == "postgresql+psycopg2"


@pytest.mark.parametrize(
    "mutate, where",
    [
        (lambda v: v["runLauncher"].update(type="K8sLauncher"), "type"),
        (lambda v: v["runLauncher"]["config"]["k8sRunLauncher"].update(envVar=["X"]), "k8sRunLauncher"),
        (lambda v: v["dagster-user-deployments"]["deployments"][0].pop("port"), "0"),
        (
            lambda v: v["dagster-user-deployments"]["deployments"][0]["image"].update(pullPolicy="Sometimes"),
            "pullPolicy",
        ),
        (lambda v: v["postgresql"].pop("postgresqlHost"), "postgresql"),
    ],
)
def test_schema_catches_mistakes(mutate, where):
    v = copy.deepcopy(VALUES)
    mutate(v)
    errs = _errors(v)
    assert errs, "the mutated values should not validate"
    assert any(where in [str(p) for p in e.absolute_path] or where in e.message for e in errs)


def test_dockerfile_serves_the_example_code_location():
    text = (DEPLOY / "Dockerfile").read_text()
    assert "example_project.definitions" in text and "EXPOSE 3030" in text
    # every extra (the chart's code location runs any playbook kind), and the example project,
    # which is not in the wheel, importable from the copied checkout
    assert "pip install '.[all]'" in text
    assert "COPY example_project ./example_project" in text and "ENV PYTHONPATH=/opt/noetl-dagster" in text


def test_postgres_instance_profile_uses_one_url_setting():
    cfg = yaml.safe_load((DEPLOY / "dagster.postgres.yaml").read_text())
    assert cfg["storage"]["postgres"]["postgres_url"] == {"env": "DAGSTER_PG_URL"}
