"""Cloud QPU providers: IBM Quantum (``ibm_runtime``, qiskit-ibm-runtime) and Amazon Braket (``braket``, boto3).

Both take their credentials from the keychain (``credential: <name>``; secret fields are redacted by the
tool before the provider sees them) and keep the cloud's own id in the job record (``remote_id``), so
``status``/``result``/``cancel`` work from the job id alone, in another task or process.

- ``ibm_runtime``: ``SamplerV2(mode=backend).run([pub], shots=…)``. A backend named ``fake_<device>`` is
  qiskit-ibm-runtime's fake backend in **local mode** (Aer with the device's noise, seeded, no account,
  no network): the job runs on submit. Any other name goes to ``QiskitRuntimeService``.
- ``braket``: ``CreateQuantumTask`` with an OpenQASM 3 program action
  (``braket.ir.openqasm.program`` v1), results read from the task's S3 ``results.json``.
"""

from __future__ import annotations

import json
import uuid
import warnings
from collections.abc import Mapping
from typing import Any

from noetl_dagster.tools.quantum.circuits import Prepared, counts_from_bits, key_layout
from noetl_dagster.tools.quantum.contract import config_error
from noetl_dagster.tools.quantum.jobs import iso, now
from noetl_dagster.tools.quantum.providers import QuantumProvider
from noetl_dagster.tools.registry import ToolError


def _data(credentials: Mapping[str, Any] | None) -> dict[str, Any]:
    cred = dict(credentials or {})
    return dict(cred["data"]) if isinstance(cred.get("data"), Mapping) else cred


def measured_clbits(circuit: Any) -> dict[int, int]:
    """Physical qubit → classical bit of the transpiled circuit's measurements (the last one wins)."""
    out: dict[int, int] = {}
    for ci in circuit.data:
        if ci.operation.name == "measure":
            out[circuit.find_bit(ci.qubits[0]).index] = circuit.find_bit(ci.clbits[0]).index
    return out


# -- IBM Quantum --------------------------------------------------------------------------------------


def ibm_service_kwargs(credentials: Mapping[str, Any] | None) -> dict[str, Any]:
    """``QiskitRuntimeService(**kwargs)`` from a keychain record: token, channel, instance, url."""
    data = _data(credentials)
    token = data.get("token") or data.get("api_key")
    if not token:
        raise ToolError(
            "ibm_runtime: the credential has no token (keychain data.token)", kind="auth", code="credential"
        )
    kw = {"channel": data.get("channel", "ibm_quantum_platform"), "token": token}
    for k in ("instance", "url"):
        if data.get(k):
            kw[k] = data[k]
    return kw


def sampler_pub(circuit: Any, shots: int) -> Any:
    """The SamplerV2 primitive input (a ``SamplerPub``), validated by qiskit-ibm-runtime's own coercion."""
    from qiskit.primitives.containers.sampler_pub import SamplerPub

    return SamplerPub.coerce((circuit,), shots=shots)


def sampler_counts(pub_result: Any, circuit: Any) -> dict[str, int]:
    """A SamplerV2 pub result → Qiskit-ordered counts over all classical registers."""
    regs = [getattr(pub_result.data, reg.name).get_bitstrings() for reg in reversed(circuit.cregs)]
    out: dict[str, int] = {}
    for shot in zip(*regs, strict=True):
        key = " ".join(shot)
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


_IBM_STATES = {"INITIALIZING": "queued", "QUEUED": "queued", "VALIDATING": "queued", "RUNNING": "running",
               "DONE": "done", "ERROR": "failed", "CANCELLED": "cancelled"}  # fmt: skip


class IBMRuntimeProvider(QuantumProvider):
    name = "ibm_runtime"
    default_backend = "fake_manila"
    option_names = frozenset({"max_execution_time"})

    def _fake(self, backend: str) -> Any | None:
        if not backend.startswith("fake_"):
            return None
        from qiskit_ibm_runtime import fake_provider

        for cls_name in dir(fake_provider):
            if cls_name.startswith("Fake") and cls_name.endswith("V2"):
                cls = getattr(fake_provider, cls_name)
                if getattr(cls, "backend_name", None) == backend:
                    return cls()
        names = sorted(getattr(fake_provider, c).backend_name for c in dir(fake_provider)
                       if c.startswith("Fake") and c.endswith("V2") and hasattr(getattr(fake_provider, c), "backend_name"))  # fmt: skip
        raise config_error(
            f"ibm_runtime: unknown fake backend {backend!r} (e.g. {', '.join(names[:6])}, …)",
            "unknown_backend",
        )

    def _service(self) -> Any:
        from qiskit_ibm_runtime import QiskitRuntimeService

        try:
            return QiskitRuntimeService(**ibm_service_kwargs(self.credentials))
        except ToolError:
            raise
        except Exception as exc:  # noqa: BLE001 - auth/network: the provider is unavailable
            raise ToolError(
                f"ibm_runtime: service: {exc}", kind="provider_unavailable", retryable=True, code="service"
            ) from None

    def _backend(self, backend: str) -> Any:
        return self._fake(backend) or self._service().backend(backend)

    def backend_info(self, backend: str) -> dict[str, Any]:
        import qiskit_ibm_runtime

        b = self._backend(backend)
        return {"name": b.name, "version": str(getattr(b, "backend_version", "unknown")), "num_qubits": b.num_qubits,
                "qiskit_ibm_runtime": qiskit_ibm_runtime.__version__, "local_mode": backend.startswith("fake_")}  # fmt: skip

    def transpile_defaults(self, backend: str) -> dict[str, Any]:
        b = self._backend(backend)
        basis = [
            g
            for g in b.target.operation_names
            if g
            not in ("measure", "delay", "reset", "for_loop", "if_else", "switch_case", "while_loop", "id")
        ]
        return {"basis_gates": sorted(basis), "coupling_map": [list(e) for e in b.coupling_map.get_edges()],
                "max_qubits": b.num_qubits}  # fmt: skip

    def _calibration(self, b: Any) -> dict[str, Any]:
        props = b.properties() if hasattr(b, "properties") else None
        ts = props.last_update_date.isoformat() if props is not None else None
        return {
            "snapshot_id": f"{b.name}@{ts}" if ts else None,
            "timestamp": ts,
            "kind": "backend properties",
        }

    def submit(self, record: dict[str, Any], prepared: Prepared) -> dict[str, Any]:
        from qiskit_ibm_runtime import SamplerV2

        b = self._backend(record["backend"])
        pub = sampler_pub(prepared.circuit, record["shots"])
        with warnings.catch_warnings():  # SamplerV2 is deprecated in 0.50 in favour of a client-side Sampler
            warnings.simplefilter("ignore", DeprecationWarning)
            sampler = SamplerV2(mode=b)
            if record["backend"].startswith("fake_"):
                sampler.options.simulator.seed_simulator = record["seeds"]["simulator"]
            started = now()
            job = sampler.run([pub], shots=record["shots"])
        rec = {**record, "remote_id": job.job_id(), "status": "queued", "calibration": self._calibration(b)}
        if not record["backend"].startswith("fake_"):
            return rec
        res = job.result()  # local mode: Aer runs in-process
        return {**rec, "status": "done", "started_at": iso(started), "completed_at": iso(now()), "queue_seconds": 0.0,
                "execution_seconds": round(now() - started, 6),
                "result": {"counts": sampler_counts(res[0], prepared.circuit), "calibration": rec["calibration"]}}  # fmt: skip

    def status(self, record: dict[str, Any]) -> dict[str, Any]:
        if record["status"] in ("done", "failed", "cancelled") or record["backend"].startswith("fake_"):
            return record
        job = self._service().job(record["remote_id"])
        state = _IBM_STATES.get(str(getattr(job.status(), "name", job.status())).upper(), "queued")
        rec = {**record, "status": state}
        if state == "done":
            from noetl_dagster.tools.quantum.circuits import from_qasm2

            rec["result"] = {"counts": sampler_counts(job.result()[0], from_qasm2(record["qasm"])),
                             "calibration": record.get("calibration")}  # fmt: skip
            rec["completed_at"] = iso(now())
        return rec

    def cancel(self, record: dict[str, Any]) -> dict[str, Any]:
        rec = self.status(record)
        if rec["status"] in ("queued", "running"):
            self._service().job(rec["remote_id"]).cancel()
            rec = {**rec, "status": "cancelled", "cancelled_at": iso(now())}
        return rec


# -- Amazon Braket ------------------------------------------------------------------------------------

BRAKET_DEVICES = {"sv1": "arn:aws:braket:::device/quantum-simulator/amazon/sv1",
                  "dm1": "arn:aws:braket:::device/quantum-simulator/amazon/dm1",
                  "tn1": "arn:aws:braket:::device/quantum-simulator/amazon/tn1"}  # fmt: skip
_BRAKET_STATES = {"CREATED": "queued", "QUEUED": "queued", "RUNNING": "running", "COMPLETED": "done",
                  "FAILED": "failed", "CANCELLING": "cancelled", "CANCELLED": "cancelled"}  # fmt: skip


def braket_action(qasm3_source: str) -> str:
    """The CreateQuantumTask ``action``: an OpenQASM 3 program in Braket's IR schema."""
    return json.dumps({"braketSchemaHeader": {"name": "braket.ir.openqasm.program", "version": "1"},
                       "source": qasm3_source, "inputs": {}}, sort_keys=True)  # fmt: skip


class BraketProvider(QuantumProvider):
    name = "braket"
    default_backend = "sv1"
    option_names = frozenset({"s3_bucket", "s3_prefix", "region"})

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        self._clients: dict[str, Any] = {}

    def client(self, service: str) -> Any:
        """A boto3 client on a session made from the keychain credential (never the ambient AWS config)."""
        if service not in self._clients:
            import boto3

            data = _data(self.credentials)
            if not data.get("aws_access_key_id") or not data.get("aws_secret_access_key"):
                raise ToolError("braket: the credential needs aws_access_key_id and aws_secret_access_key",
                                kind="auth", code="credential")  # fmt: skip
            session = boto3.Session(aws_access_key_id=data["aws_access_key_id"],
                                    aws_secret_access_key=data["aws_secret_access_key"],
                                    aws_session_token=data.get("aws_session_token"),
                                    region_name=self.options.get("region") or data.get("region") or "us-east-1")  # fmt: skip
            self._clients[service] = session.client(service)
        return self._clients[service]

    @staticmethod
    def device_arn(backend: str) -> str:
        if backend.startswith("arn:aws:braket:"):
            return backend
        if backend in BRAKET_DEVICES:
            return BRAKET_DEVICES[backend]
        raise config_error(
            f"braket: unknown backend {backend!r} (a device ARN or {', '.join(BRAKET_DEVICES)})",
            "unknown_backend",
        )

    def backend_info(self, backend: str) -> dict[str, Any]:
        return {"name": backend, "version": "device ARN", "arn": self.device_arn(backend)}

    def create_task_request(self, record: dict[str, Any], prepared: Prepared) -> dict[str, Any]:
        """The CreateQuantumTask parameters (what goes on the wire)."""
        from qiskit import qasm3

        bucket = self.options.get("s3_bucket")
        if not bucket:
            raise config_error("braket: provider_options.s3_bucket is required (Braket writes results to S3)")
        return {"clientToken": record["job_id"], "deviceArn": self.device_arn(record["backend"]),
                "shots": record["shots"], "outputS3Bucket": bucket,
                "outputS3KeyPrefix": self.options.get("s3_prefix", "noetl-quantum"),
                "action": braket_action(qasm3.dumps(prepared.circuit)),
                "tags": {str(k): str(v) for k, v in (record.get("tags") or {}).items()} if isinstance(record.get("tags"), Mapping) else {}}  # fmt: skip

    def submit(self, record: dict[str, Any], prepared: Prepared) -> dict[str, Any]:
        req = self.create_task_request(record, prepared)
        resp = self._call("braket", "create_quantum_task", **req)
        return {**record, "remote_id": resp["quantumTaskArn"], "status": "queued",
                "measured": {str(q): c for q, c in measured_clbits(prepared.circuit).items()},
                "num_clbits": prepared.circuit.num_clbits, "layout": key_layout(prepared.circuit)}  # fmt: skip

    def _call(self, service: str, op: str, **kw: Any) -> dict[str, Any]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client(service), op)(**kw)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "ClientError")
            retry = code in (
                "ThrottlingException",
                "InternalServiceException",
                "ServiceQuotaExceededException",
            )
            raise ToolError(f"braket: {op}: {code}: {exc}", kind="provider_unavailable" if retry else "provider_error",
                            retryable=retry, code=code) from None  # fmt: skip
        except BotoCoreError as exc:
            raise ToolError(
                f"braket: {op}: {exc}", kind="provider_unavailable", retryable=True, code="botocore"
            ) from None

    def status(self, record: dict[str, Any]) -> dict[str, Any]:
        if record["status"] in ("done", "failed", "cancelled"):
            return record
        task = self._call("braket", "get_quantum_task", quantumTaskArn=record["remote_id"])
        state = _BRAKET_STATES.get(task["status"], "queued")
        rec = {**record, "status": state}
        qi = task.get("queueInfo") or {}
        if qi.get("position"):
            rec["queue_position"] = int(qi["position"]) if str(qi["position"]).isdigit() else qi["position"]
        if state == "failed":
            rec["error"] = task.get("failureReason")
        if state == "done":
            rec["result"] = self._fetch(task, rec)
            rec["completed_at"] = iso(now())
        return rec

    def _fetch(self, task: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        bucket, key = task["outputS3Bucket"], task["outputS3Directory"].rstrip("/") + "/results.json"
        body = json.loads(self._call("s3", "get_object", Bucket=bucket, Key=key)["Body"].read())
        if body.get("measurements") is None or body.get("measuredQubits") is None:
            raise ToolError(f"braket: results.json of {task['quantumTaskArn']} has no measurements", kind="provider_error",
                            code="no_measurements")  # fmt: skip
        shots = np.asarray(body["measurements"], dtype=np.uint8)
        bits = np.zeros((len(shots), rec["num_clbits"]), dtype=np.uint8)
        for col, q in enumerate(
            body["measuredQubits"]
        ):  # Braket lists qubit 0 first; each measured qubit → its clbit
            cl = rec["measured"].get(str(q))
            if cl is not None:
                bits[:, cl] = shots[:, col]
        return {"counts": counts_from_bits(bits, rec["layout"]), "measured_qubits": body["measuredQubits"],
                "task_metadata": body.get("taskMetadata", {}),
                "calibration": {"snapshot_id": None, "timestamp": iso(now()), "kind": "braket device properties"}}  # fmt: skip

    def cancel(self, record: dict[str, Any]) -> dict[str, Any]:
        rec = self.status(record)
        if rec["status"] in ("queued", "running"):
            self._call(
                "braket",
                "cancel_quantum_task",
                quantumTaskArn=rec["remote_id"],
                clientToken=str(uuid.uuid4()),
            )
            rec = {**rec, "status": "cancelled", "cancelled_at": iso(now())}
        return rec
