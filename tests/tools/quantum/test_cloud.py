"""Cloud providers offline: IBM through qiskit-ibm-runtime's fake backends in local mode (the SDK's own
SamplerV2, seeded Aer with the device's noise); Braket through boto3's braket/s3 clients with botocore's
Stubber, which checks every request against the service model (no network, no account)."""

from __future__ import annotations

import io
import json

import pytest
from quantum_helpers import BELL, ORDER

from noetl_dagster.engine.keychain import FileProvider, Keychain
from noetl_dagster.tools.quantum.circuits import prepare, qiskit_call
from noetl_dagster.tools.quantum.cloud import (
    BraketProvider,
    braket_action,
    ibm_service_kwargs,
    sampler_pub,
)
from noetl_dagster.tools.quantum.contract import CircuitSource
from noetl_dagster.tools.quantum.jobs import JobStore
from noetl_dagster.tools.quantum.tool import quantum_tool
from noetl_dagster.tools.registry import ToolError


def _keychain(tmp_path, records):
    (tmp_path / "cred.json").write_text(json.dumps({"credentials": records}))
    return Keychain([], providers=[FileProvider(tmp_path / "cred.json")])


def test_ibm_fake_backend_local_mode_with_keychain_credential(ctx, tmp_path):
    ctx.keychain = _keychain(
        tmp_path, {"ibm": {"type": "ibm", "data": {"token": "ibm-SECRET-9", "instance": "crn:x"}}}
    )
    args = {"provider": "ibm_runtime", "backend": "fake_manila", "circuit": BELL, "shots": 400, "seed": 11,
            "credential": "ibm"}  # fmt: skip
    r = quantum_tool(args, ctx)
    assert r["status"] == "done" and sum(r["counts"].values()) == 400
    c = r["counts"]
    assert c.get("00", 0) + c.get("11", 0) > 340  # a noisy Bell pair on the fake device
    md = r["metadata"]
    assert md["backend"]["name"] == "fake_manila" and md["backend"]["local_mode"] is True
    assert md["backend"]["version"] and md["backend"]["qiskit_ibm_runtime"]
    assert md["calibration"]["snapshot_id"].startswith("fake_manila@") and md["calibration"]["timestamp"]
    # the device's basis and coupling map came from its Target and were recorded
    assert (
        set(md["transpiler"]["basis_gates"]) >= {"cx", "rz", "sx", "x"} and md["transpiler"]["coupling_map"]
    )
    assert md["transpiler"]["max_qubits"] == 5
    assert "ibm-SECRET-9" in ctx.redacted and "ibm-SECRET-9" not in repr(r)
    # seeded: the same request reproduces its counts on the fake device
    assert quantum_tool(args, ctx)["counts"] == c


def test_ibm_counts_keep_qiskit_bit_order_over_registers(ctx):
    r = quantum_tool(
        {"provider": "ibm_runtime", "backend": "fake_manila", "circuit": ORDER, "shots": 300, "seed": 2}, ctx
    )
    assert all(len(k) == 5 and k[2] == " " for k in r["counts"])
    top = max(r["counts"], key=r["counts"].get)
    assert top.endswith(" 01")  # register a: q0 = 1, q1 = 0, written highest bit first


def test_ibm_request_shape_offline():
    p = qiskit_call(prepare, CircuitSource(BELL, "inline", 2), {}, {}, {}, 5)
    pub = qiskit_call(sampler_pub, p.circuit, 123)
    assert pub.shots == 123 and pub.circuit.num_clbits == 2 and pub.parameter_values.shape == ()
    assert ibm_service_kwargs({"data": {"token": "t", "instance": "i"}}) == {
        "channel": "ibm_quantum_platform", "token": "t", "instance": "i"}  # fmt: skip
    with pytest.raises(ToolError, match="no token"):
        ibm_service_kwargs({"data": {"instance": "i"}})


def test_ibm_unknown_fake_backend_is_a_config_error(ctx):
    with pytest.raises(ToolError) as e:
        quantum_tool({"provider": "ibm_runtime", "backend": "fake_nowhere", "circuit": BELL, "shots": 1}, ctx)
    assert e.value.kind == "config_error" and "fake_nowhere" in e.value.message


BRAKET_CRED = {
    "data": {"aws_access_key_id": "AKIAEXAMPLE", "aws_secret_access_key": "aws-SECRET", "region": "us-west-2"}
}
ARN = "arn:aws:braket:us-west-2:123456789012:quantum-task/abc-123"


def _braket_submit(tmp_path, circuit=ORDER):
    from botocore.stub import ANY, Stubber

    prov = BraketProvider(
        JobStore(tmp_path / "q"), {"s3_bucket": "amazon-braket-results", "s3_prefix": "runs"}, BRAKET_CRED
    )
    p = qiskit_call(prepare, CircuitSource(circuit, "inline", 2), {}, {}, {}, 5)
    record = {
        "job_id": "braket-1",
        "backend": "sv1",
        "shots": 100,
        "tags": {"experiment": "e1"},
        "seeds": {"simulator": 5},
    }
    stub = Stubber(prov.client("braket"))
    expected = {"clientToken": "braket-1", "deviceArn": "arn:aws:braket:::device/quantum-simulator/amazon/sv1",
                "shots": 100, "outputS3Bucket": "amazon-braket-results", "outputS3KeyPrefix": "runs",
                "action": ANY, "tags": {"experiment": "e1"}}  # fmt: skip
    stub.add_response("create_quantum_task", {"quantumTaskArn": ARN}, expected)
    with stub:  # the Stubber validates the parameters against botocore's Braket service model
        rec = qiskit_call(prov.submit, record, p)
    stub.assert_no_pending_responses()
    return prov, rec, p


def test_braket_create_task_request_is_valid_for_the_service_model(tmp_path):
    prov, rec, p = _braket_submit(tmp_path)
    assert rec["remote_id"] == ARN and rec["status"] == "queued"
    req = qiskit_call(prov.create_task_request, {**rec, "job_id": "x"}, p)
    action = json.loads(req["action"])
    assert action["braketSchemaHeader"] == {"name": "braket.ir.openqasm.program", "version": "1"}
    assert action["source"].startswith("OPENQASM 3.0;") and "measure" in action["source"]
    assert json.loads(braket_action("OPENQASM 3.0;"))["inputs"] == {}
    assert prov.client("braket").meta.region_name == "us-west-2"


def test_braket_poll_and_fetch_map_measured_qubits_to_qiskit_counts(tmp_path):
    from botocore.stub import Stubber

    prov, rec, _ = _braket_submit(tmp_path)
    braket, s3 = Stubber(prov.client("braket")), Stubber(prov.client("s3"))
    task = {"quantumTaskArn": ARN, "deviceArn": "arn:aws:braket:::device/quantum-simulator/amazon/sv1",
            "deviceParameters": "{}", "shots": 100, "outputS3Bucket": "amazon-braket-results",
            "outputS3Directory": "runs/abc-123", "createdAt": "2026-01-01T00:00:00Z"}  # fmt: skip
    braket.add_response("get_quantum_task", {**task, "status": "QUEUED", "queueInfo": {"queue": "QUANTUM_TASKS_QUEUE",
                        "position": "4"}}, {"quantumTaskArn": ARN})  # fmt: skip
    braket.add_response("get_quantum_task", {**task, "status": "COMPLETED"}, {"quantumTaskArn": ARN})
    # measuredQubits in Braket's order (qubit 0 first): q0=1, q1=0, q2=q3 a coin
    shots = [[1, 0, 0, 0]] * 60 + [[1, 0, 1, 1]] * 40
    body = json.dumps(
        {"measurements": shots, "measuredQubits": [0, 1, 2, 3], "taskMetadata": {"id": ARN}}
    ).encode()
    s3.add_response(
        "get_object",
        {"Body": io.BytesIO(body)},
        {"Bucket": "amazon-braket-results", "Key": "runs/abc-123/results.json"},
    )
    with braket, s3:
        queued = prov.status(rec)
        assert queued["status"] == "queued" and queued["queue_position"] == 4
        done = prov.result(queued)
    assert done["status"] == "done"
    # same keys as Aer gives for ORDER (register b first, highest bit first), assuming the identity layout
    assert done["result"]["counts"] == {"00 01": 60, "11 01": 40}


def test_braket_credentials_must_come_from_the_keychain(tmp_path):
    prov = BraketProvider(JobStore(tmp_path / "q"), {"s3_bucket": "b"}, None)
    with pytest.raises(ToolError) as e:
        prov.client("braket")
    assert e.value.kind == "auth"
    with pytest.raises(ToolError) as e:
        BraketProvider.device_arn("nowhere")
    assert e.value.kind == "config_error"


def test_shipped_qasm_is_package_data_loadable_by_reference(ctx):
    import tomllib
    from pathlib import Path

    r = quantum_tool(
        {
            "circuit": {"file": "package://noetl_dagster.tools.quantum/qasm/bell.qasm"},
            "shots": 200,
            "seed": 1,
        },
        ctx,
    )
    assert set(r["counts"]) == {"00", "11"} and r["metadata"]["circuit"]["origin"].endswith("qasm/bell.qasm")
    g = quantum_tool(
        {"circuit_file": "package://noetl_dagster.tools.quantum/qasm/ghz3.qasm", "shots": 100, "seed": 1}, ctx
    )
    assert set(g["counts"]) == {"000", "111"}
    for bad in ("package://no_such_pkg_xyz/a.qasm", "package://noetl_dagster.tools.quantum/../x.qasm",
                "package://noetl_dagster.tools.quantum/qasm/none.qasm"):  # fmt: skip
        with pytest.raises(ToolError) as e:
            quantum_tool({"circuit": {"file": bad}, "shots": 1}, ctx)
        assert e.value.kind == "config_error", bad
    # shipped in the wheel: the package-data entry covers every file in qasm/
    py = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    assert "qasm/*.qasm" in py["tool"]["setuptools"]["package-data"]["noetl_dagster.tools.quantum"]
