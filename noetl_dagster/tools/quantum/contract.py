"""The strict input contract of ``kind: quantum``: every input checked, every mistake a ``config_error``.

Nothing here imports Qiskit: a malformed task is refused before any quantum library loads.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from noetl_dagster.tools.registry import ToolContext, ToolError

OPERATIONS = ("run", "submit", "status", "result", "cancel", "queue")
DEFAULT_PROVIDER = "aer"
DEFAULT_SHOTS = 1024
MAX_SHOTS = 1_000_000
MAX_CIRCUIT_BYTES = 1 << 20
TRANSPILE_KEYS = ("optimization_level", "basis_gates", "coupling_map", "seed_transpiler", "initial_layout",
                  "layout_method", "routing_method", "approximation_degree")  # fmt: skip
KNOWN_KEYS = frozenset(
    {"operation", "provider", "backend", "circuit", "circuit_file", "params", "shots", "seed", "transpile",
     "transpiler", "tags", "job_id", "options", "provider_options", "credential", "auth", "timeout",
     "poll_interval", "input"} | set(TRANSPILE_KEYS)
)  # fmt: skip


def config_error(message: str, code: str = "invalid_input") -> ToolError:
    return ToolError(f"quantum: {message}", kind="config_error", code=code)


@dataclass
class CircuitSource:
    text: str
    origin: str  # "inline" or the file path
    version: int  # 2 or 3


@dataclass
class QuantumRequest:
    operation: str
    provider: str
    backend: str | None
    circuit: CircuitSource | None
    params: dict[str, float]
    shots: int
    seed: int
    seed_given: bool
    transpile: dict[str, Any]
    tags: Any
    job_id: str | None
    options: dict[str, Any]
    credential: Any
    timeout: float
    poll_interval: float
    extra: dict[str, Any] = field(default_factory=dict)


def _int(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool):
        raise config_error(f"{name} must be an integer, got {value!r}")
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise config_error(f"{name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise config_error(f"{name} must be between {lo} and {hi}, got {value}")
    return value


def _number(name: str, value: Any, lo: float = 0.0) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise config_error(f"{name} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(out) or out < lo:
        raise config_error(f"{name} must be a finite number >= {lo}, got {value!r}")
    return out


def qasm_version(text: str) -> int | None:
    head = text.lstrip()
    # skip leading // comments
    while head.startswith("//"):
        head = head.split("\n", 1)[1].lstrip() if "\n" in head else ""
    if head.startswith("OPENQASM"):
        ver = head[len("OPENQASM") :].strip().split(";", 1)[0].strip()
        if ver.startswith("2"):
            return 2
        if ver.startswith("3"):
            return 3
        raise config_error(f"unsupported OpenQASM version {ver!r} (2.x or 3.x)", "qasm_version")
    return None


PACKAGE_PREFIX = "package://"


def _package_file(ref: str) -> Path:
    """``package://<module>/<path>``: a circuit shipped as package data (e.g.
    ``package://noetl_dagster.tools.quantum/qasm/bell.qasm``), found wherever the package is installed."""
    import importlib.resources

    module, _, rel = ref[len(PACKAGE_PREFIX) :].partition("/")
    if not module or not rel or ".." in Path(rel).parts:
        raise config_error(f"circuit file {ref!r}: expected package://<module>/<path inside it>")
    try:
        root = importlib.resources.files(module)
    except (ModuleNotFoundError, TypeError):
        raise config_error(f"circuit file {ref!r}: no package {module!r}", "not_found") from None
    return Path(str(root.joinpath(rel)))


def _read_file(ref: Any, ctx: ToolContext) -> CircuitSource:
    if not isinstance(ref, str) or not ref.strip():
        raise config_error(f"circuit file must be a path, got {ref!r}")
    path = Path(ref.strip())
    if ref.strip().startswith(PACKAGE_PREFIX):
        path = _package_file(ref.strip())
    elif not path.is_absolute():
        base = getattr(ctx, "base_dir", None)
        path = (Path(base) if base else Path.cwd()) / path
    if not path.is_file():
        raise config_error(
            f"circuit file {ref!r} not found (relative paths are relative to the playbook)", "not_found"
        )
    if path.stat().st_size > MAX_CIRCUIT_BYTES:
        raise config_error(f"circuit file {ref!r} is larger than {MAX_CIRCUIT_BYTES} bytes")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise config_error(f"circuit file {ref!r} is not UTF-8 text") from None
    ver = qasm_version(text)
    if ver is None:
        raise config_error(f"circuit file {ref!r} does not start with an OPENQASM 2/3 header", "qasm_version")
    return CircuitSource(text, str(path), ver)


def parse_circuit(value: Any, file_ref: Any, ctx: ToolContext) -> tuple[CircuitSource, dict[str, Any]]:
    """``circuit`` as QASM text, ``{file: path}``, ``{qasm: text, params: {...}}`` or ``circuit_file``."""
    params: dict[str, Any] = {}
    if value is None and file_ref is None:
        raise config_error(
            "circuit is required (OpenQASM 2/3 text, {file: path} or circuit_file)", "missing_circuit"
        )
    if value is not None and file_ref is not None:
        raise config_error("give circuit or circuit_file, not both")
    if file_ref is not None:
        return _read_file(file_ref, ctx), params
    if isinstance(value, Mapping):
        unknown = set(value) - {"qasm", "file", "params"}
        if unknown:
            raise config_error(f"unknown circuit keys {sorted(unknown)} (qasm, file, params)")
        if ("qasm" in value) == ("file" in value):
            raise config_error("a circuit mapping needs exactly one of qasm or file")
        if value.get("params") is not None:
            if not isinstance(value["params"], Mapping):
                raise config_error("circuit.params must be a mapping of parameter name to number")
            params = dict(value["params"])
        if "file" in value:
            return _read_file(value["file"], ctx), params
        value = value["qasm"]
    if not isinstance(value, str) or not value.strip():
        raise config_error(f"circuit must be OpenQASM text, got {type(value).__name__}")
    if len(value.encode()) > MAX_CIRCUIT_BYTES:
        raise config_error(f"circuit is larger than {MAX_CIRCUIT_BYTES} bytes")
    ver = qasm_version(value)
    if ver is None:
        stripped = value.strip()
        if "\n" not in stripped and stripped.endswith((".qasm", ".qasm2", ".qasm3")):
            return _read_file(stripped, ctx), params
        raise config_error("circuit text must start with 'OPENQASM 2.0;' or 'OPENQASM 3.0;' "
                           "(or be a .qasm file path)", "qasm_version")  # fmt: skip
    return CircuitSource(value, "inline", ver), params


def _params(value: Any) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise config_error("params must be a mapping of parameter name to number")
    return {str(k): _number(f"params.{k}", v, lo=-math.inf) for k, v in value.items()}


def _transpile(inputs: Mapping[str, Any]) -> dict[str, Any]:
    nested = inputs.get("transpile", inputs.get("transpiler"))
    if nested is not None and not isinstance(nested, Mapping):
        raise config_error("transpile must be a mapping (optimization_level, basis_gates, coupling_map, …)")
    merged = dict(nested or {})
    for k in TRANSPILE_KEYS:
        if inputs.get(k) is not None:
            merged[k] = inputs[k]
    unknown = set(merged) - set(TRANSPILE_KEYS)
    if unknown:
        raise config_error(
            f"unknown transpiler settings {sorted(unknown)} (allowed: {', '.join(TRANSPILE_KEYS)})"
        )
    out: dict[str, Any] = {}
    if merged.get("optimization_level") is not None:
        out["optimization_level"] = _int("optimization_level", merged["optimization_level"], 0, 3)
    if merged.get("basis_gates") is not None:
        bg = merged["basis_gates"]
        if not isinstance(bg, list | tuple) or not bg or not all(isinstance(g, str) and g for g in bg):
            raise config_error("basis_gates must be a non-empty list of gate names")
        out["basis_gates"] = [str(g) for g in bg]
    if merged.get("coupling_map") is not None:
        cm = merged["coupling_map"]
        ok = isinstance(cm, list | tuple) and all(
            isinstance(e, list | tuple)
            and len(e) == 2
            and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in e)
            for e in cm
        )
        if not ok:
            raise config_error("coupling_map must be a list of [control, target] qubit index pairs")
        out["coupling_map"] = [[int(a), int(b)] for a, b in cm]
    if merged.get("seed_transpiler") is not None:
        out["seed_transpiler"] = _int("seed_transpiler", merged["seed_transpiler"], 0, 2**32 - 1)
    if merged.get("initial_layout") is not None:
        lay = merged["initial_layout"]
        if not isinstance(lay, list | tuple) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in lay
        ):
            raise config_error("initial_layout must be a list of physical qubit indices")
        out["initial_layout"] = list(lay)
    for k in ("layout_method", "routing_method"):
        if merged.get(k) is not None:
            if not isinstance(merged[k], str):
                raise config_error(f"{k} must be a string")
            out[k] = merged[k]
    if merged.get("approximation_degree") is not None:
        d = _number("approximation_degree", merged["approximation_degree"])
        if d > 1:
            raise config_error("approximation_degree must be between 0 and 1")
        out["approximation_degree"] = d
    return out


def _tags(value: Any) -> Any:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple) and all(
        isinstance(t, str | int | float) and not isinstance(t, bool) for t in value
    ):
        return [str(t) for t in value]
    if isinstance(value, Mapping) and all(
        isinstance(v, str | int | float | bool) or v is None for v in value.values()
    ):
        return {str(k): v for k, v in value.items()}
    raise config_error("tags must be a list of strings or a mapping of name to scalar")


def parse_request(inputs: Mapping[str, Any], ctx: ToolContext) -> QuantumRequest:
    if isinstance(inputs.get("input"), Mapping):  # runtime dialect: inputs nested under input
        inputs = {**inputs["input"], **{k: v for k, v in inputs.items() if k != "input"}}
    unknown = set(inputs) - KNOWN_KEYS
    if unknown:
        raise config_error(f"unknown inputs {sorted(unknown)}", "unknown_input")
    op = str(inputs.get("operation") or "run").strip().lower()
    if op not in OPERATIONS:
        raise config_error(
            f"operation must be one of {', '.join(OPERATIONS)}, got {inputs.get('operation')!r}"
        )
    provider = inputs.get("provider") or DEFAULT_PROVIDER
    if not isinstance(provider, str):
        raise config_error(f"provider must be a name, got {provider!r}")
    backend = inputs.get("backend")
    if backend is not None and (not isinstance(backend, str) or not backend.strip()):
        raise config_error(f"backend must be a name, got {backend!r}")
    options = inputs.get("provider_options", inputs.get("options")) or {}
    if not isinstance(options, Mapping):
        raise config_error("provider_options must be a mapping")
    job_id = inputs.get("job_id")
    if op in ("status", "result", "cancel"):
        if not isinstance(job_id, str) or not job_id.strip():
            raise config_error(f"operation {op} needs job_id (the id submit returned)", "missing_job_id")
        job_id = job_id.strip()
    elif job_id is not None:
        raise config_error(f"job_id is only for status, result and cancel, not {op}")
    circuit = None
    params: dict[str, float] = {}
    if op in ("run", "submit"):
        circuit, circuit_params = parse_circuit(inputs.get("circuit"), inputs.get("circuit_file"), ctx)
        params = _params(circuit_params) | _params(inputs.get("params"))
    elif inputs.get("circuit") is not None or inputs.get("circuit_file") is not None:
        raise config_error(f"operation {op} takes no circuit")
    shots = _int("shots", inputs["shots"], 1, MAX_SHOTS) if inputs.get("shots") is not None else DEFAULT_SHOTS
    seed_given = inputs.get("seed") is not None
    seed = _int("seed", inputs["seed"], 0, 2**31 - 1) if seed_given else secrets.randbelow(2**31)
    timeout = _number("timeout", inputs["timeout"]) if inputs.get("timeout") is not None else 300.0
    poll = (
        _number("poll_interval", inputs["poll_interval"]) if inputs.get("poll_interval") is not None else 0.05
    )
    return QuantumRequest(
        operation=op,
        provider=provider.strip(),
        backend=backend.strip() if isinstance(backend, str) else None,
        circuit=circuit,
        params=params,
        shots=shots,
        seed=seed,
        seed_given=seed_given,
        transpile=_transpile(inputs),
        tags=_tags(inputs.get("tags")),
        job_id=job_id,
        options=dict(options),
        credential=inputs.get("credential", inputs.get("auth")),
        timeout=timeout,
        poll_interval=max(0.005, poll),
    )
