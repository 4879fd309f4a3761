"""The install table of issue 44, measured in one sitting: ``pip install`` into fresh venvs of the
built wheel (the core), the core plus ``[analytics]`` (added to the core venv, as a user would),
and Dagster's own packages alone for the floor (``dagster``, ``dagster-dbt``, ``dagster-sling``).

    python -m benchmarks --only install     (not in the default run: real installs take minutes)
    python benchmarks/bench_install.py [--wheel dist/noetl_dagster-X-py3-none-any.whl] [--only core,dagster]

Each row is a real ``python -m venv`` + ``pip install`` (pip's cache and this machine's index, as
configured): packages = distributions in the venv besides pip and setuptools; MB = the venv's
files (``du``); wall and the CPU time of pip. The ratios against ``dagster`` alone are from the
same run. docs/install.md holds the table; tests/packaging/test_wheel.py guards the core's limits.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEED = {"pip", "setuptools"}  # what `python -m venv` puts there itself


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def build_wheel(out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "build", "--wheel", "-o", str(out), str(REPO)], check=True,
                   capture_output=True, text=True)  # fmt: skip
    (whl,) = out.glob("noetl_dagster-*.whl")
    return whl


def footprint(env_dir: Path) -> tuple[int, float]:
    site = env_dir / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    names = {d.metadata["Name"].lower() for d in importlib.metadata.distributions(path=[str(site)])}
    size = 0
    for root, _dirs, files in os.walk(env_dir):
        for f in files:
            p = Path(root, f)
            if not p.is_symlink():
                size += p.stat().st_size
    return len(names - SEED), size / 1e6


def pip_install(env_dir: Path, *specs: str) -> tuple[float, float]:
    """(wall s, CPU s) of ``pip install SPECS`` into env_dir (made fresh if absent)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if not env_dir.exists():
        subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True, env=env)
    cpu0, t0 = _children_cpu(), time.perf_counter()
    r = subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", *specs], env=env,
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"pip install {' '.join(specs)} failed: {r.stderr[-2000:]}")
    return time.perf_counter() - t0, _children_cpu() - cpu0


def _mmss(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", type=Path, help="the built wheel (default: build one from this checkout)")
    ap.add_argument("--only", default="core,analytics,dagster,dagster-dbt,dagster-sling",
                    help="comma-separated rows to measure")  # fmt: skip
    ap.add_argument("--keep", action="store_true", help="keep the venvs (printed) instead of removing them")
    args = ap.parse_args()
    rows = args.only.split(",")
    work = Path(tempfile.mkdtemp(prefix="bench_install_"))
    try:
        wheel = args.wheel or build_wheel(work / "dist")
        results: list[tuple[str, int, float, float, float]] = []
        for row in rows:
            if row == "analytics":
                continue  # measured on top of the core venv, right after it
            env_dir = work / row
            spec = str(wheel) if row == "core" else row
            wall, cpu = pip_install(env_dir, spec)
            packages, mb = footprint(env_dir)
            label = "noetl-dagster core wheel" if row == "core" else f"`{row}` alone"
            results.append((label, packages, mb, wall, cpu))
            print(
                f"{label}: {packages} packages, {mb:,.0f} MB, wall {_mmss(wall)}, pip CPU {cpu:.0f} s",
                flush=True,
            )
            if row == "core" and "analytics" in rows:
                wall, cpu = pip_install(env_dir, f"{wheel}[analytics]")
                packages, mb = footprint(env_dir)
                results.append(("core + `[analytics]`", packages, mb, wall, cpu))
                print(f"core + [analytics]: {packages} packages, {mb:,.0f} MB, wall +{_mmss(wall)}, pip CPU {cpu:.0f} s",
                      flush=True)  # fmt: skip
        floor = next((r for r in results if r[0] == "`dagster` alone"), None)
        print("\n| install | packages | venv MB | wall | pip CPU | MB / dagster alone |")
        print("|---|---|---|---|---|---|")
        for label, packages, mb, wall, cpu in results:
            ratio = f"{mb / floor[2]:.2f}x" if floor else "-"
            plus = "+" if label.startswith("core +") else ""
            print(f"| {label} | {packages} | {mb:,.0f} | {plus}{_mmss(wall)} | {cpu:.0f} s | {ratio} |")
    finally:
        if args.keep:
            print(f"venvs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
