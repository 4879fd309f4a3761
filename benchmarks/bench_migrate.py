"""Migration speed (issue 7).

1. Scanning a corpus of standard files (``migrate --check`` over the e2e
   playbooks): ``migrate_text`` per file next to a bare libyaml load of the same
   texts in the same process (ratio). Standard files never reach the round-trip
   tree, so this stays close to the cost of parsing once.
2. Rewriting legacy files (the three retired-era playbooks): ``migrate_text``
   next to a bare ruamel.yaml round trip (load + dump) of the same texts (ratio):
   what the rewrite rules cost above keeping comments and layout.

Run: ``python -m benchmarks.bench_migrate``.
"""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import yaml
from ruamel.yaml import YAML

from noetl_dagster.dsl.migrate import migrate_text

SHARED = Path(os.environ.get("NOETL_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
E2E = SHARED / "conformance" / "noetl-e2e" / "fixtures" / "playbooks"
LEGACY = SHARED / "conformance" / "legacy"
try:
    from yaml import CSafeLoader as Loader
except ImportError:  # pragma: no cover
    from yaml import SafeLoader as Loader  # type: ignore[assignment]


def _best(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    corpus = [(str(p), p.read_text()) for p in sorted(E2E.rglob("*.yaml"))]
    legacy = [(str(p), p.read_text()) for p in sorted(LEGACY.glob("*.yaml"))] * 10

    def scan() -> None:
        for name, text in corpus:
            migrate_text(text, name)

    def parse_only() -> None:
        for _, text in corpus:
            yaml.load(text, Loader=Loader)

    def rewrite() -> None:
        for name, text in legacy:
            migrate_text(text, name)

    def round_trip() -> None:
        for _, text in legacy:
            y = YAML()
            y.preserve_quotes = True
            out = io.StringIO()
            y.dump(y.load(text), out)

    scan_s, parse_s = _best(scan), _best(parse_only)
    rw_s, rt_s = _best(rewrite), _best(round_trip)
    n, m = len(corpus), len(legacy)
    print(f"migrate scan of {n} standard e2e files: {scan_s * 1000 / n:.2f} ms/file "
          f"({n / scan_s:.0f} files/s); bare libyaml load {parse_s * 1000 / n:.2f} ms/file; "
          f"ratio {scan_s / parse_s:.2f}x")  # fmt: skip
    print(f"migrate rewrite of legacy files: {rw_s * 1000 / m:.1f} ms/file; bare ruamel round trip "
          f"{rt_s * 1000 / m:.1f} ms/file; ratio {rw_s / rt_s:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
