// Two independent RY rotations, both qubits measured: <Z0 Z1> = cos(theta) * cos(phi).
OPENQASM 3.0;
include "stdgates.inc";
input float[64] theta;
input float[64] phi;
qubit[2] q;
bit[2] c;
ry(theta) q[0];
ry(phi) q[1];
c = measure q;
