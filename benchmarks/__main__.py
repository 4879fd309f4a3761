"""Run the benchmarks: ``python -m benchmarks [--quick] [--only NAME] [--list]``.

``--quick`` runs each benchmark at a reduced size (``QUICK_ARGS``; a few minutes in all
instead of tens): the ratios keep their meaning, the absolute figures get noisier.

Every ``benchmarks/bench_*.py`` module is found by name and its ``main()`` called
in turn, with ``sys.argv`` reset so a module's own argument parser sees no
foreign flags. A benchmark that raises is reported and the others still run;
the exit code is 0 unless a benchmark crashed (a MISS is a figure, not a crash).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import time
import traceback
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent

# reduced sizes for --quick (the modules' own flags); modules not listed run as they are
QUICK_ARGS: dict[str, list[str]] = {
    "bench_engine": ["--steps", "300", "--iterations", "2000", "--big-loop", "20000"],
    "bench_io": ["--rows", "200000", "--repeat", "3", "--large-mb", "50"],
    "bench_tools": ["--n", "200"],
    "bench_platform_line": ["--rounds", "4"],
    "bench_dagster": ["--steps", "20", "--repeat", "3", "--iterations", "10", "--playbooks", "50"],
    "bench_facts": ["--events", "100000", "--rounds", "1", "--batch", "50000", "--exporter-events", "20000"],
    "bench_qdrant": ["--n", "10000", "--queries", "20"],
    "bench_registry": ["--n", "1000"],
    "bench_flow": ["--statements", "30"],
    "bench_loops": ["--cpu", "2000", "--io", "100", "--repeat", "2"],
    "bench_dagster_latency": ["--requests", "2"],
    "bench_assets": ["--rounds", "1"],
    "bench_noetl_local": ["--steps", "200"],
    "bench_noetl_cycle": ["--count", "100", "--repeat", "1"],
    "bench_python_task": ["--steps", "500", "--repeat", "3", "--cycle", "1,500"],
    "bench_explain": ["--items", "20000"],
    "bench_sandbox": ["--tasks", "5", "--repeat", "2"],
    "bench_payload_stores": ["--mb", "16", "--object-mb", "8", "--repeat", "1"],
    "bench_nats_workers": ["--executions", "16"],
    "bench_nats_tiers": ["--executions", "16"],
    "bench_live_dash": ["--events", "20000", "--rounds", "1"],
}
QUICK_ENV = {"NOETL_BENCH_EXECUTIONS": "30"}  # bench_throughput: executions per worker
# minutes of real `pip install`s into fresh venvs: only with --only (docs/install.md's table)
ON_REQUEST = {"bench_install"}


def discover() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules([str(PACKAGE_DIR)]) if m.name.startswith("bench_"))


def _matches(module: str, wanted: list[str]) -> bool:
    return not wanted or any(module == w or module == f"bench_{w}" for w in wanted)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="run only this benchmark (bench_engine or engine); repeatable")  # fmt: skip
    ap.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    ap.add_argument("--quick", action="store_true", help="reduced sizes: every benchmark in a few minutes")
    args = ap.parse_args(argv)
    if args.quick:
        for k, v in QUICK_ENV.items():
            os.environ.setdefault(k, v)
    names = discover()
    if args.list:
        print("\n".join(names))
        return 0
    unknown = [w for w in args.only if not any(_matches(n, [w]) for n in names)]
    if unknown:
        print(f"error: no benchmark named {', '.join(unknown)} (have: {', '.join(names)})", file=sys.stderr)
        return 2
    crashed: list[str] = []
    for name in names:
        if not _matches(name, args.only) or (name in ON_REQUEST and not args.only):
            continue
        print(f"\n######## {name} ########", flush=True)
        t0 = time.perf_counter()
        saved_argv = sys.argv
        sys.argv = [f"benchmarks/{name}.py", *(QUICK_ARGS.get(name, []) if args.quick else [])]
        try:
            module = importlib.import_module(f"benchmarks.{name}")
            module.main()
        except SystemExit as e:  # a module's main() may sys.exit(); only a non-zero code is a crash
            if e.code not in (0, None):
                crashed.append(name)
                print(f"!! {name} exited with {e.code}", flush=True)
        except Exception:  # noqa: BLE001 - one broken benchmark must not hide the others' figures
            crashed.append(name)
            print(f"!! {name} crashed:\n{traceback.format_exc()}", flush=True)
        finally:
            sys.argv = saved_argv
        print(f"######## {name}: {time.perf_counter() - t0:.1f} s ########", flush=True)
    if crashed:
        print(f"\ncrashed: {', '.join(crashed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
