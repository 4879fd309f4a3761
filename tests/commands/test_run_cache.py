"""``noetl-dagster run`` of an unchanged playbook comes from the parse cache (issue 35): no PyYAML,
no parser validators built, the same result; a changed file is parsed again; an invalid file is
reported with FILE:LINE every time; ``NOETL_DAGSTER_PLAYBOOK_CACHE=off`` turns it off. Structural
(imported modules, built validators, cache entries), not timed: benchmarks/bench_startup.py times it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.cli_probe import ONE_STEP, ROOT, probe


def _run(tmp_path: Path, pb: Path, cache: str) -> tuple[int, dict, dict | None, str]:
    env = {**os.environ, "NOETL_DAGSTER_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT),
           "NOETL_DAGSTER_PLAYBOOK_CACHE": cache}  # fmt: skip
    code, probed, stdout, stderr = probe(["run", "--json", str(pb)], env, cwd=tmp_path)
    report = {"yaml": "yaml" in probed["modules"], "built": probed["built"]["noetl_dagster.dsl.model"]}
    out = stdout.strip()
    result = json.loads(out) if out.startswith("{") else None
    return code, report, result, stderr


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.pickle")) if cache.exists() else []


def _same(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k != "execution_id"} == {
        k: v for k, v in b.items() if k != "execution_id"
    }


def test_second_run_loads_the_validated_playbook_without_yaml_or_validators(tmp_path):
    pb, cache = tmp_path / "one_step.yaml", tmp_path / "cache"
    pb.write_text(ONE_STEP)
    rc1, first, res1, err1 = _run(tmp_path, pb, str(cache))
    assert rc1 == 0, err1
    assert first["yaml"] and "Playbook" in first["built"]  # a miss: parsed and validated
    assert len(_entries(cache)) == 1
    rc2, second, res2, err2 = _run(tmp_path, pb, str(cache))
    assert rc2 == 0, err2
    assert second == {"yaml": False, "built": []}, second  # a hit: nothing parsed, no validator built
    assert res1 is not None and res2 is not None and res2["results"] == {"start": 4}
    assert _same(res1, res2) and res1["execution_id"] != res2["execution_id"]
    assert len(_entries(cache)) == 1


def test_a_changed_file_is_parsed_again(tmp_path):
    pb, cache = tmp_path / "one_step.yaml", tmp_path / "cache"
    pb.write_text(ONE_STEP)
    _run(tmp_path, pb, str(cache))
    pb.write_text(ONE_STEP.replace("n: 2", "n: 5"))
    rc, report, res, err = _run(tmp_path, pb, str(cache))
    assert rc == 0, err
    assert report["yaml"] and res is not None and res["results"] == {"start": 10}
    assert len(_entries(cache)) == 2


def test_an_invalid_file_is_reported_with_file_and_line_every_time(tmp_path):
    pb, cache = tmp_path / "bad.yaml", tmp_path / "cache"
    pb.write_text(ONE_STEP.replace("kind: noop", "kind: no_such_kind"))
    for _ in range(2):
        rc, report, res, err = _run(tmp_path, pb, str(cache))
        assert rc == 2 and res is None
        assert f"{pb}:7:" in err, err
        assert "Traceback" not in err
        assert report["yaml"]
    assert _entries(cache) == []


def test_cache_off_parses_every_run(tmp_path):
    pb = tmp_path / "one_step.yaml"
    pb.write_text(ONE_STEP)
    for _ in range(2):
        rc, report, res, err = _run(tmp_path, pb, "off")
        assert rc == 0, err
        assert report["yaml"] and "Playbook" in report["built"]
    assert not any(tmp_path.rglob("*.pickle"))
