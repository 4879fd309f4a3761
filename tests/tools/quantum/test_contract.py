"""The strict contract: every malformed input is a config_error ToolError (never a crash), through the tool and the engine."""

from __future__ import annotations

import pytest
from quantum_helpers import BELL, PARAM3

from noetl_dagster.dsl.kinds import get_tool, known_kinds
from noetl_dagster.runners.local import run_playbook
from noetl_dagster.tools.quantum import quantum_tool
from noetl_dagster.tools.registry import ToolError


def _err(ctx, **inputs) -> ToolError:
    with pytest.raises(ToolError) as ei:
        quantum_tool(inputs, ctx)
    return ei.value


@pytest.mark.parametrize(
    ("inputs", "needle"),
    [
        ({"circuit": BELL, "shots": 0}, "shots must be between 1"),
        ({"circuit": BELL, "shots": "many"}, "shots must be an integer"),
        ({"circuit": BELL, "shots": True}, "shots must be an integer"),
        ({"circuit": BELL, "seed": -1}, "seed must be between"),
        ({"circuit": BELL, "operation": "launch"}, "operation must be one of"),
        ({"circuit": BELL, "provider": "ibm_nowhere"}, "unknown provider 'ibm_nowhere'"),
        ({"circuit": BELL, "colour": "blue"}, "unknown inputs ['colour']"),
        ({"operation": "status"}, "needs job_id"),
        ({"operation": "status", "job_id": "x", "circuit": BELL}, "takes no circuit"),
        ({"circuit": BELL, "job_id": "x"}, "job_id is only for"),
        ({}, "circuit is required"),
        ({"circuit": "h q[0];"}, "must start with 'OPENQASM 2.0;'"),
        ({"circuit": "OPENQASM 4.0;"}, "unsupported OpenQASM version"),
        (
            {"circuit": 'OPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[1];\nfoo q[0];'},
            "cannot parse OpenQASM 2",
        ),
        ({"circuit": PARAM3, "params": {"theta": 0.1}}, "without a value in params: ['phi']"),
        ({"circuit": PARAM3, "params": {"theta": 0.1, "phi": 0.2, "psi": 1}}, "['psi'] are not parameters"),
        ({"circuit": PARAM3, "params": {"theta": "wide", "phi": 0}}, "params.theta must be a number"),
        (
            {"circuit": 'OPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[1];\ncreg c[1];\nh q[0];'},
            "measures nothing",
        ),
        ({"circuit": BELL, "optimization_level": 7}, "optimization_level must be between 0 and 3"),
        ({"circuit": BELL, "transpile": {"basis_gates": "cx"}}, "basis_gates must be a non-empty list"),
        ({"circuit": BELL, "transpile": {"coupling_map": [[0]]}}, "coupling_map must be a list"),
        ({"circuit": BELL, "transpile": {"unrolling": True}}, "unknown transpiler settings"),
        ({"circuit": BELL, "tags": [{"a": 1}]}, "tags must be"),
        ({"circuit": {"file": "nope/missing.qasm"}}, "not found"),
        ({"circuit": {"qasm": BELL, "file": "x.qasm"}}, "exactly one of qasm or file"),
        (
            {"circuit": BELL, "provider": "emulated_qpu", "provider_options": {"queue_dept": 1}},
            "unknown provider_options",
        ),
        (
            {"circuit": BELL, "provider": "emulated_qpu", "provider_options": {"num_qubits": 1}},
            "needs 2 qubits, the backend has 1",
        ),
        ({"circuit": BELL, "backend": "aer_quantum_computer"}, "unknown backend"),
        ({"circuit": BELL, "provider_options": {"noise": True}}, "aer: unknown provider_options ['noise']"),
        (
            {"circuit": BELL, "provider": "cirq", "provider_options": {"x": 1}},
            "cirq: unknown provider_options ['x']",
        ),
        ({"circuit": BELL, "provider": "cirq", "backend": "sycamore"}, "unknown backend"),
    ],
)
def test_bad_inputs_are_config_errors(ctx, inputs, needle):
    err = _err(ctx, **inputs)
    assert err.kind == "config_error", (err.kind, err.message)
    assert needle in err.message
    assert not err.retryable


def test_unknown_job_and_malformed_job_id(ctx):
    assert _err(ctx, operation="result", job_id="aer-doesnotexist").kind == "not_found"
    assert _err(ctx, operation="status", job_id="../../etc/passwd").kind == "config_error"


def test_the_kind_is_catalogued_and_loads_on_first_use():
    assert "quantum" in known_kinds()
    assert get_tool("quantum").fn is quantum_tool


def test_a_bad_task_fails_the_step_with_a_config_error_not_a_crash(home, tmp_path):
    pb = tmp_path / "bad_q.yaml"
    pb.write_text(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: bad_q, path: t/bad_q}\n"
        "workflow:\n  - step: start\n    tool:\n      - q: {kind: quantum, circuit: 'OPENQASM 2.0;', shots: -5}\n"
    )
    r = run_playbook(pb, data_dir=home)
    assert r.status == "failed"
    assert r.results["start"]["error"]["kind"] == "config_error"
    assert "shots" in r.results["start"]["error"]["message"]
