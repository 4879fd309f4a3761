"""The order test files start in under `make test` (`-n 3 --dist loadfile`).

pytest-xdist hands a worker one file at a time, in the order of the collection, and by default
first sorts the files by their number of tests. That put the heaviest files last: most of them hold
one to three long tests (a `dagster dev` session, a browser, a core install, mypy), and the last of
them ran alone while the other workers had nothing left to do. tests/conftest.py turns that sort
off and starts these files first, heaviest first (longest processing time first); every other file
follows by its number of tests, as before. The weights only order; a file missing here still runs.

Seconds per file from `pytest -n 3 --dist loadfile --durations=150` on main (771630d, a loaded
machine, so relative); test_wheel.py as measured after its linked core venv. Refresh when a file
becomes one of the slowest: tests/architecture/test_ordering.py checks that each path exists.
"""

from __future__ import annotations

from collections import Counter

HEAVY_FILES: dict[str, float] = {
    "tests/dagster/test_browser.py": 311,
    "tests/dagster/test_backfill_dev.py": 191,
    "tests/dsl/test_builder_roundtrip.py": 138,
    "tests/packaging/test_wheel.py": 120,
    "tests/dagster/test_dg_cli.py": 117,
    "tests/registry/test_registry_fuzz.py": 116,
    "tests/architecture/test_types.py": 98,
    "tests/tools/test_plugins.py": 95,
    "tests/hardening/test_fuzz_templates.py": 92,
    "tests/analytics/test_exactly_once.py": 85,
    "tests/deploy/test_postgres_everywhere.py": 67,
    "tests/analytics/test_facts_dagster.py": 65,
    "tests/dagster/test_dagster_dev.py": 59,
    "tests/analytics/test_facts_real_runs.py": 58,
    "tests/dagster/test_asset_round2.py": 54,
    "tests/packaging/test_quiet_cli.py": 52,
    "tests/hardening/test_fuzz.py": 47,
    "tests/explain/test_execution_page_browser.py": 46,
    "tests/analytics/test_one_price_path.py": 41,
    "tests/dagster/test_loop_frames.py": 41,
    "tests/storage/test_payload_compliance.py": 39,
    "tests/analytics/test_facts_writer.py": 39,
    "tests/analytics/test_dashboard_browser.py": 37,
    "tests/hardening/test_fuzz_trust.py": 36,
    "tests/hardening/test_large_results.py": 36,
    "tests/tools/test_cursor_postgres.py": 32,
    "tests/packaging/test_extras.py": 31,
}


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def heavy_first(nodeids: list[str]) -> list[int]:
    """Indices of `nodeids` in run order: the heavy files by weight, then the others by their number
    of tests (xdist's own order); a file's tests stay together and in their order."""
    counts = Counter(file_of(n) for n in nodeids)
    first = {f: i for i, f in enumerate(counts)}  # ties: collection order

    def key(i: int) -> tuple[float, int, int, int]:
        f = file_of(nodeids[i])
        if f in HEAVY_FILES:
            return (-HEAVY_FILES[f], 0, first[f], i)
        return (0.0, -counts[f], first[f], i)

    return sorted(range(len(nodeids)), key=key)
