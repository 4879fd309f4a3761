"""Loading a code location is cheap for a run worker (issue 19 §3): behaviour, not timings.

Every run worker imports Dagster and loads the code location before its run starts. These tests
pin what that load does: it imports none of the heavy libraries a tool or an IO manager needs
only when it runs, and it does not parse and validate a playbook whose file has not changed
(the parsed model comes from the cache keyed by the file's hash).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import noetl_dagster.dsl.cache as cache
from noetl_dagster.dsl import PlaybookInvalid
from noetl_dagster.translator.build import compile_playbooks

REPO = Path(__file__).resolve().parents[2]
HEAVY = (
    "pyiceberg",
    "duckdb",
    "polars",
    "openlineage",
    "qiskit",
    "plotly",
    "chdb",
    "clickhouse_connect",
    "pyarrow",
)

HELLO = (REPO / "example_project" / "playbooks" / "hello_dagster.yaml").read_text()


def test_loading_the_example_code_location_imports_no_heavy_library(tmp_path):
    code = (
        "import json, sys\n"
        "import example_project.definitions as d\n"
        "repo = d.defs().get_repository_def()\n"
        "assert repo.has_job('hello_dagster')\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    env = {
        **os.environ,
        "NOETL_DAGSTER_HOME": str(tmp_path / "noetl"),
        "NOETL_DAGSTER_PLAYBOOK_CACHE": str(tmp_path / "c"),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@pytest.fixture
def counted(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    calls: list[str] = []
    real = cache.load_playbook

    def counting(path):
        calls.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(cache, "load_playbook", counting)
    return calls


def _location(folder: Path):
    return compile_playbooks(folder, include_sensor=False, on_error="report")


def test_an_unchanged_playbook_is_not_parsed_again(tmp_path, counted):
    folder = tmp_path / "pb"
    folder.mkdir()
    (folder / "hello.yaml").write_text(HELLO)
    first = _location(folder)
    assert counted == ["hello.yaml"]
    second = _location(folder)
    assert counted == ["hello.yaml"]  # answered from the cache
    assert second.index.playbooks[0].playbook == first.index.playbooks[0].playbook
    assert [j.name for j in second.definitions.resolve_all_job_defs()] == [
        j.name for j in first.definitions.resolve_all_job_defs()
    ]

    (folder / "hello.yaml").write_text(HELLO.replace("times: 3", "times: 4"))  # a new file hash
    third = _location(folder)
    assert counted == ["hello.yaml", "hello.yaml"]
    assert third.index.playbooks[0].playbook.workload["times"] == 4


def test_invalid_playbooks_are_never_cached(tmp_path, counted):
    folder = tmp_path / "pb"
    folder.mkdir()
    (folder / "bad.yaml").write_text(HELLO.replace("kind: python", "kind: no_such_kind", 1))
    for _ in range(2):
        loc = _location(folder)
        assert loc.index.invalid and "no_such_kind" in loc.index.invalid[0].message
    assert counted == ["bad.yaml", "bad.yaml"]
    with pytest.raises(PlaybookInvalid):
        compile_playbooks(folder, include_sensor=False, on_error="raise")


def test_the_cache_can_be_turned_off_and_survives_a_torn_entry(tmp_path, counted, monkeypatch):
    folder = tmp_path / "pb"
    folder.mkdir()
    f = folder / "hello.yaml"
    f.write_text(HELLO)
    _location(folder)
    entry = next((tmp_path / "cache").rglob("*.pickle"))
    entry.write_bytes(b"\x80\x05torn")  # a crash mid-write elsewhere, a foreign file: a miss, not an error
    _location(folder)
    assert counted == ["hello.yaml", "hello.yaml"]
    monkeypatch.setenv(cache.CACHE_ENV, "off")
    _location(folder)
    _location(folder)
    assert counted == ["hello.yaml"] * 4


def test_the_key_follows_the_limits_in_the_environment(tmp_path, monkeypatch):
    f = tmp_path / "hello.yaml"
    f.write_text(HELLO)
    key = cache.cache_key(f, f.read_bytes())
    monkeypatch.setenv("NOETL_MAX_STEPS", "2")
    assert cache.cache_key(f, f.read_bytes()) != key
