"""``kind: quantum``: run, submit, poll, fetch and cancel quantum jobs with full provenance.

See docs/quantum.md for the contract. Results:

- ``run`` / ``result``: ``{job_id, status: done, provider, backend, counts, metadata}``
- ``submit`` / ``status`` / ``cancel``: ``{job_id, status, provider, backend, queue_position,
  estimated_wait_seconds, metadata}`` (``status`` one of queued, running, done, failed, cancelled)
- ``queue``: ``{backend, pending_jobs, estimated_wait_seconds, operational, …}``

``metadata``: provider, backend name/version, calibration snapshot (id, timestamp), transpiler
settings used, seeds, shots, circuit hashes, tags, submit/start/end times, queue and execution
seconds, cost (priced providers).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from noetl_dagster.tools.configs import QuantumConfig
from noetl_dagster.tools.quantum.contract import QuantumRequest, config_error, parse_request
from noetl_dagster.tools.quantum.jobs import JobStore, iso, now
from noetl_dagster.tools.quantum.providers import QuantumProvider, get_provider_class
from noetl_dagster.tools.registry import ToolContext, ToolError, register_tool

SECRET_FIELDS = (
    "token",
    "api_key",
    "apikey",
    "password",
    "secret",
    "secret_access_key",
    "access_token",
    "aws_secret_access_key",
    "aws_session_token",
)


_import_lock = threading.Lock()
_imported: set[str] = set()


def preload(provider: str) -> None:
    """Import Qiskit/Aer (and cirq) once, under a lock: parallel loop iterations racing through the first
    import of these C/Rust extensions can crash the interpreter."""
    want = "cirq" if provider == "cirq" else "qiskit"
    if want in _imported:
        return
    with _import_lock:
        if want in _imported:
            return
        from noetl_dagster.tools.quantum.circuits import qiskit_call

        qiskit_call(_warm_up, want == "cirq")
        _imported.add(want)
        _imported.add("qiskit")


def _warm_up(with_cirq: bool) -> None:
    """One tiny circuit through every code path once: parse (2 and 3), transpile, dump, simulate (with noise)."""
    from qiskit import qasm2, qasm3, transpile
    from qiskit_aer import AerSimulator

    from noetl_dagster.tools.quantum.emulated import calibration, noise_model

    qc = qasm3.loads(
        'OPENQASM 3.0;\ninclude "stdgates.inc";\ninput float[64] a;\nqubit[1] q;\nbit[1] c;\nry(a) q[0];\nc[0] = measure q[0];\n'
    )
    qc = qc.assign_parameters([0.1])
    tqc = transpile(qc, basis_gates=["rz", "sx", "x", "cx"], optimization_level=1, seed_transpiler=0)
    back = qasm2.loads(qasm2.dumps(tqc), custom_instructions=qasm2.LEGACY_CUSTOM_INSTRUCTIONS)
    AerSimulator(max_parallel_threads=1, noise_model=noise_model(calibration("warmup", 0.0, 1.0))).run(
        back, shots=1, seed_simulator=0
    ).result()
    if with_cirq:
        import cirq

        cirq.Simulator(seed=0).run(cirq.Circuit(cirq.measure(cirq.LineQubit(0), key="m")), repetitions=1)


def job_store(ctx: ToolContext) -> JobStore:
    data_dir = getattr(ctx, "data_dir", None) or os.environ.get("NOETL_DAGSTER_HOME", ".noetl")
    return JobStore(Path(data_dir) / "quantum")


def _credentials(ref: Any, ctx: ToolContext) -> dict[str, Any] | None:
    if ref is None or ref == "":
        return None
    if isinstance(ref, Mapping):
        cred = dict(ref)
    elif isinstance(ref, str):
        try:
            cred = dict(ctx.credential(ref))
        except Exception as exc:  # noqa: BLE001 - a missing credential is the playbook's mistake
            raise ToolError(f"quantum: credential {ref!r}: {exc}", kind="auth", code="credential") from None
    else:
        raise config_error("credential must be a keychain name or a mapping")
    data = cred.get("data") if isinstance(cred.get("data"), Mapping) else cred
    for k, v in data.items():
        if k.lower() in SECRET_FIELDS and isinstance(v, str) and v:
            ctx.redact(v)
    return cred


def _provider(name: str, store: JobStore, req: QuantumRequest, ctx: ToolContext) -> QuantumProvider:
    cls = get_provider_class(name)
    return cls(store, req.options, _credentials(req.credential, ctx))


def metadata(rec: dict[str, Any]) -> dict[str, Any]:
    res = rec.get("result") or {}
    md = {
        "provider": rec["provider"],
        "backend": rec["backend_info"],
        "calibration": res.get("calibration"),
        "transpiler": rec["transpiler"],
        "seeds": rec["seeds"],
        "shots": rec["shots"],
        "circuit": rec["circuit"],
        "tags": rec["tags"],
        "submitted_at": rec["submitted_at"],
        "started_at": rec.get("started_at"),
        "completed_at": rec.get("completed_at"),
        "queue_seconds": rec.get("queue_seconds"),
        "execution_seconds": rec.get("execution_seconds"),
    }
    if rec.get("cost") is not None:
        md["cost"] = rec["cost"]
    return md


def job_view(rec: dict[str, Any]) -> dict[str, Any]:
    out = {
        "job_id": rec["job_id"],
        "status": rec["status"],
        "provider": rec["provider"],
        "backend": rec["backend"],
        "queue_position": rec.get("queue_position", 0 if rec["status"] == "done" else None),
        "estimated_wait_seconds": rec.get("estimated_wait_seconds", 0.0),
    }
    if rec["status"] == "done":
        out["counts"] = rec["result"]["counts"]
    if rec.get("error"):
        out["error"] = rec["error"]
    out["metadata"] = metadata(rec)
    return out


def _submit(req: QuantumRequest, store: JobStore, ctx: ToolContext) -> tuple[QuantumProvider, dict[str, Any]]:
    from noetl_dagster.tools.quantum.circuits import qiskit_call

    prov = _provider(req.provider, store, req, ctx)
    backend = req.backend or prov.default_backend
    # prepare and submit on the Qiskit thread; only plain data (the job record) leaves it
    rec = qiskit_call(_prepare_and_submit, prov, backend, req, ctx)
    store.save(rec)
    ctx.log(
        f"quantum: submitted {rec['job_id']} to {req.provider}/{backend} ({req.shots} shots, seed {req.seed}): {rec['status']}"
    )
    return prov, rec


def _prepare_and_submit(
    prov: QuantumProvider, backend: str, req: QuantumRequest, ctx: ToolContext
) -> dict[str, Any]:
    from noetl_dagster.tools.quantum.circuits import prepare

    assert req.circuit is not None
    prepared = prepare(req.circuit, req.params, req.transpile, prov.transpile_defaults(backend), req.seed)
    record = {
        "job_id": prov.new_job_id(),
        "provider": req.provider,
        "backend": backend,
        "backend_info": prov.backend_info(backend),
        "status": "queued",
        "submitted_at": iso(now()),
        "shots": req.shots,
        "seeds": {
            "simulator": req.seed,
            "transpiler": prepared.transpiler["seed_transpiler"],
            "given": req.seed_given,
        },  # fmt: skip
        "transpiler": prepared.transpiler,
        "circuit": {
            "source_sha256": prepared.source_sha256,
            "transpiled_sha256": prepared.qasm_sha256,
            **prepared.info,
        },
        "qasm": prepared.qasm,
        "tags": req.tags,
        "execution_id": getattr(ctx, "execution_id", None),
        "step": getattr(ctx, "step", None),
    }
    rec = prov.submit(record, prepared)
    del prepared
    return rec


def _count_usage(rec: dict[str, Any], store: JobStore) -> None:
    """Shots and device seconds into the task's measured usage (engine/usage.py → task_fact), once per
    job: the task that first returns its counts (run, or result after submit/poll) carries them."""
    from noetl_dagster.engine.usage import count

    if rec.get("status") != "done" or rec.get("usage_counted"):
        return
    count(shots=int(rec.get("shots") or 0), qpu_s=float(rec.get("execution_seconds") or 0.0),
          quantum_jobs=1)  # fmt: skip
    rec["usage_counted"] = True
    store.save(rec)


def _done_or_raise(rec: dict[str, Any]) -> dict[str, Any]:
    if rec["status"] == "failed":
        raise ToolError(f"quantum: job {rec['job_id']} failed: {rec.get('error')}", kind="job_failed", code="failed",
                        result=job_view(rec))  # fmt: skip
    if rec["status"] == "cancelled":
        raise ToolError(f"quantum: job {rec['job_id']} was cancelled", kind="job_cancelled", code="cancelled",
                        result=job_view(rec))  # fmt: skip
    if rec["status"] != "done":
        raise ToolError(f"quantum: job {rec['job_id']} is {rec['status']}, no result yet", kind="not_ready",
                        retryable=True, code=rec["status"], result=job_view(rec))  # fmt: skip
    return job_view(rec)


@register_tool("quantum", config=QuantumConfig)
def quantum_tool(inputs: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Quantum circuits on simulators and (emulated) QPUs: run | submit | status | result | cancel | queue."""
    req = parse_request(inputs, ctx)
    preload(req.provider)
    store = job_store(ctx)
    if req.operation == "queue":
        prov = _provider(req.provider, store, req, ctx)
        return prov.queue(req.backend or prov.default_backend)
    if req.operation in ("run", "submit"):
        prov, rec = _submit(req, store, ctx)
        if req.operation == "submit":
            return job_view(rec)
        deadline = time.monotonic() + req.timeout
        while rec["status"] not in ("done", "failed", "cancelled"):
            if time.monotonic() > deadline:
                raise ToolError(f"quantum: job {rec['job_id']} still {rec['status']} after {req.timeout:g} s "
                                "(submit and poll it with status/result instead)", kind="timeout", retryable=True,
                                code="timeout", result=job_view(rec))  # fmt: skip
            time.sleep(max(req.poll_interval, min(float(rec.get("estimated_wait_seconds") or 0.0), 1.0)))
            try:
                rec = prov.status(rec)
            except ToolError as exc:  # the job is submitted: a transient poll failure must not resubmit it
                if not exc.retryable:
                    raise
                ctx.log(f"quantum: polling {rec['job_id']}: {exc.message}; polling again")
        for _ in range(100):
            try:
                rec = prov.result(rec)
                out = _done_or_raise(rec)
                _count_usage(rec, store)
                return out
            except ToolError as exc:
                if not exc.retryable or exc.kind == "not_ready" or time.monotonic() > deadline:
                    raise
                ctx.log(f"quantum: fetching {rec['job_id']}: {exc.message}; polling again")
                time.sleep(req.poll_interval)
        rec = prov.result(rec)
        out = _done_or_raise(rec)
        _count_usage(rec, store)
        return out
    rec = store.load(req.job_id)  # type: ignore[arg-type]
    if req.provider != rec["provider"] and "provider" in inputs:
        raise config_error(f"job {req.job_id} belongs to provider {rec['provider']!r}, not {req.provider!r}")
    prov = _provider(rec["provider"], store, req, ctx)
    if req.operation == "status":
        return job_view(prov.status(rec))
    if req.operation == "cancel":
        return job_view(prov.cancel(rec))
    rec = prov.result(rec)
    out = _done_or_raise(rec)
    _count_usage(rec, store)
    return out
