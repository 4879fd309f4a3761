"""``kind: quantum``: quantum circuits on pluggable providers (Aer, cirq, a local queued-QPU emulator).

Importing this package registers the kind; Qiskit, Aer and cirq load only when a task needs them.
See docs/quantum.md.
"""

from noetl_dagster.tools.quantum.jobs import JobStore
from noetl_dagster.tools.quantum.providers import (
    ENTRY_POINT_GROUP,
    QuantumProvider,
    get_provider_class,
    provider_names,
    register_provider,
)
from noetl_dagster.tools.quantum.tool import quantum_tool

__all__ = [
    "ENTRY_POINT_GROUP",
    "JobStore",
    "QuantumProvider",
    "get_provider_class",
    "provider_names",
    "quantum_tool",
    "register_provider",
]
