"""kind: container. This machine has the docker client but no engine: the real outcome here is a
clear runtime_unavailable error; where an engine answers, the same test runs alpine for real.
The per-step Kubernetes mapping is checked on the translator's dagster-k8s/config tag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from noetl_dagster.dsl import load_playbook, load_playbook_dict
from noetl_dagster.dsl.kinds import ToolConfigError, get_tool
from noetl_dagster.engine.ports import ToolError
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.tools.container import container_tool, k8s_placement

FIXTURE = Path(
    "/work/shared/conformance/noetl-e2e/fixtures/playbooks/container_callback_happy_path/"
    "container_callback_happy_path.yaml"
)


def _engine() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:  # noqa: BLE001
        return False


def test_runs_where_a_runtime_exists_else_a_clear_error(make_ctx):
    cfg = {"image": "alpine:3.19", "command": ["/bin/sh", "-c"], "args": ["echo hi; echo err >&2; exit 3"]}
    with pytest.raises(ToolError) as ei:
        container_tool(cfg, make_ctx())
    if _engine():
        assert ei.value.kind == "exit_code" and ei.value.code == 3 and ei.value.result["stdout"] == "hi\n"
    else:
        assert ei.value.kind == "runtime_unavailable"
        assert "no container runtime is reachable" in ei.value.message and "\n" not in ei.value.message


def test_in_a_playbook_the_missing_runtime_is_an_error_outcome_a_policy_can_route(tmp_path):
    pb = load_playbook_dict(
        {
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": {"name": "c", "path": "t/c"},
            "workflow": [
                {
                    "step": "start",
                    "tool": [
                        {
                            "name": "run",
                            "kind": "container",
                            "image": "alpine:3.19",
                            "args": ["true"],
                            "spec": {
                                "policy": {
                                    "rules": [
                                        {
                                            "when": "{{ output.status == 'error' and output.error.kind == 'runtime_unavailable' }}",
                                            "then": {"do": "jump", "to": "fallback"},
                                        }
                                    ]
                                }
                            },
                        },
                        {"name": "fallback", "kind": "shell", "cmd": "echo -n ran-locally"},
                    ],
                }
            ],
        }
    )
    res = run_playbook(pb, data_dir=tmp_path)
    if not _engine():
        assert res.status == "completed" and res.results["start"]["stdout"] == "ran-locally"


def test_bad_config_is_a_clear_validation_error():
    with pytest.raises(ToolConfigError, match="kind 'container': invalid config: image: Field required"):
        get_tool("container").check_config({"command": ["echo"]})
    with pytest.raises(ToolConfigError, match="pull"):
        get_tool("container").check_config({"image": "a", "pull": "sometimes"})


def test_per_step_kubernetes_mapping_of_the_core_fixture():
    from noetl_dagster.translator.k8s import K8S_CONFIG_TAG, step_k8s_tags

    pb = load_playbook(str(FIXTURE))
    step = next(s for s in pb.workflow if any(t.kind == "container" for t in s.tool))
    cfg = json.loads(step_k8s_tags(pb, step)[K8S_CONFIG_TAG])
    assert cfg["container_config"]["image"] == "alpine:3.19"
    assert cfg["container_config"]["resources"] == {
        "requests": {"cpu": "20m", "memory": "32Mi"},
        "limits": {"cpu": "200m", "memory": "128Mi"},
    }
    assert cfg["job_spec_config"]["backoff_limit"] == 0
    assert k8s_placement({"image": "x", "pull": "always"})["image_pull_policy"] == "Always"


def test_kubernetes_style_env_list_is_accepted_as_the_corpus_writes_it():
    """NoETL's container_postgres_init fixture writes env as [{name, value}] (issue 32.6 found it:
    validate accepted it, the kind's model refused it at run time)."""
    from noetl_dagster.dsl.kinds import get_tool
    from noetl_dagster.tools.container import env_of, k8s_placement

    env = [{"name": "PGHOST", "value": "db"}, {"name": "N", "value": 5}, {"name": "EMPTY"}]
    get_tool("container").check_config({"image": "alpine:3.19", "env": env})
    assert env_of(env) == {"PGHOST": "db", "N": "5", "EMPTY": ""}
    assert k8s_placement({"image": "alpine:3.19", "env": env})["env"] == {
        "PGHOST": "db",
        "N": "5",
        "EMPTY": "",
    }
