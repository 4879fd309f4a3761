"""``emulated_qpu``: a local stand-in for a cloud QPU, with everything that makes one awkward to orchestrate.

- **A queue.** The backend has ``queue_depth`` foreign jobs ahead of any new one, drained at
  ``seconds_per_job``; our own jobs queue behind each other (``busy_until`` in the backend state). A job
  is ``queued`` (with a ``queue_position``) until its start time, ``running`` for ``execution_seconds``
  (+ ``seconds_per_shot`` × shots), then ``done``. All of it derives from timestamps stored on disk, so
  a job submitted by one process is polled and fetched by another after a restart.
- **Transient errors.** Each API call (submit, status, result, cancel, queue) fails with probability
  ``transient_error_rate`` as a retryable ``provider_unavailable`` (code 503). The draw is a hash of
  ``error_seed`` and a per-backend call counter kept on disk: a given sequence of calls fails the same way.
- **Calibration drift.** Every ``calibration_period_s`` a new snapshot (id, timestamp, readout and gate
  errors, T1) takes effect; a job runs with the snapshot current at its start and records it.
- **Noise.** The job executes on Aer with a noise model built from that snapshot (depolarising gate
  errors, readout errors), seeded, so counts are reproducible for a given seed and snapshot.
- **Pricing.** ``price_per_task`` + ``price_per_shot`` × shots (USD), charged once the job starts
  running; a job cancelled while queued costs nothing.
- **Hardware constraints.** ``num_qubits`` (default 5) on a line, basis ``rz, sx, x, cx``.
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any

from noetl_dagster.tools.quantum.circuits import QISKIT_LOCK, Prepared, from_qasm2, qiskit_call
from noetl_dagster.tools.quantum.contract import config_error
from noetl_dagster.tools.quantum.jobs import iso, now
from noetl_dagster.tools.quantum.providers import QuantumProvider
from noetl_dagster.tools.registry import ToolError

DEFAULTS: dict[str, Any] = {
    "queue_depth": 2,
    "seconds_per_job": 0.2,
    "execution_seconds": 0.1,
    "seconds_per_shot": 0.0,
    "transient_error_rate": 0.0,
    "error_seed": 0,
    "calibration_period_s": 60.0,
    "price_per_task": 0.30,
    "price_per_shot": 0.00035,
    "num_qubits": 5,
    "noise": True,
}
VERSION = "1.0.0-emulated"


def _unit(*parts: Any) -> float:
    """A uniform number in [0, 1) from a hash of ``parts`` (stable across processes and runs)."""
    h = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def calibration(backend: str, at: float, period: float) -> dict[str, Any]:
    index = int(at // period)
    u = [_unit(backend, index, k) for k in range(4)]
    return {
        "snapshot_id": f"{backend}-cal-{index}",
        "timestamp": iso(index * period),
        "readout_error": round(0.005 + 0.035 * u[0], 5),
        "gate_error_1q": round(0.0001 + 0.0009 * u[1], 6),
        "gate_error_2q": round(0.005 + 0.015 * u[2], 5),
        "t1_us": round(80 + 120 * u[3], 1),
    }


class EmulatedQPU(QuantumProvider):
    name = "emulated_qpu"
    default_backend = "emulated_qpu_5q"
    option_names = None  # checked below, with their types

    def __init__(self, store, options=None, credentials=None):
        super().__init__(store, options, credentials)
        unknown = set(self.options) - set(DEFAULTS)
        if unknown:
            raise config_error(
                f"emulated_qpu: unknown provider_options {sorted(unknown)} (known: {', '.join(DEFAULTS)})"
            )
        self.cfg = {**DEFAULTS, **self.options}
        for k in ("seconds_per_job", "execution_seconds", "seconds_per_shot", "transient_error_rate", "calibration_period_s",
                  "price_per_task", "price_per_shot"):  # fmt: skip
            v = self.cfg[k]
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0 or not math.isfinite(v):
                raise config_error(f"emulated_qpu: {k} must be a number >= 0, got {v!r}")
        if self.cfg["transient_error_rate"] > 1 or self.cfg["calibration_period_s"] <= 0:
            raise config_error(
                "emulated_qpu: transient_error_rate must be in [0, 1], calibration_period_s > 0"
            )
        for k in ("queue_depth", "num_qubits", "error_seed"):
            if isinstance(self.cfg[k], bool) or not isinstance(self.cfg[k], int) or self.cfg[k] < 0:
                raise config_error(f"emulated_qpu: {k} must be an integer >= 0, got {self.cfg[k]!r}")

    # -- backend -----------------------------------------------------------------------------------
    def backend_info(self, backend: str) -> dict[str, Any]:
        return {"name": backend, "version": VERSION, "num_qubits": self.cfg["num_qubits"]}

    def transpile_defaults(self, backend: str) -> dict[str, Any]:
        n = self.cfg["num_qubits"]
        line = [[i, i + 1] for i in range(n - 1)] + [[i + 1, i] for i in range(n - 1)]
        return {"basis_gates": ["rz", "sx", "x", "cx"], "coupling_map": line, "max_qubits": n}

    def _state_name(self, backend: str) -> str:
        return f"backend-{backend}"

    def _api_call(self, backend: str, what: str, cfg: dict[str, Any] | None = None) -> None:
        """Count the call; fail it when the injected-error draw says so (a job's calls use its submit config)."""
        cfg = cfg or self.cfg
        with self.store.locked_state(self._state_name(backend)) as st:
            n = st.get("calls", 0) + 1
            st["calls"] = n
        if (
            cfg["transient_error_rate"]
            and _unit("err", cfg["error_seed"], backend, n) < cfg["transient_error_rate"]
        ):
            raise ToolError(f"emulated_qpu: 503 Service Unavailable on {what} (injected transient error, call {n})",
                            kind="provider_unavailable", retryable=True, code=503)  # fmt: skip

    def _wait_for_new_job(self, st: dict[str, Any], t: float) -> float:
        """When a job submitted at ``t`` would start."""
        foreign = t + self.cfg["queue_depth"] * self.cfg["seconds_per_job"]
        return max(foreign, float(st.get("busy_until", 0.0)))

    def queue(self, backend: str) -> dict[str, Any]:
        self._api_call(backend, "queue")
        t = now()
        with self.store.locked_state(self._state_name(backend)) as st:
            start = self._wait_for_new_job(st, t)
            ours = [e for e in st.get("ends", []) if e > t]
            st["ends"] = ours
        return {
            "backend": backend,
            "operational": True,
            "pending_jobs": self.cfg["queue_depth"] + len(ours),
            "estimated_wait_seconds": round(start - t, 3),
            "calibration": calibration(backend, t, self.cfg["calibration_period_s"]),
        }

    # -- jobs --------------------------------------------------------------------------------------
    def submit(self, record: dict[str, Any], prepared: Prepared) -> dict[str, Any]:
        backend = record["backend"]
        self._api_call(backend, "submit")
        t = now()
        run_s = self.cfg["execution_seconds"] + self.cfg["seconds_per_shot"] * record["shots"]
        with self.store.locked_state(self._state_name(backend)) as st:
            start = self._wait_for_new_job(st, t)
            end = start + run_s
            st["busy_until"] = end
            st["ends"] = [e for e in st.get("ends", []) if e > t] + [end]
        ahead = (
            math.ceil((start - t) / self.cfg["seconds_per_job"] - 1e-6) if self.cfg["seconds_per_job"] else 0
        )
        return {
            **record,
            "status": "queued",
            "emulator": {
                "config": self.cfg,
                "submitted_ts": t,
                "start_ts": start,
                "end_ts": end,
                "queue_ahead": ahead,
            },
            "queue_position": ahead,
            "estimated_wait_seconds": round(start - t, 3),
        }

    def _advance(self, rec: dict[str, Any]) -> dict[str, Any]:
        if rec["status"] in ("done", "failed", "cancelled"):
            return rec
        emu = rec["emulator"]
        cfg = emu["config"]
        t = now()
        if t < emu["start_ts"]:
            spj = cfg["seconds_per_job"]
            pos = max(1, math.ceil((emu["start_ts"] - t) / spj - 1e-6)) if spj else 1
            return {
                **rec,
                "status": "queued",
                "queue_position": pos,
                "estimated_wait_seconds": round(emu["start_ts"] - t, 3),
            }
        if t < emu["end_ts"]:
            return {**rec, "status": "running", "queue_position": 0, "estimated_wait_seconds": 0.0}
        return self._execute(rec)

    def _execute(self, rec: dict[str, Any]) -> dict[str, Any]:
        from qiskit_aer import AerSimulator

        emu = rec["emulator"]
        cfg = emu["config"]
        cal = calibration(rec["backend"], emu["start_ts"], cfg["calibration_period_s"])
        t0 = time.perf_counter()

        def simulate() -> tuple[bool, Any]:
            with QISKIT_LOCK:  # see circuits.qiskit_call
                circuit = from_qasm2(rec["qasm"])
                kw: dict[str, Any] = {}
                if cfg["noise"]:
                    kw["noise_model"] = noise_model(cal)
                sim = AerSimulator(max_parallel_threads=1, **kw)
                res = sim.run(circuit, shots=rec["shots"], seed_simulator=rec["seeds"]["simulator"]).result()
                return (
                    (True, dict(sorted(res.get_counts().items())))
                    if res.success
                    else (False, str(res.status))
                )

        ok, counts = qiskit_call(simulate)
        if not ok:
            return {**rec, "status": "failed", "error": counts}
        compute = time.perf_counter() - t0
        cost = round(cfg["price_per_task"] + cfg["price_per_shot"] * rec["shots"], 6)
        return {
            **rec,
            "status": "done",
            "queue_position": 0,
            "estimated_wait_seconds": 0.0,
            "started_at": iso(emu["start_ts"]),
            "completed_at": iso(emu["end_ts"]),
            "queue_seconds": round(emu["start_ts"] - emu["submitted_ts"], 6),
            "execution_seconds": round(emu["end_ts"] - emu["start_ts"], 6),
            "result": {
                "counts": counts,
                "calibration": cal,
                "emulator_compute_seconds": round(compute, 6),
                "noise": bool(cfg["noise"]),
            },
            "cost": {
                "currency": "USD",
                "amount": cost,
                "price_per_task": cfg["price_per_task"],
                "price_per_shot": cfg["price_per_shot"],
                "shots": rec["shots"],
            },  # fmt: skip
        }

    def status(self, record: dict[str, Any]) -> dict[str, Any]:
        self._api_call(record["backend"], "status", record["emulator"]["config"])
        return self.store.update(record["job_id"], self._advance)

    def result(self, record: dict[str, Any]) -> dict[str, Any]:
        self._api_call(record["backend"], "result", record["emulator"]["config"])
        return self.store.update(record["job_id"], self._advance)

    def cancel(self, record: dict[str, Any]) -> dict[str, Any]:
        self._api_call(record["backend"], "cancel", record["emulator"]["config"])

        def change(rec: dict[str, Any]) -> dict[str, Any]:
            rec = self._advance(rec)
            if rec["status"] not in ("queued", "running"):
                return rec
            charged = rec["status"] == "running"
            cfg = rec["emulator"]["config"]
            cost = round(cfg["price_per_task"] + cfg["price_per_shot"] * rec["shots"], 6) if charged else 0.0
            return {**rec, "status": "cancelled", "cancelled_at": iso(now()), "queue_position": None,
                    "cost": {"currency": "USD", "amount": cost, "price_per_task": cfg["price_per_task"],
                             "price_per_shot": cfg["price_per_shot"], "shots": rec["shots"]}}  # fmt: skip

        rec = self.store.update(record["job_id"], change)
        if rec["status"] == "cancelled":  # free the slot it held in our queue
            with self.store.locked_state(self._state_name(rec["backend"])) as st:
                end = rec["emulator"]["end_ts"]
                st["ends"] = [e for e in st.get("ends", []) if e != end]
                if st.get("busy_until") == end:
                    st["busy_until"] = max(st["ends"], default=0.0)
        return rec


def noise_model(cal: dict[str, Any]) -> Any:
    from qiskit_aer.noise import NoiseModel, ReadoutError, depolarizing_error

    nm = NoiseModel(basis_gates=["rz", "sx", "x", "cx"])
    nm.add_all_qubit_quantum_error(depolarizing_error(cal["gate_error_1q"], 1), ["sx", "x"])
    nm.add_all_qubit_quantum_error(depolarizing_error(cal["gate_error_2q"], 2), ["cx"])
    p = cal["readout_error"]
    nm.add_all_qubit_readout_error(ReadoutError([[1 - p, p], [p, 1 - p]]))
    return nm
