"""The regression cases of benchmarks/differential.py run here as they did in the differential run
recorded in docs/differential.md (our side only; NoETL's runner is not needed)."""

from __future__ import annotations

import textwrap

import pytest

from benchmarks.differential import CASES, HEAD, run_ours_inline

EXPECTED = {
    "linear": ("completed", {"start": 1, "b": 1}),
    "exclusive_first_match": ("completed", {"start": 1, "b": 1}),
    "inclusive_fan_out_join": ("completed", {"start": 1, "left": 1, "right": 1, "join": 1}),
    "failure_unrouted": ("failed", {"start": 1}),
    "failure_routed": ("completed", {"start": 1, "recover": 1}),
    "dead_end_quiet": ("completed", {"start": 1}),
    "dead_end_complete": ("completed", {"start": 1}),
    "no_next_is_error": ("failed", {"start": 1}),
    "final_step_after_success": ("completed", {"start": 1, "cleanup": 1}),
    "final_step_after_failure": ("failed", {"start": 1, "cleanup": 1}),
    "counting_cycle": ("completed", {"start": 1, "tick": 3, "done": 1}),
    "loop_all_ok": ("completed", {"start": 1, "b": 1}),
    "loop_with_failed_iteration": ("completed", {"start": 1, "report": 1}),
    "admit_skip": ("completed", {"start": 1}),
}


def test_every_case_has_an_expectation():
    assert set(CASES) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_runs_as_recorded(name, tmp_path):
    p = tmp_path / f"{name}.yaml"
    p.write_text(HEAD.replace("NAME", name) + textwrap.dedent(CASES[name]).lstrip())
    side = run_ours_inline(p)
    assert (side.status, side.runs) == EXPECTED[name]
