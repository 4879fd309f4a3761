"""What one event used, in the price table's units (usage lines): a task attempt's CPU, RAM, GPU,
egress, call and quantum lines, stored references, the engine's platform CPU. Pure functions of an
event, no price table: analytics.pricing prices them, and the execution summary the event stores
keep (engine/explain.py) aggregates them per step run at append time. :class:`BilledRefs` is the one
rule for stored references every cost view applies (billed once, to the execution that stored it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# category -> unit of its quantity; the price is per unit
UNITS = {
    "compute": "core_hour",
    "ram": "gb_hour",
    "gpu": "gpu_hour",
    "egress": "gb",
    "storage": "gb_month",
    "call": "call",
    "quantum": "item",  # the item is the unit: shot | qpu_second
    "platform": "core_hour",
}


# -- usage lines: what one event used, in the price table's units ----------------------------------
def _number(value: Any) -> float | None:
    """A value as the facts writer stores a Float64 (analytics/noetl_analytics/facts.py ``_as_number``)."""
    if (
        type(value) is float or type(value) is int
    ):  # the common case, first (the summary folds every task.done)
        return float(value) if value == value else None
    if value is None or isinstance(value, bool):
        return None if value is None else float(value)
    try:
        n = float(value)
    except (TypeError, ValueError):
        return None
    return n if n == n else None


def _dict(value: Any) -> dict[str, Any]:
    return value if type(value) is dict else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class UsageLine:
    """One priced quantity of one event. ``quantity`` = max(``used``, ``requested``) (a step that
    declares Kubernetes requests pays for what it reserved when it used less); ``key`` names a
    stored object (billed once per execution that stored it, :class:`BilledRefs`); ``kind`` resolves an empty worker class."""

    category: str
    item: str
    quantity: float
    used: float = 0.0
    requested: float = 0.0
    key: str = ""
    kind: str = ""

    @property
    def unit(self) -> str:
        return self.item if self.category == "quantum" else UNITS[self.category]


_REF_EVENTS = ("step.done", "loop.iteration.done", "loop.done")
_TERMINAL = ("workflow.finished", "playbook.processed")


def _ref(value: Any) -> dict[str, Any] | None:
    if type(value) is dict and len(value) == 1 and type(value.get("$ref")) is dict:
        return value["$ref"]
    return None


Line = tuple[str, str, float, float, float, str, str]  # UsageLine's fields, in order (cheap to make)


def _storage(ref: dict[str, Any]) -> Line | None:
    gb = (_number(ref.get("size")) or 0.0) / 1e9
    uri = ref.get("uri")
    if gb <= 0 or not isinstance(uri, str):
        return None
    return ("storage", _text(ref.get("store")) or "default", gb, gb, 0.0, uri, "")


def created_refs(name: str, data: Any) -> list[dict[str, Any]]:
    """References an event created (the facts writer's ``resource_fact`` ``created`` rows)."""
    d = _dict(data)
    out: list[dict[str, Any]] = []
    if name == "task.done":
        result = _dict(_dict(d.get("outcome")).get("result"))
        ref = _ref(result)
        if ref is not None:
            out.append(ref)
        elif str(result.get("uri") or "").startswith("noetl://") and "checksum" in result:
            out.append(result)
    elif name in _REF_EVENTS:
        ref = _ref(d.get("result"))
        if ref is not None:
            out.append(ref)
        elif (
            name == "loop.done" and type(d.get("result")) is dict and type(d["result"].get("results")) is list
        ):
            out.extend(r for r in map(_ref, d["result"]["results"]) if r is not None)
    return out


def requests_of(meta: dict[str, Any]) -> tuple[float, float, float]:
    """(cores, memory bytes, GPUs) a step declared as Kubernetes requests (``meta.requests``)."""
    req = meta.get("requests")
    if not req or type(req) is not dict:
        return (0.0, 0.0, 0.0)
    return (
        _number(req.get("cpu")) or 0.0,
        _number(req.get("memory_bytes")) or 0.0,
        _number(req.get("gpu")) or 0.0,
    )


def usage_lines(name: str, data: Any) -> list[UsageLine]:
    """The priced usage of one event (``name``, ``data``): a task attempt's CPU, RAM, GPU, egress, call
    and quantum lines, the references an event created (storage), and the engine's own CPU recorded on
    the execution's terminal event (``platform``). The facts writer stores these lines
    (``usage_fact``); Dagster's cost metadata prices the same lines."""
    return [UsageLine(*t) for t in line_tuples(name, data)]


def line_tuples(name: str, data: Any) -> list[Line]:
    """:func:`usage_lines` as plain tuples of UsageLine's fields (the execution summary folds
    every task.done: a frozen dataclass per line was most of its cost)."""
    d = _dict(data)
    lines: list[Line] = []
    refs = name in _REF_EVENTS  # (a terminal event names no reference)
    if name == "task.done":
        outcome = _dict(d.get("outcome"))
        result = outcome.get("result")
        refs = type(result) is dict and ("$ref" in result or "uri" in result)  # else created_refs finds none
        meta = _dict(outcome.get("meta"))
        usage = _dict(meta.get("usage"))
        kind = _text(d.get("kind"))
        wclass = _text(meta.get("worker_class")) or (_text(d["worker_class"]) if "worker_class" in d else "")
        hours = (_number(meta.get("duration_ms")) or 0.0) / 3.6e6
        req_cpu, req_mem, req_gpu = requests_of(meta)
        cpu_ms = _number(meta["cpu_ms"]) if "cpu_ms" in meta else None
        if cpu_ms is None and "cpu_s" in usage:
            child = _number(usage["child_cpu_s"]) if "child_cpu_s" in usage else None
            cpu_ms = ((_number(usage.get("cpu_s")) or 0.0) + (child or 0.0)) * 1000
        if cpu_ms is None:  # recorded before usage was measured: runtime x units
            units = _number(meta.get("units"))
            cpu_ms = hours * 3.6e6 * (1.0 if units is None else units)
        _maxed(lines, "compute", wclass, cpu_ms / 3.6e6, req_cpu * hours, kind)
        mem = _number(usage.get("mem_delta_bytes")) or 0.0
        _maxed(lines, "ram", wclass, max(mem, 0.0) * hours / 1e9, req_mem * hours / 1e9, kind)
        if req_gpu or "gpu_s" in usage or "gpus" in usage or "gpus" in meta:  # else no GPU line (0 hours)
            gpu_s = _number(usage.get("gpu_s"))
            gpus = _number(usage.get("gpus")) or _number(meta.get("gpus")) or 0.0
            gpu_h = gpu_s / 3600 if gpu_s is not None else gpus * hours
            gclass = _text(usage.get("gpu_class")) or _text(meta.get("gpu_class")) or wclass
            _maxed(lines, "gpu", gclass, gpu_h, req_gpu * hours, kind)
        egress = meta.get("egress_bytes")
        if egress is None:
            egress = usage.get("egress_bytes")
        if egress is None and "http" in outcome:
            egress = _dict(outcome["http"]).get("request_bytes")
        gb = (_number(egress) or 0.0) / 1e9 if egress is not None else 0.0
        if gb > 0:
            lines.append(("egress", _text(meta.get("region")) or "default", gb, gb, 0.0, "", ""))
        lines.append(("call", kind or "default", 1.0, 1.0, 0.0, "", ""))
        if "shots" in usage or "qpu_s" in usage:
            for item, key in (("shot", "shots"), ("qpu_second", "qpu_s")):
                q = _number(usage.get(key)) or 0.0
                if q > 0:
                    lines.append(("quantum", item, q, q, 0.0, "", ""))
    elif name in _TERMINAL:
        # the engine's CPU no attempt used: workflow.finished `platform: {cpu_s, ...}` (engine/usage.py
        # Window); a terminal event's `usage.platform_cpu_s` is read too
        plat = _dict(d.get("platform"))
        cpu_s = _number(plat.get("cpu_s"))
        if cpu_s is None:
            cpu_s = _number(_dict(d.get("usage")).get("platform_cpu_s"))
        if cpu_s and cpu_s > 0:
            lines.append(("platform", "default", cpu_s / 3600, cpu_s / 3600, 0.0, "", ""))
    if refs:
        for ref in created_refs(name, d):
            line = _storage(ref)
            if line is not None:
                lines.append(line)
    return lines


class BilledRefs:
    """The stored references one execution has billed: the one rule for storage lines, in every cost
    view. A storage act is billed to the execution that stored it, once: a storage line (a line with
    a ``key``: the object's uri) is billed to its execution by the first event in its order whose
    lines name it; the task.done that stored it, its step.done, a loop iteration's done, loop.done's
    list of the iterations' results, the same step run again in a cycle and a later step passing the
    reference on name it again, unbilled. A reference that names its producer (``$ref.execution_id``)
    is billed to that execution only, never to one passing it on (a sub-playbook's result handed to
    its parent). A reference without a producer (a user-chosen uri) is taken as stored by each
    execution that names it: a path written again by the next run is that run's write and costs it
    again. So the bill is per (execution, key), never across executions: every view can apply it to
    one execution's log alone, and a re-export (the same events again) bills nothing new. Every other
    line is billed as it comes. Used by ``noetl_analytics.pricing.cost_of_events`` (Dagster's cost
    metadata, whole execution and per op), the facts writer (``usage_fact`` holds only billed lines;
    the priced table keeps the first of them per ``(execution_id, key)`` across export batches) and
    the execution summary (``engine/explain.py``: its rows keep ``order``, the keys in the order
    billed, in chunks of ``CHUNK`` that never change once full)."""

    CHUNK = 512
    __slots__ = ("keys", "order", "saved")

    def __init__(self, order: list[str] | None = None):
        self.order: list[str] = list(order or ())
        self.keys: set[str] = set(self.order)
        self.saved = len(self.order)  # keys already in stored chunks (the summary's rows)

    def first(self, key: str) -> bool:
        """Whether the line naming ``key`` is billed (the first to name it), marking it billed."""
        if key in self.keys:
            return False
        self.keys.add(key)
        self.order.append(key)
        return True

    def bill(self, lines: list[Line], foreign: frozenset[str] | set[str] = frozenset()) -> list[Line]:
        """The lines of one event that are billed, in order (storage lines named before, or stored by
        another execution (``foreign``), dropped)."""
        for line in lines:
            if line[5]:
                break
        else:  # no storage line: the common case, as is
            return lines
        return [line for line in lines if not line[5] or (line[5] not in foreign and self.first(line[5]))]

    def billable(self, key: str, foreign: frozenset[str] | set[str] = frozenset()) -> bool:
        """Whether a storage line naming ``key`` is billed now (marking it billed)."""
        return key not in foreign and self.first(key)

    def lines(self, name: str, data: Any, execution_id: str | None = None) -> list[Line]:
        """The billed usage lines of the execution ``execution_id``'s next event (``name``, ``data``)."""
        lines = line_tuples(name, data)
        for line in lines:
            if line[5]:
                return self.bill(lines, foreign_refs(name, data, execution_id))
        return lines


def foreign_refs(name: str, data: Any, execution_id: str | None) -> frozenset[str]:
    """The uris of the references event (``name``, ``data``) of execution ``execution_id`` names that
    another execution stored (their ``$ref.execution_id``, the producer, differs): billed to their
    producer, never to an execution passing them on (:class:`BilledRefs`)."""
    if not execution_id:
        return frozenset()
    return frozenset(
        r["uri"]
        for r in created_refs(name, data)
        if isinstance(r.get("uri"), str) and r.get("execution_id") and r.get("execution_id") != execution_id
    )


def _maxed(lines: list[Line], category: str, item: str, used: float, requested: float, kind: str) -> None:
    q = max(used, requested)
    if q > 0:
        lines.append((category, item, q, used, requested, "", kind))
