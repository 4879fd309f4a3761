"""Per-step Kubernetes placement from the playbook, as ``dagster-k8s/config`` tags.

Playbook keys (all optional):

* ``executor.spec.profiles.<name>``: a named executor profile with any of
  ``resources``, ``node_selector``, ``tolerations``, ``affinity``, ``image``,
  ``image_pull_policy``, ``service_account``, ``env``, ``labels``,
  ``annotations``, ``ttl_seconds``, ``backoff_limit``;
  ``executor.spec.default_profile`` (or ``executor.profile``) applies to every step.
* ``step.spec.profile``: a profile for one step; ``step.spec.resources`` and
  ``step.spec.placement`` (same keys as a profile) override it.
* ``resources``: ``{cpu, memory, gpu, ephemeral_storage}`` as requests (and
  limits), or explicit ``{requests: {...}, limits: {...}}``; ``gpu: N`` becomes
  the ``nvidia.com/gpu`` limit (``gpu_resource`` renames it).
* ``loop.spec.policy.exec``: ``distributed`` runs the loop's frames as their own
  pods through ``k8s_job_executor``; ``local`` keeps them inside the step's pod.

The result is the dict dagster-k8s reads from the ``dagster-k8s/config`` tag of
a job or op (``container_config``, ``pod_spec_config``,
``pod_template_spec_metadata``, ``job_spec_config``, ``job_metadata``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from noetl_dagster.dsl.model import Playbook, Step

K8S_CONFIG_TAG = "dagster-k8s/config"
_PROFILE_KEYS = {
    "resources", "node_selector", "tolerations", "affinity", "image", "image_pull_policy", "service_account",
    "env", "labels", "annotations", "ttl_seconds", "backoff_limit", "gpu_resource", "priority_class",
}  # fmt: skip


class PlacementError(ValueError):
    pass


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


def step_placement(pb: Playbook, step: Step) -> dict[str, Any]:
    """The merged placement of a step: default profile < step profile < step resources/placement."""
    spec = pb.executor.spec or {}
    profiles = spec.get("profiles") or {}
    if not isinstance(profiles, Mapping):
        raise PlacementError("executor.spec.profiles must be a mapping of profile name -> settings")
    out: dict[str, Any] = {}
    default = spec.get("default_profile") or pb.executor.profile
    for name in (default, step.spec.get("profile")):
        if not name:
            continue
        if name not in profiles:
            raise PlacementError(
                f"step {step.name!r}: executor profile {name!r} is not defined in executor.spec.profiles"
            )
        prof = profiles[name]
        unknown = set(prof) - _PROFILE_KEYS
        if unknown:
            raise PlacementError(f"executor profile {name!r}: unknown keys {sorted(unknown)}")
        out = _merge(out, prof)
    for task in step.tool:  # kind: container: the step's pod runs that image (docs/tools.md "container")
        if task.kind == "container":
            from noetl_dagster.tools.container import k8s_placement  # noqa: PLC0415

            out = _merge(out, k8s_placement(task.config))
    if isinstance(step.spec.get("placement"), Mapping):
        out = _merge(out, step.spec["placement"])
    if isinstance(step.spec.get("resources"), Mapping):
        out = _merge(out, {"resources": step.spec["resources"]})
    return out


def _quantity(v: Any) -> str:
    return str(v)


def container_resources(resources: Mapping[str, Any], gpu_resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    if "requests" in resources or "limits" in resources:
        req = {k: _quantity(v) for k, v in (resources.get("requests") or {}).items()}
        lim = {k: _quantity(v) for k, v in (resources.get("limits") or {}).items()}
    else:
        req, lim = {}, {}
        for key, k8s in (("cpu", "cpu"), ("memory", "memory"), ("ephemeral_storage", "ephemeral-storage")):
            if key in resources:
                req[k8s] = _quantity(resources[key])
                lim[k8s] = _quantity(resources[key])
    if "gpu" in resources:
        lim[gpu_resource] = _quantity(resources["gpu"])
    out: dict[str, Any] = {}
    if req:
        out["requests"] = req
    if lim:
        out["limits"] = lim
    return out


def k8s_config(placement: Mapping[str, Any], *, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A placement -> the ``dagster-k8s/config`` dict (empty when nothing is set)."""
    container: dict[str, Any] = {}
    pod: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    job_spec: dict[str, Any] = {}
    if placement.get("resources"):
        container["resources"] = container_resources(
            placement["resources"], placement.get("gpu_resource", "nvidia.com/gpu")
        )
    if placement.get("image"):
        container["image"] = placement["image"]
    if placement.get("image_pull_policy"):
        container["image_pull_policy"] = placement["image_pull_policy"]
    if placement.get("env"):
        env = placement["env"]
        container["env"] = (
            [{"name": k, "value": str(v)} for k, v in env.items()] if isinstance(env, Mapping) else list(env)
        )
    if placement.get("node_selector"):
        pod["node_selector"] = dict(placement["node_selector"])
    if placement.get("tolerations"):
        pod["tolerations"] = list(placement["tolerations"])
    if placement.get("affinity"):
        pod["affinity"] = placement["affinity"]
    if placement.get("service_account"):
        pod["service_account_name"] = placement["service_account"]
    if placement.get("priority_class"):
        pod["priority_class_name"] = placement["priority_class"]
    all_labels = {**(labels or {}), **(placement.get("labels") or {})}
    if all_labels:
        meta["labels"] = {k: _label(v) for k, v in all_labels.items()}
    if placement.get("annotations"):
        meta["annotations"] = {k: str(v) for k, v in placement["annotations"].items()}
    if placement.get("ttl_seconds") is not None:
        job_spec["ttl_seconds_after_finished"] = int(placement["ttl_seconds"])
    if placement.get("backoff_limit") is not None:
        job_spec["backoff_limit"] = int(placement["backoff_limit"])
    out: dict[str, Any] = {}
    if container:
        out["container_config"] = container
    if pod:
        out["pod_spec_config"] = pod
    if meta:
        out["pod_template_spec_metadata"] = meta
    if job_spec:
        out["job_spec_config"] = job_spec
    return out


def _label(v: Any) -> str:
    s = "".join(c if c.isalnum() or c in "-_." else "-" for c in str(v))[:63]
    return s.strip("-_.") or "x"


def step_k8s_tags(pb: Playbook, step: Step) -> dict[str, str]:
    """Op tags for a step: ``dagster-k8s/config`` (when it sets anything) and ``noetl/exec``."""
    placement = step_placement(pb, step)
    labels = {"noetl/playbook": pb.metadata.name, "noetl/step": step.name}
    cfg = k8s_config(placement, labels=labels) if placement else {}
    tags: dict[str, str] = {}
    if cfg:
        tags[K8S_CONFIG_TAG] = json.dumps(cfg, sort_keys=True)
    if step.loop is not None and step.loop.exec:
        tags["noetl/exec"] = step.loop.exec
    return tags


def needs_k8s_job_executor(pb: Playbook) -> bool:
    """True when any loop asks for distributed frames (each op its own pod)."""
    return any(s.loop is not None and s.loop.exec == "distributed" for s in pb.workflow)


def job_executor(pb: Playbook, *, on_kubernetes: bool) -> Any:
    """The executor a playbook's job should use: k8s_job_executor for distributed loops on Kubernetes."""
    import dagster as dg

    if on_kubernetes and needs_k8s_job_executor(pb):
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor
    return dg.in_process_executor
