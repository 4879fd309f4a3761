"""Circuits: OpenQASM 2/3 → Qiskit, parameter binding, transpilation, and the portable form jobs keep on disk."""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from noetl_dagster.tools.quantum.contract import CircuitSource, config_error

T = TypeVar("T")

# What a transpiled circuit may contain when no basis is asked for: the standard gates every built-in
# provider executes. (Transpiling against AerSimulator's full target costs ~100 ms per circuit; this ~4 ms.)
DEFAULT_BASIS = [
    "u",
    "p",
    "rx",
    "ry",
    "rz",
    "h",
    "x",
    "y",
    "z",
    "s",
    "sdg",
    "t",
    "tdg",
    "sx",
    "cx",
    "cz",
    "swap",
    "ccx",
    "id",
]


# Parsing (the OpenQASM 3 importer), building and transpiling circuits is not safe from several threads at
# once (parallel loop iterations crashed the interpreter in QuantumCircuit.__init__): it is serialised here.
# Simulation runs outside this lock. Parsed sources are cached, so a sweep parses its circuit once.
QISKIT_LOCK = threading.RLock()
# Qiskit objects used from a thread other than the one that made them, after that thread has exited (a
# parallel loop's worker), crashed the interpreter (segfault in QuantumCircuit code) on the next
# execution in the same process. So every Qiskit/Aer call runs on one long-lived thread of our own.
_QISKIT_THREAD = "noetl-qiskit"
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def qiskit_call(fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    """``fn(*args, **kw)`` on the Qiskit thread (directly when already on it)."""
    global _executor
    if threading.current_thread().name.startswith(_QISKIT_THREAD):
        return fn(*args, **kw)
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=_QISKIT_THREAD)
    return _executor.submit(fn, *args, **kw).result()


_parsed: OrderedDict[tuple[int, str], Any] = OrderedDict()
_PARSED_MAX = 64


@dataclass
class Prepared:
    """A bound, transpiled circuit and the provenance of how it was made."""

    circuit: Any  # qiskit.QuantumCircuit (transpiled, no free parameters)
    qasm: str  # OpenQASM 2 of the transpiled circuit: what a job stores and replays
    source_sha256: str
    qasm_sha256: str
    transpiler: dict[str, Any]
    info: dict[str, Any]


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def load(source: CircuitSource) -> Any:
    """The parsed circuit (cached per source text; callers must not mutate it)."""
    key = (source.version, source.text)
    with QISKIT_LOCK:
        hit = _parsed.get(key)
        if hit is not None:
            _parsed.move_to_end(key)
            return hit
        qc = _load(source)
        _parsed[key] = qc
        if len(_parsed) > _PARSED_MAX:
            _parsed.popitem(last=False)
        return qc


def _load(source: CircuitSource) -> Any:
    from qiskit import qasm2, qasm3

    try:
        if source.version == 2:
            return qasm2.loads(source.text, custom_instructions=qasm2.LEGACY_CUSTOM_INSTRUCTIONS)
        return qasm3.loads(source.text)
    except Exception as exc:  # noqa: BLE001 - every parser failure is the playbook's mistake
        where = "" if source.origin == "inline" else f" ({source.origin})"
        raise config_error(f"cannot parse OpenQASM {source.version}{where}: {exc}", "qasm_parse") from None


def bind(circuit: Any, params: dict[str, float]) -> Any:
    free = {p.name: p for p in circuit.parameters}
    missing = sorted(set(free) - set(params))
    extra = sorted(set(params) - set(free))
    if missing:
        raise config_error(f"circuit parameters without a value in params: {missing}", "missing_params")
    if extra:
        raise config_error(
            f"params {extra} are not parameters of the circuit (it has {sorted(free)})", "unknown_params"
        )
    return circuit.assign_parameters({free[n]: float(v) for n, v in params.items()}) if free else circuit


def prepare(source: CircuitSource, params: dict[str, float], transpile_settings: dict[str, Any],
            defaults: dict[str, Any], seed: int) -> Prepared:  # fmt: skip
    with QISKIT_LOCK:
        return _prepare(source, params, transpile_settings, defaults, seed)


def _prepare(source: CircuitSource, params: dict[str, float], transpile_settings: dict[str, Any],
             defaults: dict[str, Any], seed: int) -> Prepared:  # fmt: skip
    from qiskit import qasm2, transpile

    qc = bind(load(source), params)
    if qc.num_clbits == 0 or not any(ci.operation.name == "measure" for ci in qc.data):
        raise config_error(
            "the circuit measures nothing: add measure instructions to get counts", "no_measurements"
        )
    settings = {**defaults, **transpile_settings}
    settings.setdefault("optimization_level", 1)
    settings.setdefault("basis_gates", list(DEFAULT_BASIS))
    settings.setdefault("seed_transpiler", seed)
    max_qubits = settings.pop("max_qubits", None)
    if max_qubits is not None and qc.num_qubits > max_qubits:
        raise config_error(
            f"the circuit needs {qc.num_qubits} qubits, the backend has {max_qubits}", "too_many_qubits"
        )
    try:
        tqc = transpile(qc, **settings)
    except Exception as exc:  # noqa: BLE001
        raise config_error(f"transpilation failed: {exc}", "transpile_error") from None
    try:
        text = qasm2.dumps(tqc)
    except Exception as exc:  # noqa: BLE001
        raise config_error(f"the transpiled circuit has no OpenQASM 2 form ({exc}); use a basis of standard gates",
                           "unsupported_instruction") from None  # fmt: skip
    used = dict(settings)
    if max_qubits is not None:
        used["max_qubits"] = max_qubits
    info = {
        "num_qubits": qc.num_qubits,
        "num_clbits": qc.num_clbits,
        "depth": qc.depth(),
        "transpiled_depth": tqc.depth(),
        "transpiled_ops": {k: int(v) for k, v in tqc.count_ops().items()},
        "params": dict(params),
        "qasm_version": source.version,
        "origin": source.origin,
    }
    return Prepared(tqc, text, sha256(source.text), sha256(text), used, info)


def from_qasm2(text: str) -> Any:
    from qiskit import qasm2

    with QISKIT_LOCK:
        return qasm2.loads(text, custom_instructions=qasm2.LEGACY_CUSTOM_INSTRUCTIONS)


def key_layout(circuit: Any) -> list[list[int]]:
    """Clbit indices in Qiskit's count-key order: registers last-declared first, each from its highest bit
    (the groups are separated by spaces in a key)."""
    groups = [
        [circuit.find_bit(reg[i]).index for i in reversed(range(len(reg)))] for reg in reversed(circuit.cregs)
    ]
    return groups or [list(reversed(range(circuit.num_clbits)))]


def counts_from_bits(bits: Any, layout: list[list[int]]) -> dict[str, int]:
    """``bits[shot, clbit]`` (0/1) → Qiskit-ordered counts."""
    import numpy as np

    flat = [i for g in layout for i in g]
    rows = np.asarray(bits, dtype=np.uint8)[:, flat] if flat else np.zeros((len(bits), 0), dtype=np.uint8)
    uniq, freq = np.unique(rows, axis=0, return_counts=True)
    out: dict[str, int] = {}
    for row, n in zip(uniq.tolist(), freq.tolist(), strict=True):
        parts, pos = [], 0
        for g in layout:
            parts.append("".join(str(b) for b in row[pos : pos + len(g)]))
            pos += len(g)
        out[" ".join(parts)] = int(n)
    return dict(sorted(out.items()))


def to_cirq(circuit: Any) -> tuple[Any, list[tuple[str, int]]]:
    """The Qiskit circuit as a cirq.Circuit on LineQubits; measurement keys → clbit indices (in order)."""
    import cirq

    qubits = cirq.LineQubit.range(circuit.num_qubits)
    ops: list[Any] = []
    keys: list[tuple[str, int]] = []
    one = {"h": cirq.H, "x": cirq.X, "y": cirq.Y, "z": cirq.Z, "s": cirq.S, "sdg": cirq.S**-1, "t": cirq.T,
           "tdg": cirq.T**-1, "sx": cirq.X**0.5, "sxdg": cirq.X**-0.5, "id": cirq.I}  # fmt: skip
    two = {"cx": cirq.CNOT, "cz": cirq.CZ, "swap": cirq.SWAP, "ccx": cirq.CCX}
    for ci in circuit.data:
        op = ci.operation
        name = op.name
        if getattr(op, "condition", None) is not None:
            raise config_error(
                "cirq: classically conditioned gates are not supported", "unsupported_instruction"
            )
        qs = [qubits[circuit.find_bit(q).index] for q in ci.qubits]
        p = [float(x) for x in op.params]
        if name in one:
            ops.append(one[name].on(*qs))
        elif name in two:
            ops.append(two[name].on(*qs))
        elif name == "rx":
            ops.append(cirq.rx(p[0]).on(*qs))
        elif name == "ry":
            ops.append(cirq.ry(p[0]).on(*qs))
        elif name in ("rz", "p", "u1"):
            ops.append((cirq.rz(p[0]) if name == "rz" else cirq.ZPowGate(exponent=p[0] / math.pi)).on(*qs))
        elif name in ("u", "u3"):
            theta, phi, lam = p
            # U(θ,φ,λ) = Rz(φ)·Ry(θ)·Rz(λ) up to a global phase
            ops += [cirq.rz(lam).on(*qs), cirq.ry(theta).on(*qs), cirq.rz(phi).on(*qs)]
        elif name == "measure":
            cl = circuit.find_bit(ci.clbits[0]).index
            key = f"m{len(keys)}"
            keys.append((key, cl))
            ops.append(cirq.measure(*qs, key=key))
        elif name == "barrier":
            continue
        elif name == "reset":
            ops.append(cirq.ResetChannel().on(*qs))
        else:
            raise config_error(f"cirq: instruction {name!r} is not supported", "unsupported_instruction")
    return cirq.Circuit(ops), keys
