"""Quantum providers: one interface (submit → job id, status, result, cancel), plugins registered by name.

Built-ins: ``aer`` (Qiskit Aer, the default), ``cirq`` (cirq-core's simulator, an independent cross-check)
and ``emulated_qpu`` (a local queued-QPU emulator). Third parties register a provider class under the
entry-point group ``noetl_dagster.quantum_providers`` (``name = "package.module:ProviderClass"``) or call
:func:`register_provider`.

A provider is constructed per task call with the job store, its ``provider_options`` and the resolved
credential (a keychain record, or ``None``). Job records are plain dicts persisted by the store:
``{job_id, provider, backend, status, submitted_at, shots, seeds, qasm, …, result}``.
"""

from __future__ import annotations

import importlib
import threading
import time
import uuid
from abc import ABC, abstractmethod
from importlib.metadata import entry_points
from typing import Any

from noetl_dagster.tools.quantum.circuits import DEFAULT_BASIS, QISKIT_LOCK, Prepared
from noetl_dagster.tools.quantum.contract import config_error
from noetl_dagster.tools.quantum.jobs import JobStore, iso, now

ENTRY_POINT_GROUP = "noetl_dagster.quantum_providers"


class QuantumProvider(ABC):
    name: str = ""
    default_backend: str = ""
    # provider_options this provider understands (None: it checks them itself)
    option_names: frozenset[str] | None = frozenset()

    def __init__(
        self,
        store: JobStore,
        options: dict[str, Any] | None = None,
        credentials: dict[str, Any] | None = None,
    ):
        self.store = store
        self.options = dict(options or {})
        self.credentials = credentials
        if self.option_names is not None and set(self.options) - self.option_names:
            raise config_error(f"{self.name}: unknown provider_options {sorted(set(self.options) - self.option_names)}"
                               f" (known: {', '.join(sorted(self.option_names)) or 'none'})")  # fmt: skip

    # -- what the tool asks before submitting --------------------------------------------------
    def backend_info(self, backend: str) -> dict[str, Any]:
        """``{name, version}`` plus anything a backend publishes (qubits, basis)."""
        return {"name": backend, "version": "unknown"}

    def transpile_defaults(self, backend: str) -> dict[str, Any]:
        """Transpiler settings the backend needs (basis gates, coupling map, max_qubits); user settings win."""
        return {}

    def queue(self, backend: str) -> dict[str, Any]:
        """The backend's queue as a cloud provider reports it (``pending_jobs``, ``estimated_wait_seconds``)."""
        return {"backend": backend, "pending_jobs": 0, "estimated_wait_seconds": 0.0, "operational": True}

    # -- the job interface ---------------------------------------------------------------------
    @abstractmethod
    def submit(self, record: dict[str, Any], prepared: Prepared) -> dict[str, Any]:
        """Start the job described by ``record`` (already carrying job_id, shots, seeds); return the record."""

    @abstractmethod
    def status(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record with ``status`` brought up to date (queued, running, done, failed, cancelled)."""

    def result(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record with ``result`` ({counts, calibration, …}) once done."""
        return self.status(record)

    def cancel(self, record: dict[str, Any]) -> dict[str, Any]:
        rec = self.status(record)
        if rec["status"] in ("queued", "running"):
            rec = {**rec, "status": "cancelled", "cancelled_at": iso(now())}
        return rec

    def new_job_id(self) -> str:
        return f"{self.name}-{uuid.uuid4().hex[:20]}"


class LocalSimulator(QuantumProvider):
    """Simulators run on submit: the job is done by the time submit returns (no queue)."""

    @abstractmethod
    def simulate(self, prepared_circuit: Any, shots: int, seed: int, backend: str) -> dict[str, Any]:
        """``{"counts": {...}}`` plus anything worth recording."""

    def submit(self, record: dict[str, Any], prepared: Prepared) -> dict[str, Any]:
        t0 = time.perf_counter()
        started = now()
        out = self.simulate(
            prepared.circuit, record["shots"], record["seeds"]["simulator"], record["backend"]
        )
        elapsed = time.perf_counter() - t0
        return {
            **record,
            "status": "done",
            "started_at": iso(started),
            "completed_at": iso(now()),
            "queue_seconds": 0.0,
            "execution_seconds": round(elapsed, 6),
            "result": {**out, "calibration": {"snapshot_id": None, "timestamp": iso(started),
                                              "kind": "ideal simulator (no calibration)"}},
        }  # fmt: skip

    def status(self, record: dict[str, Any]) -> dict[str, Any]:
        return record


class AerProvider(LocalSimulator):
    """Qiskit Aer (``AerSimulator``), seeded: the same seed reproduces the same counts."""

    name = "aer"
    default_backend = "aer_simulator"
    option_names = frozenset({"method", "max_parallel_threads"})

    def backend_info(self, backend: str) -> dict[str, Any]:
        import qiskit
        import qiskit_aer

        return {"name": backend, "version": qiskit_aer.__version__, "qiskit": qiskit.__version__}

    def simulate(self, circuit: Any, shots: int, seed: int, backend: str) -> dict[str, Any]:
        from qiskit_aer import AerSimulator

        method = self.options.get("method", "automatic")
        if backend not in ("aer_simulator", "aer"):
            if not backend.startswith("aer_simulator_"):
                raise config_error(
                    f"aer: unknown backend {backend!r} (aer_simulator or aer_simulator_<method>)",
                    "unknown_backend",
                )
            method = backend[len("aer_simulator_") :]
        try:
            # Qiskit's Rust circuit code and Aer crashed when driven from parallel loop threads at once
            with QISKIT_LOCK:
                sim = AerSimulator(
                    method=method, max_parallel_threads=int(self.options.get("max_parallel_threads", 1))
                )
                res = sim.run(circuit, shots=shots, seed_simulator=seed).result()
        except Exception as exc:  # noqa: BLE001
            raise config_error(f"aer: simulation refused: {exc}", "simulator_error") from None
        if not res.success:
            raise config_error(f"aer: simulation failed: {res.status}", "simulator_error")
        return {"counts": dict(sorted(res.get_counts().items())), "method": method}


class CirqProvider(LocalSimulator):
    """cirq-core's state-vector ``Simulator``: an independent implementation to cross-check Aer."""

    name = "cirq"
    default_backend = "cirq_simulator"

    def backend_info(self, backend: str) -> dict[str, Any]:
        import cirq

        return {"name": backend, "version": cirq.__version__}

    def transpile_defaults(self, backend: str) -> dict[str, Any]:
        return {"basis_gates": [g for g in DEFAULT_BASIS if g not in ("u", "p")]}

    def simulate(self, circuit: Any, shots: int, seed: int, backend: str) -> dict[str, Any]:
        import cirq
        import numpy as np

        from noetl_dagster.tools.quantum.circuits import counts_from_bits, key_layout, to_cirq

        if backend not in ("cirq_simulator", "cirq"):
            raise config_error(f"cirq: unknown backend {backend!r} (cirq_simulator)", "unknown_backend")
        with QISKIT_LOCK:  # reading the Qiskit circuit; the cirq simulation itself runs unlocked
            cc, keys = to_cirq(circuit)
            layout = key_layout(circuit)
            n_clbits = circuit.num_clbits
        run = cirq.Simulator(seed=seed).run(cc, repetitions=shots)
        bits = np.zeros((shots, n_clbits), dtype=np.uint8)
        for key, cl in keys:  # in program order: a later measurement into one clbit overwrites an earlier one
            bits[:, cl] = run.measurements[key][:, 0]
        counts = counts_from_bits(bits, layout)
        return {"counts": counts}


_lock = threading.Lock()
_PROVIDERS: dict[str, type[QuantumProvider]] = {}
_BUILTIN = {"aer": AerProvider, "cirq": CirqProvider}
_BUILTIN_ELSEWHERE = {
    "emulated_qpu": "noetl_dagster.tools.quantum.emulated:EmulatedQPU",
    "ibm_runtime": "noetl_dagster.tools.quantum.cloud:IBMRuntimeProvider",
    "braket": "noetl_dagster.tools.quantum.cloud:BraketProvider",
}
_entry_points: dict[str, Any] | None = None


def register_provider(name: str, cls: type[QuantumProvider] | None = None):
    """Register a provider class by name; usable as a decorator."""

    def deco(c: type[QuantumProvider]) -> type[QuantumProvider]:
        if not (isinstance(c, type) and issubclass(c, QuantumProvider)):
            raise TypeError(f"quantum provider {name!r} must be a QuantumProvider subclass, got {c!r}")
        with _lock:
            _PROVIDERS[name] = c
        return c

    return deco(cls) if cls is not None else deco


def _eps() -> dict[str, Any]:
    global _entry_points
    if _entry_points is None:
        _entry_points = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return _entry_points


def provider_names() -> list[str]:
    return sorted(set(_BUILTIN) | set(_BUILTIN_ELSEWHERE) | set(_PROVIDERS) | set(_eps()))


def get_provider_class(name: str) -> type[QuantumProvider]:
    if name in _PROVIDERS:
        return _PROVIDERS[name]
    if name in _BUILTIN:
        return _BUILTIN[name]
    if (
        name in _BUILTIN_ELSEWHERE
    ):  # by name, so this module and the emulator (a subclass) form no import cycle
        module, _, attr = _BUILTIN_ELSEWHERE[name].partition(":")
        return getattr(importlib.import_module(module), attr)
    ep = _eps().get(name)
    if ep is not None:
        cls = ep.load()
        register_provider(name, cls)
        return cls
    raise config_error(
        f"unknown provider {name!r} (known: {', '.join(provider_names())})", "unknown_provider"
    )
