"""What a step reserves on Kubernetes (``resources`` requests), as numbers for the cost lines.

The same keys the translator turns into ``dagster-k8s/config`` (translator/k8s.py): the executor's
default profile < the step's profile < ``step.spec.resources``; ``{cpu, memory, gpu}`` or explicit
``{requests: {...}, limits: {...}}``. A task attempt records them in ``outcome.meta.requests``
(``cpu`` cores, ``memory_bytes``, ``gpu``); its priced quantity is max(request, usage).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_UNITS = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
}


def parse_quantity(value: Any, *, memory: bool = False) -> float | None:
    """A Kubernetes quantity (``500m`` cores, ``512Mi`` / ``1G`` bytes, plain numbers); None if unreadable."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value) if value >= 0 else None
    s = str(value).strip()
    try:
        if s.endswith("m") and not memory:
            return float(s[:-1]) / 1000
        for suffix in sorted(_UNITS, key=len, reverse=True):
            if s.endswith(suffix):
                return float(s[: -len(suffix)]) * _UNITS[suffix]
        return float(s)
    except ValueError:
        return None


def _resources(playbook: Any, step: Any) -> Mapping[str, Any]:
    out: dict[str, Any] = {}
    spec = getattr(playbook.executor, "spec", None) or {}
    profiles = spec.get("profiles") if isinstance(spec.get("profiles"), Mapping) else {}
    for name in (
        spec.get("default_profile") or getattr(playbook.executor, "profile", None),
        step.spec.get("profile"),
    ):
        prof = profiles.get(name) if name else None
        if isinstance(prof, Mapping) and isinstance(prof.get("resources"), Mapping):
            out.update(prof["resources"])
    if isinstance(step.spec.get("resources"), Mapping):
        out.update(step.spec["resources"])
    return out


def step_requests(playbook: Any, step: Any) -> dict[str, float] | None:
    """``{cpu, memory_bytes, gpu}`` the step requests (only the keys it names); None when it names none."""
    res = _resources(playbook, step)
    if not res:
        return None
    if "requests" in res or "limits" in res:
        req = res.get("requests") if isinstance(res.get("requests"), Mapping) else {}
        lim = res.get("limits") if isinstance(res.get("limits"), Mapping) else {}
        cpu, mem = req.get("cpu"), req.get("memory")
        gpu = next((v for k, v in {**lim, **req}.items() if str(k).endswith("/gpu")), None)
    else:
        cpu, mem, gpu = res.get("cpu"), res.get("memory"), res.get("gpu")
    out = {}
    for key, value, memory in (("cpu", cpu, False), ("memory_bytes", mem, True), ("gpu", gpu, False)):
        n = parse_quantity(value, memory=memory)
        if n is not None:
            out[key] = n
    return out or None
