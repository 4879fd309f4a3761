"""Playbook placement -> dagster-k8s tags -> the Job/Pod spec dagster-k8s really builds."""

from __future__ import annotations

import json

import pytest
from dagster_k8s.job import DagsterK8sJobConfig, construct_dagster_k8s_job, get_user_defined_k8s_config

from noetl_dagster.dsl import load_playbook_dict
from noetl_dagster.translator.k8s import (
    K8S_CONFIG_TAG,
    PlacementError,
    job_executor,
    needs_k8s_job_executor,
    step_k8s_tags,
)


def _pb(executor=None, steps=None):
    return load_playbook_dict(
        {
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": {"name": "k8s_probe", "path": "tests/k8s_probe"},
            "executor": executor or {},
            "workflow": steps,
        }
    )


def _job(tags):
    cfg = DagsterK8sJobConfig(job_image="ghcr.io/example/noetl-code:1", dagster_home="/opt/dagster/dagster_home",
                              instance_config_map="dagster-instance")  # fmt: skip
    return construct_dagster_k8s_job(cfg, ["dagster", "api", "execute_step"], "dagster-step-abc",
                                     user_defined_k8s_config=get_user_defined_k8s_config(tags))  # fmt: skip


GPU_PROFILES = {
    "spec": {
        "default_profile": "small",
        "profiles": {
            "small": {"resources": {"cpu": "500m", "memory": "1Gi"}, "labels": {"team": "data"}},
            "gpu": {
                "resources": {"cpu": 4, "memory": "16Gi", "gpu": 1},
                "node_selector": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "service_account": "noetl-gpu",
                "ttl_seconds": 600,
            },
        },
    }
}


def test_default_and_step_profiles_become_pod_specs():
    pb = _pb(
        GPU_PROFILES,
        [
            {"step": "start", "tool": {"kind": "noop"}, "next": {"arcs": [{"step": "train"}]}},
            {
                "step": "train",
                "spec": {"profile": "gpu", "resources": {"memory": "24Gi"}},
                "tool": {"kind": "noop"},
            },
        ],
    )
    small = _job(step_k8s_tags(pb, pb.step("start")))
    c = small.spec.template.spec.containers[0]
    assert c.resources.requests == {"cpu": "500m", "memory": "1Gi"}
    assert small.spec.template.metadata.labels["team"] == "data"
    assert small.spec.template.metadata.labels["noetl/step"] == "start"

    gpu = _job(step_k8s_tags(pb, pb.step("train")))
    c = gpu.spec.template.spec.containers[0]
    assert c.resources.limits == {
        "cpu": "4",
        "memory": "24Gi",
        "nvidia.com/gpu": "1",
    }  # step resources override
    assert c.resources.requests == {"cpu": "4", "memory": "24Gi"}
    pod = gpu.spec.template.spec
    assert pod.node_selector == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert pod.tolerations[0].key == "nvidia.com/gpu"
    assert pod.service_account_name == "noetl-gpu"
    assert gpu.spec.ttl_seconds_after_finished == 600


def test_explicit_requests_limits_and_image():
    pb = _pb(
        None,
        [
            {
                "step": "s",
                "spec": {
                    "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}},
                    "placement": {"image": "registry/x:2", "env": {"A": 1}},
                },
                "tool": {"kind": "noop"},
            }
        ],  # fmt: skip
    )
    tags = step_k8s_tags(pb, pb.step("s"))
    job = _job(tags)
    c = job.spec.template.spec.containers[0]
    assert c.resources.requests == {"cpu": "1"} and c.resources.limits == {"cpu": "2"}
    assert c.image == "registry/x:2"
    assert {"name": "A", "value": "1"} in [{"name": e.name, "value": e.value} for e in c.env]


def test_distributed_loops_select_the_k8s_job_executor():
    from dagster_k8s import k8s_job_executor

    steps = [
        {
            "step": "start",
            "loop": {
                "in": "{{ [1,2] }}",
                "iterator": "i",
                "spec": {"mode": "parallel", "policy": {"exec": "distributed"}},
            },
            "tool": {"kind": "noop"},
        },  # fmt: skip
    ]
    pb = _pb(None, steps)
    assert needs_k8s_job_executor(pb)
    assert step_k8s_tags(pb, pb.step("start"))["noetl/exec"] == "distributed"
    assert job_executor(pb, on_kubernetes=True) is k8s_job_executor
    local = _pb(
        None,
        [
            {
                **steps[0],
                "loop": {**steps[0]["loop"], "spec": {"mode": "parallel", "policy": {"exec": "local"}}},
            }
        ],
    )
    assert not needs_k8s_job_executor(local)
    assert job_executor(local, on_kubernetes=True) is not k8s_job_executor


def test_a_step_with_no_placement_has_no_k8s_tag():
    pb = _pb(None, [{"step": "s", "tool": {"kind": "noop"}}])
    assert K8S_CONFIG_TAG not in step_k8s_tags(pb, pb.step("s"))


def test_unknown_profile_is_a_clear_error():
    pb = _pb(
        {"spec": {"profiles": {"a": {"resources": {"cpu": 1}}}}},
        [{"step": "s", "spec": {"profile": "b"}, "tool": {"kind": "noop"}}],
    )
    with pytest.raises(PlacementError, match="profile 'b' is not defined"):
        step_k8s_tags(pb, pb.step("s"))
    bad = _pb(
        {"spec": {"profiles": {"a": {"cpus": 1}}}},
        [{"step": "s", "spec": {"profile": "a"}, "tool": {"kind": "noop"}}],
    )
    with pytest.raises(PlacementError, match="unknown keys"):
        step_k8s_tags(bad, bad.step("s"))


def test_tag_value_is_valid_for_dagster_k8s_validation():
    pb = _pb(GPU_PROFILES, [{"step": "s", "spec": {"profile": "gpu"}, "tool": {"kind": "noop"}}])
    tags = step_k8s_tags(pb, pb.step("s"))
    cfg = get_user_defined_k8s_config(tags)  # raises on an invalid tag
    assert cfg.container_config["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert json.loads(tags[K8S_CONFIG_TAG])["pod_spec_config"]["service_account_name"] == "noetl-gpu"


def test_on_kubernetes_only_distributed_loops_get_the_k8s_job_executor(monkeypatch, tmp_path):
    import yaml

    from noetl_dagster.translator import compile_playbooks

    base = {"apiVersion": "noetl.io/v2", "kind": "Playbook"}
    loop = {
        "in": "{{ [1, 2] }}",
        "iterator": "i",
        "spec": {"mode": "parallel", "policy": {"exec": "distributed"}},
    }
    (tmp_path / "dist.yaml").write_text(yaml.safe_dump({**base, "metadata": {"name": "dist", "path": "t/dist"},
        "workflow": [{"step": "start", "loop": loop, "tool": {"kind": "noop"}}]}))  # fmt: skip
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump({**base, "metadata": {"name": "plain", "path": "t/plain"},
        "workflow": [{"step": "start", "tool": {"kind": "noop"}}]}))  # fmt: skip
    files = [tmp_path / "dist.yaml", tmp_path / "plain.yaml"]
    monkeypatch.setenv("NOETL_DAGSTER_EXECUTOR", "k8s")
    defs = compile_playbooks(files, include_sensor=False).definitions
    assert defs.resolve_job_def("dist").executor_def.name == "k8s"
    assert defs.resolve_job_def("plain").executor_def.name == "in_process"
    monkeypatch.delenv("NOETL_DAGSTER_EXECUTOR")
    defs = compile_playbooks(files, include_sensor=False).definitions
    assert defs.resolve_job_def("dist").executor_def.name == "in_process"


def _as_manifest(job) -> dict:
    from kubernetes.client import ApiClient

    doc = ApiClient().sanitize_for_serialization(job)
    return {"apiVersion": "batch/v1", "kind": "Job", **doc}


def _placement_jobs():
    pb = _pb(
        GPU_PROFILES,
        [
            {"step": "start", "tool": {"kind": "noop"}, "next": {"arcs": [{"step": "train"}]}},
            {"step": "train", "spec": {"profile": "gpu", "resources": {"memory": "24Gi"}}, "tool": {"kind": "noop"},
             "next": {"arcs": [{"step": "s"}]}},
            {"step": "s", "spec": {"resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}},
                                   "placement": {"image": "registry/x:2", "env": {"A": 1}}}, "tool": {"kind": "noop"}},
        ],
    )  # fmt: skip
    return {name: _as_manifest(_job(step_k8s_tags(pb, pb.step(name)))) for name in ("start", "train", "s")}


def test_rendered_jobs_validate_against_the_kubernetes_api_schema():
    """Every Job dagster-k8s builds from our tags is valid for the Kubernetes API (strict:
    no unknown fields), checked offline against the published OpenAPI schemas."""
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    for manifest in _placement_jobs().values():
        kubernetes_validate.validate(
            manifest, desired_version=version, strict=True
        )  # raises, naming the field


def test_the_kubernetes_schema_check_rejects_a_broken_job():
    import kubernetes_validate

    manifest = _placement_jobs()["train"]
    manifest["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = ["4 cpus"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(
            manifest, desired_version=kubernetes_validate.latest_version(), strict=True
        )
    manifest = _placement_jobs()["s"]
    manifest["spec"]["template"]["spec"]["nodeSelectr"] = {"a": "b"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(
            manifest, desired_version=kubernetes_validate.latest_version(), strict=True
        )
