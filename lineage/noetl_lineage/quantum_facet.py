"""The ``noetl_quantum`` OpenLineage run facet: the provenance of the quantum jobs a step ran.

One entry per job (``kind: quantum`` task results with ``metadata``): provider, backend name and
version, calibration snapshot, transpiler settings, seeds, shots, queue/execution seconds, cost.
Counts are data, not provenance: they stay in the result (and its stored reference).
"""

from __future__ import annotations

from typing import Any

import attr
from openlineage.client.generated.base import RunFacet

FACET_NAME = "noetl_quantum"
SCHEMA_URL = "https://noetl.io/spec/facets/1-0-0/QuantumJobsRunFacet.json"
MAX_JOBS = 200  # a wide sweep step: keep the facet bounded; the events hold every job
_KEYS = ("provider", "backend", "calibration", "transpiler", "seeds", "shots", "tags", "queue_seconds",
         "execution_seconds", "submitted_at", "completed_at", "cost")  # fmt: skip


@attr.define
class QuantumJobsRunFacet(RunFacet):
    jobs: list[dict[str, Any]] = attr.field(factory=list)
    truncated: int = attr.field(default=0)

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA_URL


def quantum_provenance(result: Any) -> dict[str, Any] | None:
    """The provenance of one quantum task result, or None for anything else."""
    if not isinstance(result, dict) or not result.get("job_id"):
        return None
    md = result.get("metadata")
    if not isinstance(md, dict) or "seeds" not in md or "transpiler" not in md:
        return None
    out = {"job_id": result["job_id"], "status": result.get("status")}
    out.update({k: md[k] for k in _KEYS if k in md})
    circuit = md.get("circuit")
    if isinstance(circuit, dict):
        out["circuit_sha256"] = circuit.get("source_sha256")
    return out
