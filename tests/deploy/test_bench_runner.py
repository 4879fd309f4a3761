"""The one-command benchmark runner (issue 19 §4): ``python -m benchmarks [--quick]``."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.__main__ import QUICK_ARGS, discover, main

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_quick_args_name_real_modules_and_flags_they_parse():
    names = discover()
    assert "bench_throughput" in names and "bench_dagster_latency" in names
    for module, args in QUICK_ARGS.items():
        assert module in names, module
        src = (BENCH / f"{module}.py").read_text()
        flags = [a for a in args if a.startswith("--")]
        assert flags and all(re.search(rf"add_argument\(\s*\"{re.escape(f)}\"", src) for f in flags), (
            module,
            flags,
        )


def test_unknown_benchmark_is_a_one_line_error(capsys):
    assert main(["--quick", "--only", "no_such_bench"]) == 2
    assert capsys.readouterr().err.startswith("error: no benchmark named no_such_bench")
