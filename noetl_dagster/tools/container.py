"""``kind: container``: run a step's command in a container image.

Inputs (NoETL's shape): ``image`` (required), ``command`` and ``args`` (lists or strings), ``env``,
``working_dir``, ``resources`` (``{requests, limits}`` with ``cpu`` / ``memory``), ``timeout_seconds``
(default 900), ``pull`` (``missing`` | ``always`` | ``never``), ``network`` (default ``none``),
``backoff_limit`` / ``restart_policy`` (Kubernetes only).

Local runs use the Docker Engine API (the ``docker`` client; ``DOCKER_HOST`` or the default socket).
Where no engine answers, the call fails at once with the error outcome ``runtime_unavailable`` — a clear
message, never a hang — and ``noetl-dagster validate`` is unaffected (the playbook is valid; the machine
lacks a runtime). The container is removed afterwards. Result: ``{exit_code, stdout, stderr, image,
duration_ms}``; a non-zero exit is the error outcome ``exit_code`` with the code; a timeout kills the
container (``timeout``, retryable).

On Kubernetes, Dagster's per-step mode runs each step as its own pod: :func:`k8s_placement` turns this
config into the step's placement (image, env, resources, backoff_limit), which the translator merges into
the op's ``dagster-k8s/config`` tag (``container_config``, ``job_spec_config``), so the step's pod *is*
the container (docs/tools.md, docs/deploy.md).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

from noetl_dagster.tools.configs import ToolConfig
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool

DEFAULT_TIMEOUT = 900


class EnvVar(BaseModel):
    name: str
    value: str | int | float | bool | None = None


def env_of(raw: Any) -> dict[str, str]:
    """``env`` as a mapping: NoETL's corpus writes Kubernetes' ``[{name, value}]`` list too."""
    if isinstance(raw, list):
        return {
            str(e["name"]): "" if e.get("value") is None else str(e["value"])
            for e in raw
            if isinstance(e, Mapping)
        }
    return {str(k): str(v) for k, v in (raw or {}).items()}


class ContainerConfig(ToolConfig):
    image: str = Field(..., min_length=1, description="container image, e.g. alpine:3.19")
    command: list[str] | str | None = Field(None, description="entrypoint override")
    args: list[str] | str | None = Field(None, description="arguments")
    env: dict[str, str | int | float | bool] | list[EnvVar] | None = Field(
        None, description="environment variables: a mapping, or Kubernetes' list of {name, value}"
    )
    working_dir: str | None = Field(None, description="working directory in the container")
    resources: dict[str, Any] | None = Field(None, description="{requests, limits}: cpu, memory")
    timeout_seconds: float | None = Field(None, gt=0, description="seconds (default 900)")
    pull: Literal["missing", "always", "never"] = Field("missing", description="image pull policy")
    network: str | None = Field("none", description="docker network (default none: no network)")
    backoff_limit: int | None = Field(None, ge=0, description="Kubernetes Job retries")
    restart_policy: str | None = Field(None, description="Kubernetes pod restart policy")


def _argv(value: Any) -> list[str] | None:
    if value is None:
        return None
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def _memory(v: Any) -> str | None:
    """Kubernetes quantities (128Mi, 1Gi) as Docker's (128m, 1g)."""
    if v is None:
        return None
    s = str(v)
    for k8s, docker in (("Ki", "k"), ("Mi", "m"), ("Gi", "g")):
        if s.endswith(k8s):
            return s[: -len(k8s)] + docker
    return s


def _cpus(v: Any) -> int | None:
    if v is None:
        return None
    s = str(v)
    cores = float(s[:-1]) / 1000 if s.endswith("m") else float(s)
    return int(cores * 1e9)  # nano_cpus


def k8s_placement(config: Mapping[str, Any]) -> dict[str, Any]:
    """A container task's config as a step placement (translator/k8s.py merges it into dagster-k8s/config)."""
    out: dict[str, Any] = {}
    for key in ("image", "resources", "backoff_limit", "env"):
        if config.get(key) not in (None, "", {}, []):
            out[key] = env_of(config[key]) if key == "env" else config[key]
    pull = {"always": "Always", "never": "Never", "missing": "IfNotPresent"}.get(
        str(config.get("pull") or "")
    )
    if pull:
        out["image_pull_policy"] = pull
    return out


def _client() -> Any:
    try:
        import docker  # noqa: PLC0415
    except ImportError:
        raise ToolError(
            "container: the docker client is not installed, and no other container runtime is configured",
            kind="runtime_unavailable",
        ) from None
    try:
        client = docker.from_env(timeout=10)
        client.ping()
        return client
    except Exception as e:  # noqa: BLE001 - docker raises DockerException, requests/urllib3 errors, OSError
        reason = str(e).split("(")[0].strip() or type(e).__name__
        raise ToolError(
            "container: no container runtime is reachable here (Docker Engine API: "
            f"{reason}); run this step where Docker is available or on Kubernetes (Dagster per-step pods)",
            kind="runtime_unavailable",
        ) from None


@register_tool(
    "container",
    config=ContainerConfig,
    description="Run a command in a container image (Docker; K8s pods per step)",
)
def container_tool(inputs: dict[str, Any], ctx: ToolContext) -> Any:
    """Run the step's command in a container; result {exit_code, stdout, stderr}."""
    image = inputs.get("image")
    if not image:
        raise ToolError("container: image is required", kind="config_error")
    client = _client()
    import docker.errors  # noqa: PLC0415 - only when a runtime answered

    limits = (inputs.get("resources") or {}).get("limits") or {}
    timeout = float(inputs.get("timeout_seconds") or DEFAULT_TIMEOUT)
    start = time.monotonic()
    try:
        if inputs.get("pull") == "always":
            client.images.pull(image)
        container = client.containers.create(
            image,
            command=_argv(inputs.get("args")),
            entrypoint=_argv(inputs.get("command")),
            environment=env_of(inputs.get("env")),
            working_dir=inputs.get("working_dir"),
            network_mode=inputs.get("network") or "none",
            mem_limit=_memory(limits.get("memory")),
            nano_cpus=_cpus(limits.get("cpu")),
            labels={"noetl.execution_id": str(ctx.execution_id), "noetl.step": str(ctx.step)},
        )
    except docker.errors.ImageNotFound as e:
        raise ToolError(
            f"container: image {image!r} not found: {e.explanation}", kind="image_not_found"
        ) from None
    except docker.errors.APIError as e:
        raise ToolError(f"container: {e.explanation or e}", kind="container_error", retryable=True) from None
    try:
        container.start()
        try:
            status = container.wait(timeout=timeout)
        except Exception:  # noqa: BLE001 - requests' ReadTimeout: the container outlived its timeout
            container.kill()
            raise ToolError(
                f"container: {image} timed out after {timeout:g}s", kind="timeout", retryable=True
            ) from None
        result = {
            "exit_code": int(status.get("StatusCode", -1)),
            "image": image,
            "stdout": container.logs(stdout=True, stderr=False).decode("utf-8", "replace"),
            "stderr": container.logs(stdout=False, stderr=True).decode("utf-8", "replace"),
            "duration_ms": int((time.monotonic() - start) * 1000),
        }
    finally:
        try:
            container.remove(force=True)
        except docker.errors.APIError:
            pass
    if result["exit_code"] != 0:
        raise ToolError(
            f"container: {image} exited with code {result['exit_code']}",
            kind="exit_code",
            code=result["exit_code"],
            result=result,
        )
    return result
