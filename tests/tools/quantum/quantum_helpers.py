"""Circuits and paths the quantum tests share (imported by name: ``from quantum_helpers import BELL``)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "example_project" / "playbooks"
# the example playbooks run as the example project's tenant/project (quantum_sweep stores its table there)
DEMO = {"tenant": "demo", "project": "examples"}

BELL = """OPENQASM 2.0;
include "qelib1.inc";
qreg q[2];
creg c[2];
h q[0];
cx q[0],q[1];
measure q -> c;
"""

# asymmetric on purpose: q0 always 1, q1 always 0, q2 a fair coin entangled with q3; two registers
ORDER = """OPENQASM 2.0;
include "qelib1.inc";
qreg q[4];
creg a[2];
creg b[2];
x q[0];
h q[2];
cx q[2],q[3];
measure q[0] -> a[0];
measure q[1] -> a[1];
measure q[2] -> b[0];
measure q[3] -> b[1];
"""

PARAM3 = """OPENQASM 3.0;
include "stdgates.inc";
input float[64] theta;
input float[64] phi;
qubit[3] q;
bit[3] c;
ry(theta) q[0];
rx(phi) q[1];
cx q[0], q[2];
cz q[1], q[2];
h q[1];
c = measure q;
"""
